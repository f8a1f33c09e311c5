"""The op registry behind ``ShardTensor.__torch_function__`` and helpers shared by the rules.

A rule is registered next to its code with :func:`register`::

    @register(torch.sum, torch.Tensor.sum)
    def _sum(func, args, kwargs): ...

and receives the original ``func``, ``args`` and ``kwargs``. Rules run the local computation
under ``DisableTorchFunctionSubclass`` (so ``func`` sees plain tensors and autograd records the
real local ops) and wrap tensor results back with :func:`wrap`. The rule modules live in
``meshshard/ops/_rules_*.py`` and are imported by ``meshshard.ops`` so that importing meshshard
registers every rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.overrides import resolve_name

from . import tensor as _tensor
from .errors import ShardingError, UnsupportedOpError
from .tensor import ReplicatedTensor, ShardSpec, ShardTensor, _wrap

__all__ = [
    "register", "dispatch", "wrap", "ndim", "local_shape", "shard_args", "common_spec", "no_subclass", "op_name",
    "registered",
]

Handler = Callable[[Callable, tuple, dict], Any]
_HANDLERS: dict[Callable, Handler] = {}

no_subclass = torch._C.DisableTorchFunctionSubclass


def register(*funcs: Callable) -> Callable[[Handler], Handler]:
    """Register ``handler`` as the sharding rule of every function in ``funcs``."""

    def deco(handler: Handler) -> Handler:
        for f in funcs:
            if f is not None:
                _HANDLERS[f] = handler
        return handler

    return deco


def registered(func: Callable) -> bool:
    """Whether ``func`` has a sharding rule."""
    return func in _HANDLERS


def op_name(func: Callable) -> str:
    try:
        return resolve_name(func) or getattr(func, "__name__", repr(func))
    except Exception:
        return getattr(func, "__name__", repr(func))


def dispatch(func: Callable, types: tuple, args: tuple, kwargs: dict) -> Any:
    handler = _HANDLERS.get(func)
    if handler is None:
        raise UnsupportedOpError(
            f"meshshard.ShardTensor has no sharding rule for {op_name(func)}. Work on the local shard with "
            "x.to_local() (and rewrap with ShardTensor.from_local), gather with x.full_tensor(), or register a "
            "rule with meshshard._dispatch.register."
        )
    for a in args:
        if isinstance(a, DTensor):
            args = tuple(_replicated_dtensor_to_local(a, func) for a in args)
            break
    for a in kwargs.values():
        if isinstance(a, DTensor):
            kwargs = {k: _replicated_dtensor_to_local(v, func) for k, v in kwargs.items()}
            break
    return handler(func, args, kwargs)


_tensor._dispatch = dispatch  # ShardTensor.__torch_function__ calls this directly from now on


def _replicated_dtensor_to_local(a: Any, func: Callable) -> Any:
    """Replicated DTensor weights take part through their local value (differentiably)."""
    if not isinstance(a, DTensor):
        return a
    if not all(p.is_replicate() for p in a.placements):
        raise UnsupportedOpError(
            f"{op_name(func)}: a DTensor operand with placements {a.placements} cannot be mixed with a ShardTensor; "
            "only replicated DTensors (e.g. weights) can"
        )
    return a.to_local()


def iter_tensors(args: Iterable, kwargs: dict) -> Iterable[Any]:
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


def shard_args(args: tuple, kwargs: dict) -> list[ShardTensor]:
    return [a for a in iter_tensors(args, kwargs) if isinstance(a, ShardTensor)]


def common_spec(shards: list[ShardTensor], func: Callable) -> ShardSpec:
    """The spec shared by every ShardTensor operand, or a :class:`ShardingError`."""
    ref = shards[0]._spec
    for other in shards[1:]:
        s = other._spec
        if not ref.same_sharding(s):
            raise ShardingError(
                f"[rank {ref.rank}] {op_name(func)}: operands are sharded differently: sizes {ref.sizes} "
                f"vs {s.sizes}{' (different meshes)' if ref.mesh_id != s.mesh_id else ''}. Bring one to the "
                "other's sharding with x.reshard(y.sharding_sizes) first."
            )
    return ref


def ndim(t: torch.Tensor) -> int:
    """``t.dim()`` without re-entering dispatch for a ShardTensor (rules call it on every op)."""
    return len(t._spec.global_shape) if isinstance(t, ShardTensor) else t.dim()


def local_shape(t: torch.Tensor) -> torch.Size:
    """``t.shape`` (the local shape of a ShardTensor) without re-entering dispatch."""
    with no_subclass():
        return t.shape


def wrap(out: Any, spec: ShardSpec, dim: int) -> Any:
    """Wrap a local result (or each tensor in a tuple/list) as a ShardTensor sharded on ``dim``."""
    if isinstance(out, ShardTensor):
        return out  # in-place ops return self, already carrying its spec
    if isinstance(out, torch.Tensor):
        d = dim % out.dim()
        return _wrap(out, spec.moved(d, out.shape))
    if hasattr(out, "n_fields"):
        return type(out)(tuple(wrap(o, spec, dim) for o in out))
    if isinstance(out, (list, tuple)):
        return type(out)(wrap(o, spec, dim) for o in out)
    return out


def replicated(out: Any, spec: ShardSpec) -> Any:
    """Mark a reduction's result as replicated over the spec's group (see ``ReplicatedTensor``)."""
    if isinstance(out, torch.Tensor):
        return ReplicatedTensor._make(out, spec.num_ranks)
    if hasattr(out, "n_fields"):
        return type(out)(tuple(replicated(o, spec) for o in out))
    if isinstance(out, (list, tuple)):
        return type(out)(replicated(o, spec) for o in out)
    return out


def arg(args: tuple, kwargs: dict, index: int, name: str, default: Any = None) -> Any:
    """Positional-or-keyword argument lookup."""
    if name in kwargs:
        return kwargs[name]
    if len(args) > index:
        return args[index]
    return default


def norm_dims(dim: Any, ndim: int) -> tuple[int, ...] | None:
    """``None`` (all dims) or a sorted tuple of non-negative dims."""
    if dim is None:
        return None
    if isinstance(dim, (list, tuple)):
        if len(dim) == 0:
            return None
        return tuple(sorted(int(d) % ndim for d in dim))
    return (int(dim) % ndim,)
