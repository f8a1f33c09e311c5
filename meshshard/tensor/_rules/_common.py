"""Helpers shared by the rule modules: wrapping results, reading operands, checking plain operands."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from ...errors import ShardingError, UnsupportedOpError
from .._dispatch import no_subclass, op_name
from .._spec import ShardSpec
from .._tensor import ReplicatedTensor, ShardTensor, wrap_shard

__all__ = [
    "iter_tensors", "shard_args", "common_spec", "ndim", "local_shape", "wrap", "replicated", "norm_dims",
    "local_of", "plain_along_shard", "no_subclass", "op_name",
]


def iter_tensors(args: Iterable, kwargs: dict) -> Iterable[Any]:
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


def shard_args(args: tuple, kwargs: dict) -> list[ShardTensor]:
    return [a for a in iter_tensors(args, kwargs) if isinstance(a, ShardTensor)]


def common_spec(shards: list[ShardTensor], func: Callable) -> ShardSpec:
    """The spec shared by every ShardTensor operand, or a :class:`ShardingError` (decided from specs alone)."""
    ref = shards[0]._spec
    for other in shards[1:]:
        s = other._spec
        if not ref.same_sharding(s):
            raise ShardingError(
                f"[rank {ref.rank}] {op_name(func)}: operands are sharded differently: sizes {ref.sizes} "
                f"vs {s.sizes}{' (different meshes)' if ref.mesh_id != s.mesh_id else ''}. Bring one to the "
                "other's sharding with x.reshard(y.sharding_sizes) first."
            )
    if ref.node_sizes is None:  # rows that target nodes (edges, messages): keep that knowledge for the result
        return next((t._spec for t in shards if t._spec.node_sizes is not None), ref)
    return ref


def ndim(t: torch.Tensor) -> int:
    """The global number of dims (no re-entry into dispatch)."""
    return len(t._spec.global_shape) if isinstance(t, ShardTensor) else t.dim()


def local_shape(t: torch.Tensor) -> torch.Size:
    """The local shape of a ShardTensor (``t.shape`` of a plain tensor) without re-entering dispatch."""
    with no_subclass():
        return t.shape


def local_of(t: Any) -> Any:
    """A ShardTensor's local shard; any other value unchanged."""
    return t.to_local() if isinstance(t, ShardTensor) else t


def wrap(out: Any, spec: ShardSpec, dim: int | None) -> Any:
    """Wrap a local result (or each tensor in a tuple/list) as a ShardTensor with ``spec``'s sizes along ``dim``."""
    if isinstance(out, ShardTensor):
        return out  # in-place ops return self, already carrying its spec
    if isinstance(out, torch.Tensor):
        if isinstance(out, ReplicatedTensor):
            out = out.to_plain()
        d = dim % out.dim()
        if out.shape[d] != spec.sizes[spec.rank]:  # a rule's bug: never hand out a spec that lies
            raise ShardingError(f"[rank {spec.rank}] internal: a result of local shape {tuple(out.shape)} cannot be "
                                f"sharded on dim {d} with sizes {spec.sizes}")
        return wrap_shard(out, spec.moved(d, out.shape))
    if hasattr(out, "n_fields"):
        return type(out)(tuple(wrap(o, spec, dim) for o in out))
    if isinstance(out, (list, tuple)):
        return type(out)(wrap(o, spec, dim) for o in out)
    return out


def replicated(out: Any, spec: ShardSpec) -> Any:
    """Mark a reduction's result as replicated over the spec's group (see ``ReplicatedTensor``)."""
    if isinstance(out, torch.Tensor):
        if isinstance(out, ShardTensor):
            out = out.to_local()
        return ReplicatedTensor._make(out, spec.group, spec.num_ranks)
    if hasattr(out, "n_fields"):
        return type(out)(tuple(replicated(o, spec) for o in out))
    if isinstance(out, (list, tuple)):
        return type(out)(replicated(o, spec) for o in out)
    return out


def norm_dims(dim: Any, nd: int, func: Callable | None = None) -> tuple[int, ...] | None:
    """``None`` (all dims) or a sorted tuple of distinct non-negative dims; out-of-range dims raise IndexError."""
    if dim is None:
        return None
    dims = list(dim) if isinstance(dim, (list, tuple, torch.Size)) else [dim]
    if not dims:
        return None
    out = []
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int) and not hasattr(d, "__index__"):
            raise TypeError(f"{op_name(func) if func else 'op'}: dim must be an int or a sequence of ints (got {d!r})")
        d = int(d)
        if not -max(nd, 1) <= d < max(nd, 1):
            raise IndexError(f"Dimension out of range (expected to be in range of [{-max(nd, 1)}, {max(nd, 1) - 1}], "
                             f"but got {d})")
        out.append(d % max(nd, 1))
    if len(set(out)) != len(out):
        raise RuntimeError(f"{op_name(func) if func else 'op'}: dim {tuple(dims)} appears multiple times")
    return tuple(sorted(out))


