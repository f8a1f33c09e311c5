"""Shape rules: views, indexing, concatenation along non-sharded dims (local, no communication).

Where the sharded dimension lands in the result is found by running the op on ``meta`` tensors
in which the sharded dimension has a sentinel length: the result dimension with that length is
the new shard dimension. This needs no per-op table, is identical on every rank (it does not
depend on the local length, which differs between ranks), and refuses ops that would split,
merge, slice or index the sharded dimension.
"""

from __future__ import annotations

import math

import torch

from .._dispatch import common_spec, local_shape, no_subclass, op_name, register, shard_args, wrap
from ..errors import UnsupportedOpError
from ..tensor import ShardTensor

T = torch.Tensor
_SENTINEL = 1_000_003  # a prime no real dimension is likely to equal


def _to_meta(a, sentinel_for_shards: bool = True):
    if isinstance(a, ShardTensor):
        shape = list(local_shape(a))
        shape[a._spec.dim] = _SENTINEL
        return torch.empty(shape, dtype=a.dtype, device="meta")
    if isinstance(a, torch.Tensor):
        return torch.empty(a.shape, dtype=a.dtype, device="meta")
    if isinstance(a, (list, tuple)) and not isinstance(a, torch.Size):
        return type(a)(_to_meta(b) for b in a)
    return a


def _sharded_dims(out) -> list[int] | None:
    if isinstance(out, torch.Tensor):
        return [i for i, s in enumerate(out.shape) if s == _SENTINEL]
    return None


def _simulate(func, args, kwargs):
    try:
        with no_subclass():
            return func(*_to_meta(args), **{k: _to_meta(v) for k, v in kwargs.items()})
    except Exception as exc:  # the op is invalid for a sharded tensor (or data-dependent)
        raise UnsupportedOpError(
            f"{op_name(func)} cannot be applied to a ShardTensor this way (it would split, merge, slice or "
            f"index the sharded dimension, or mix sharded and plain operands along it: {exc}). "
            "Use x.to_local() for per-rank work or x.full_tensor() for the whole tensor."
        ) from None


def _out_dim(func, meta_out) -> int:
    dims = _sharded_dims(meta_out)
    if dims is None or len(dims) != 1:
        raise UnsupportedOpError(
            f"{op_name(func)} would remove, merge or slice the sharded dimension of a ShardTensor; "
            "use x.to_local() or x.full_tensor()"
        )
    return dims[0]


def _signature(a):
    """A hashable key of an argument as the meta simulation sees it (shapes, not values)."""
    if isinstance(a, ShardTensor):
        shape = list(local_shape(a))
        shape[a._spec.dim] = -1
        return ("S", tuple(shape), a.dtype)
    if isinstance(a, torch.Tensor):
        return ("T", tuple(a.shape), a.dtype)
    if isinstance(a, (list, tuple)) and not isinstance(a, torch.Size):
        return (type(a).__name__, *(_signature(b) for b in a))
    return repr(a)


_OUT_DIMS: dict = {}  # (func, signature) -> output shard dim(s): views repeat the same call every step


def _out_dims(func, args, kwargs):
    key = (func, _signature(args), _signature(tuple(sorted(kwargs.items()))))
    dims = _OUT_DIMS.get(key)
    if dims is None:
        meta_out = _simulate(func, args, kwargs)
        if isinstance(meta_out, torch.Tensor):
            dims = _out_dim(func, meta_out)
        else:  # tuples/lists (split, chunk, unbind): each piece keeps the sharded dimension
            dims = tuple(_out_dim(func, m) for m in meta_out)
        if len(_OUT_DIMS) < 4096:
            _OUT_DIMS[key] = dims
    return dims


def _structural(func, args, kwargs):
    shards = shard_args(args, kwargs)
    spec = common_spec(shards, func)
    dims = _out_dims(func, args, kwargs)
    with no_subclass():
        out = func(*args, **kwargs)
    if isinstance(out, torch.Tensor):
        return wrap(out, spec, dims)
    return type(out)(wrap(o, spec, d) for o, d in zip(out, dims))


register(
    T.__getitem__, T.movedim, torch.movedim, T.moveaxis, torch.moveaxis,
    T.t, torch.t, T.T.__get__, T.mT.__get__, T.flatten, torch.flatten, T.unflatten, torch.unflatten, T.narrow,
    torch.narrow, T.select, torch.select, T.chunk, torch.chunk, T.split, torch.split, T.unbind, torch.unbind,
    T.tensor_split, torch.tensor_split, T.expand, T.expand_as, T.repeat, T.flip, torch.flip, T.roll, torch.roll,
    T.index_select, torch.index_select, T.gather, torch.gather, torch.cat, torch.concat, torch.concatenate,
    torch.stack, T.diagonal, torch.diagonal, T.view_as, T.reshape_as, torch.broadcast_to, T.broadcast_to,
)(_structural)