def plain_along_shard(func: Callable, plain: torch.Tensor, spec: ShardSpec, back: int) -> torch.Tensor:
    """A plain operand broadcast against a ShardTensor whose sharded dim is ``back``-th from the end.

    Size 1 (or no dim) there broadcasts as is. A tensor *expanded* to the global length there
    (stride 0: the same row for every point, e.g. ``g.expand(N, -1)``) is narrowed to this rank's
    rows. So is a :class:`ReplicatedTensor` (the same values on every rank of the spec's group, e.g.
    ``g.repeat(1, 1, N)`` of a global max): narrowing it is exact, and its gradient, partial on each
    rank, sums to the true one. Any other plain tensor spanning the sharded dim is refused: it would be applied to local
    rows as if it were sharded (use :func:`meshshard.scatter` or ``ShardTensor.from_local``).
    """
    if plain.dim() < back or plain.shape[-back] == 1:
        return plain
    d = plain.dim() - back
    if plain.shape[d] == spec.num_global and (plain.stride(d) == 0 or _replicated_here(plain, spec)):
        with no_subclass():
            return plain.narrow(d, spec.offsets[spec.rank], spec.sizes[spec.rank])
    raise ShardingError(
        f"[rank {spec.rank}] {op_name(func)}: a plain tensor of shape {tuple(plain.shape)} spans the sharded "
        f"dimension (global length {spec.num_global}). Shard it the same way (ms.scatter, ShardTensor.from_local), "
        "give it size 1 there, or expand a size-1 tensor to it."
    )


def _replicated_here(plain: torch.Tensor, spec: ShardSpec) -> bool:
    """``plain`` is a ReplicatedTensor over the spec's group (decided from metadata alike on every rank)."""
    return isinstance(plain, ReplicatedTensor) and plain._group is spec.group


def refuse(func: Callable, why: str, hint: str = "") -> UnsupportedOpError:
    return UnsupportedOpError(f"{op_name(func)} on a ShardTensor: {why}" + (f"; {hint}" if hint else ""))


def sharded_input(func: Callable, x: Any) -> ShardTensor:
    """``x`` when it is a ShardTensor, else the refusal of an op that needs its input sharded."""
    if not isinstance(x, ShardTensor):
        raise refuse(func, "the input must be the ShardTensor")
    return x


def corner_positions(inner: Sequence[int], outer: Sequence[int]) -> torch.Tensor:
    """The flat (row-major) positions, in a block of shape ``outer``, of its leading corner of shape ``inner``
    (``inner[i] <= outer[i]``; missing trailing dims of ``inner`` are taken at 0): an ``inner``-shaped tensor."""
    grids = torch.meshgrid(*[torch.arange(k) for k in inner], indexing="ij") if len(inner) else []
    lin = torch.zeros(list(inner), dtype=torch.long)
    for g, k in zip(grids, outer):
        lin = lin * k + g
    for k in outer[len(inner):]:
        lin = lin * k
    return lin


def dim_of(func: Callable, x: Any, dim: Any) -> int:
    """The op's one ``dim`` (negative allowed) as a non-negative int, torch's ``IndexError`` when out of range."""
    nd = ndim(x)
    if dim is None or isinstance(dim, bool) or not hasattr(dim, "__index__") or not -max(nd, 1) <= int(dim) < max(
            nd, 1):
        raise IndexError(f"{op_name(func)}: dim {dim!r} is out of range for a {nd}-d tensor")
    return int(dim) % max(nd, 1)


def along_other_dim(func: Callable, args: tuple, kwargs: dict, x: ShardTensor, d: int, drops_dim: bool = False):
    """An op along one non-sharded dim ``d`` (cumsum, sort, topk, ...): run on the local shard and wrap.

    ``drops_dim``: the op removes ``d`` (``kthvalue``/``median`` without ``keepdim``).
    """
    if len(shard_args(args, kwargs)) != 1:
        raise refuse(func, "only the first operand may be a ShardTensor")
    with no_subclass():
        out = func(*args, **kwargs)
    sd = x._spec.dim
    return wrap(out, x._spec, sd - 1 if drops_dim and d < sd else sd)


def extreme_fill(dtype: torch.dtype, largest: bool):
    """The value no element beats in a max (``largest``) or min search: the identity of that reduction."""
    if dtype.is_floating_point:
        return -math.inf if largest else math.inf
    if dtype == torch.bool:
        return not largest
    info = torch.iinfo(dtype)
    return info.min if largest else info.max