@register(T.squeeze, torch.squeeze)
def _squeeze(func, args, kwargs):
    """``squeeze()`` without dims must not drop the sharded dim where a rank has one point."""
    x = args[0]
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    if dim is None:
        keep = x._spec.dim
        dims = tuple(i for i, s in enumerate(local_shape(x)) if s == 1 and i != keep)
        return _structural(func, (x, dims), {})
    return _structural(func, args, kwargs)


@register(T.__setitem__)
def _setitem(func, args, kwargs):
    x, index, value = args
    common_spec(shard_args(args, kwargs), func)
    _out_dim(func, _simulate(T.__getitem__, (x, index), {}))  # the index must keep the sharded dim
    if isinstance(value, torch.Tensor) and not isinstance(value, ShardTensor) and value.dim() > 0:
        _simulate(T.__setitem__, (x, index, value), {})
    with no_subclass():
        func(x, index, value)


@register(T.view, T.reshape, torch.reshape)
def _reshape(func, args, kwargs):
    """Reshapes that keep the sharded dimension whole (split/merge only the other dims).

    The new position is the unique dim whose prefix and suffix products equal those around the
    sharded dim before; a reshape that only inserts size-1 dims next to a sharded dim of local
    length 1 is ambiguous on that rank and raises (use ``unsqueeze``).
    """
    x = args[0]
    if not isinstance(x, ShardTensor) or len(shard_args(args, kwargs)) != 1:
        raise UnsupportedOpError(f"{op_name(func)}: only the reshaped tensor may be a ShardTensor")
    with no_subclass():
        out = func(*args, **kwargs)
    if not isinstance(out, torch.Tensor):  # view(dtype)
        return out
    d = x._spec.dim
    old = list(local_shape(x))
    pre, post, n = math.prod(old[:d]), math.prod(old[d + 1 :]), old[d]
    new = list(out.shape)
    cands = [
        i
        for i in range(len(new))
        if new[i] == n and math.prod(new[:i]) == pre and math.prod(new[i + 1 :]) == post
    ]
    if len(cands) > 1:  # a -1 in the request marks where the caller put the sharded dim
        req = args[1:] if len(args) > 1 else (kwargs.get("shape") or kwargs.get("size") or ())
        if len(req) == 1 and isinstance(req[0], (tuple, list, torch.Size)):
            req = tuple(req[0])
        if list(req).count(-1) == 1 and list(req).index(-1) in cands:
            cands = [list(req).index(-1)]
    if len(cands) != 1:
        what = "splits or merges the sharded dimension" if not cands else "is ambiguous for a local length of 1"
        raise UnsupportedOpError(
            f"[rank {x._spec.rank}] {op_name(func)} from {tuple(old)} (sharded dim {d}) to {tuple(new)} {what}; "
            "reshape only the non-sharded dims (or use unsqueeze/flatten with explicit dims)"
        )
    return wrap(out, x._spec, cands[0])


# The most frequent views in attention code, with their shard-dim arithmetic written out (no simulation).
def _single_shard(func, args, kwargs) -> ShardTensor | None:
    x = args[0]
    if not isinstance(x, ShardTensor) or kwargs or any(isinstance(a, torch.Tensor) for a in args[1:]):
        return None
    return x


@register(T.transpose, torch.transpose, T.swapaxes, torch.swapaxes, T.swapdims, torch.swapdims)
def _transpose(func, args, kwargs):
    x = _single_shard(func, args, kwargs)
    if x is None or len(args) != 3:
        return _structural(func, args, kwargs)
    nd, sd = len(x._spec.global_shape), x._spec.dim
    d0, d1 = args[1] % nd, args[2] % nd
    with no_subclass():
        out = func(*args)
    return wrap(out, x._spec, d1 if sd == d0 else d0 if sd == d1 else sd)


@register(T.unsqueeze, torch.unsqueeze)
def _unsqueeze(func, args, kwargs):
    x = _single_shard(func, args, kwargs)
    if x is None or len(args) != 2:
        return _structural(func, args, kwargs)
    sd = x._spec.dim
    d = args[1] % (len(x._spec.global_shape) + 1)
    with no_subclass():
        out = func(*args)
    return wrap(out, x._spec, sd + 1 if d <= sd else sd)


@register(T.permute, torch.permute)
def _permute(func, args, kwargs):
    x = _single_shard(func, args, kwargs)
    if x is None:
        return _structural(func, args, kwargs)
    dims = args[1] if len(args) == 2 and isinstance(args[1], (tuple, list, torch.Size)) else args[1:]
    nd = len(x._spec.global_shape)
    order = [int(d) % nd for d in dims]
    if sorted(order) != list(range(nd)):
        return _structural(func, args, kwargs)  # let torch raise its own error on the meta run
    with no_subclass():
        out = func(*args)
    return wrap(out, x._spec, order.index(x._spec.dim))
