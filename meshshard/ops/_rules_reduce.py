"""Reductions and contractions over the sharded dimension: all-reduces with exact gradients.

A reduction over dims that do not include the sharded one is local. Over the sharded dim the
local partial result is all-reduced and returned as a :class:`~meshshard.tensor.ReplicatedTensor`.

**Communication** (per call, forward; backward mirrors each differentiable all-reduce once):

=====================================  ===========================================================
``sum``, ``mean``, ``norm`` (p=1, 2)   one ``all_reduce`` of the result's size
``var``, ``std``                       two ``all_reduce`` (the mean, then the squared deviations)
``amax``/``amin``, ``max``/``min``     one max ``all_reduce`` (values) + one sum ``all_reduce``
  (no dim)                             (tie count and differentiable value, fused)
``max``/``min`` with ``dim``           + one min ``all_reduce`` for the global index
``argmax``/``argmin``                  one max ``all_reduce`` + one min ``all_reduce``
``softmax``/``log_softmax``            one max ``all_reduce`` (shift) + one sum ``all_reduce``
``logsumexp``                          same as softmax
``matmul``/``einsum`` contracting it   one ``all_reduce`` of the result's size
=====================================  ===========================================================
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import comm
from .._dispatch import (
    arg,
    common_spec,
    local_shape,
    ndim,
    no_subclass,
    norm_dims,
    op_name,
    register,
    replicated,
    shard_args,
    wrap,
)
from ..errors import ShardingError, UnsupportedOpError
from ..tensor import ShardSpec, ShardTensor

T = torch.Tensor


def _plain(x: torch.Tensor) -> torch.Tensor:
    return x.to_local() if isinstance(x, ShardTensor) else x


def _kept_dim(spec_dim: int, dims: tuple[int, ...], keepdim: bool) -> int:
    return spec_dim if keepdim else spec_dim - sum(1 for d in dims if d < spec_dim)


def _count(spec: ShardSpec, shape: torch.Size, dims: tuple[int, ...] | None) -> int:
    gshape = list(shape)
    gshape[spec.dim] = spec.num_global
    return math.prod(gshape) if dims is None else math.prod(gshape[d] for d in dims)


def _parse_dim_keepdim(args, kwargs, x):
    dim = arg(args, kwargs, 1, "dim")
    keepdim = bool(arg(args, kwargs, 2, "keepdim", False))
    return norm_dims(dim, ndim(x)), keepdim


def _local_reduce(func, args, kwargs, x: ShardTensor, dims, keepdim):
    with no_subclass():
        out = func(*args, **kwargs)
    return wrap(out, x._spec, _kept_dim(x._spec.dim, dims, keepdim))


def _reduce_keep_shape(local: torch.Tensor, dims, keepdim: bool) -> torch.Tensor:
    if dims is None:
        return local.reshape(()) if not keepdim else local
    if keepdim:
        return local
    for d in sorted(dims, reverse=True):
        local = local.squeeze(d)
    return local


# -- sum / mean -----------------------------------------------------------------------------------
@register(torch.sum, T.sum, torch.nansum, T.nansum)
def _sum(func, args, kwargs):
    x = args[0]
    dims, keepdim = _parse_dim_keepdim(args, kwargs, x)
    if dims is not None and x._spec.dim not in dims:
        return _local_reduce(func, args, kwargs, x, dims, keepdim)
    with no_subclass():
        local = func(*args, **kwargs)
    return replicated(comm.all_reduce(local, x._spec.group), x._spec)


@register(torch.mean, T.mean, torch.nanmean, T.nanmean)
def _mean(func, args, kwargs):
    x = args[0]
    dims, keepdim = _parse_dim_keepdim(args, kwargs, x)
    if dims is not None and x._spec.dim not in dims:
        return _local_reduce(func, args, kwargs, x, dims, keepdim)
    spec = x._spec
    dtype = kwargs.get("dtype")
    local = _plain(x) if dtype is None else _plain(x).to(dtype)
    if func in (torch.nanmean, T.nanmean):
        valid = ~torch.isnan(local)
        s = torch.where(valid, local, torch.zeros_like(local)).sum(dim=dims, keepdim=keepdim)
        c = valid.to(local.dtype).sum(dim=dims, keepdim=keepdim)
        both = comm.all_reduce(torch.stack([s, c]), spec.group)
        return replicated(both[0] / both[1], spec)
    s = local.sum(dim=dims, keepdim=keepdim)
    return replicated(comm.all_reduce(s, spec.group) / _count(spec, local_shape(x), dims), spec)


# -- var / std ------------------------------------------------------------------------------------
def _parse_var(args, kwargs, x):
    dim = arg(args, kwargs, 1, "dim")
    correction = 1.0
    if isinstance(dim, bool):  # var(x, unbiased)
        correction, dim = float(dim), None
    if len(args) > 2 and isinstance(args[2], bool):  # var(x, dim, unbiased, keepdim)
        correction = float(args[2])
        keepdim = bool(args[3]) if len(args) > 3 else bool(kwargs.get("keepdim", False))
    else:
        keepdim = bool(kwargs.get("keepdim", False))
    if "unbiased" in kwargs:
        correction = float(bool(kwargs["unbiased"]))
    if kwargs.get("correction") is not None:
        correction = float(kwargs["correction"])
    return norm_dims(dim, ndim(x)), correction, keepdim


@register(torch.var, T.var, torch.std, T.std)
def _var(func, args, kwargs):
    x = args[0]
    dims, correction, keepdim = _parse_var(args, kwargs, x)
    if dims is not None and x._spec.dim not in dims:
        return _local_reduce(func, args, kwargs, x, dims, keepdim)
    spec, local = x._spec, _plain(x)
    count = _count(spec, local_shape(x), dims)
    mean = comm.all_reduce(local.sum(dim=dims, keepdim=True), spec.group) / count
    sq = comm.all_reduce(((local - mean) ** 2).sum(dim=dims, keepdim=True), spec.group)
    var = _reduce_keep_shape(sq / max(count - correction, 0), dims, keepdim)
    if count - correction <= 0:
        var = var * float("nan")
    out = var.sqrt() if func in (torch.std, T.std) else var
    return replicated(out, spec)


# -- norms ----------------------------------------------------------------------------------------
def _vector_norm(x: ShardTensor, p, dims, keepdim: bool, func):
    spec, local = x._spec, _plain(x)
    if p in ("fro", 2, 2.0, None):
        return replicated(comm.all_reduce(local.pow(2).sum(dim=dims, keepdim=keepdim), spec.group).sqrt(), spec)
    if p in (1, 1.0):
        return replicated(comm.all_reduce(local.abs().sum(dim=dims, keepdim=keepdim), spec.group), spec)
    if p in (math.inf, float("inf")):
        return _extreme(x.abs(), dims, keepdim, largest=True)
    if p in (-math.inf, float("-inf")):
        return _extreme(x.abs(), dims, keepdim, largest=False)
    if isinstance(p, (int, float)) and p > 0:
        s = comm.all_reduce(local.abs().pow(p).sum(dim=dims, keepdim=keepdim), spec.group)
        return replicated(s.pow(1.0 / p), spec)
    raise UnsupportedOpError(f"{op_name(func)} with p={p!r} over the sharded dimension is not supported")


@register(torch.norm, T.norm)
def _norm(func, args, kwargs):
    x = args[0]
    p = arg(args, kwargs, 1, "p", "fro")
    dims = norm_dims(arg(args, kwargs, 2, "dim"), ndim(x))
    keepdim = bool(arg(args, kwargs, 3, "keepdim", False))
    if dims is not None and x._spec.dim not in dims:
        return _local_reduce(func, args, kwargs, x, dims, keepdim)
    return _vector_norm(x, p, dims, keepdim, func)


@register(torch.linalg.vector_norm)
def _linalg_vector_norm(func, args, kwargs):
    x = args[0]
    p = arg(args, kwargs, 1, "ord", 2)
    dims = norm_dims(arg(args, kwargs, 2, "dim"), ndim(x))
    keepdim = bool(arg(args, kwargs, 3, "keepdim", False))
    if dims is not None and x._spec.dim not in dims:
        return _local_reduce(func, args, kwargs, x, dims, keepdim)
    return _vector_norm(x, p, dims, keepdim, func)


# -- max / min ------------------------------------------------------------------------------------
def _fill_value(dtype: torch.dtype, largest: bool):
    if dtype.is_floating_point:
        return -math.inf if largest else math.inf
    info = torch.iinfo(dtype)
    return info.min if largest else info.max


def _local_extreme(local: torch.Tensor, dims, largest: bool) -> torch.Tensor:
    """amax/amin over ``dims`` (keepdim) that also works on an empty shard."""
    fill = _fill_value(local.dtype, largest)
    if local.numel() == 0:
        shape = [1 if (dims is None or d in dims) else s for d, s in enumerate(local.shape)]
        return torch.full(shape, fill, dtype=local.dtype, device=local.device)
    dims_ = tuple(range(local.dim())) if dims is None else dims
    return local.amax(dim=dims_, keepdim=True) if largest else local.amin(dim=dims_, keepdim=True)


def _extreme(x: ShardTensor, dims, keepdim: bool, largest: bool):
    """Global max/min over ``dims``; the gradient is shared evenly between tied elements (as torch)."""
    spec, local = x._spec, _plain(x)
    sign = 1.0 if largest else -1.0
    m_local = _local_extreme(local.detach(), dims, largest)
    m = (sign * comm.all_reduce_max(sign * m_local.to(torch.float64), spec.group)).to(local.dtype)
    tie = local.detach() == m
    dims_ = tuple(range(local.dim())) if dims is None else dims
    if local.dtype.is_floating_point:
        picked = torch.where(tie, local, torch.zeros_like(local)).sum(dim=dims_, keepdim=True)
        ties = tie.to(local.dtype).sum(dim=dims_, keepdim=True)
        both = comm.all_reduce(torch.stack([picked, ties]), spec.group)
        share = both[0] / both[1]
        out = m + (share - share.detach())  # the exact value, the tie-averaged gradient
    else:
        out = m
    return replicated(_reduce_keep_shape(out, dims, keepdim), spec)


@register(torch.amax, T.amax, torch.amin, T.amin)
def _amax(func, args, kwargs):
    x = args[0]
    dim = arg(args, kwargs, 1, "dim", ())
    dims = norm_dims(dim, ndim(x))
    keepdim = bool(arg(args, kwargs, 2, "keepdim", False))
    if dims is not None and x._spec.dim not in dims:
        return _local_reduce(func, args, kwargs, x, dims, keepdim)
    return _extreme(x, dims, keepdim, largest=func in (torch.amax, T.amax))


def _global_arg(x: ShardTensor, d: int, keepdim: bool, largest: bool):
    """(values, global indices) along the sharded dim ``d``; first global index among ties."""
    spec, local = x._spec, _plain(x)
    n = local.shape[d]
    sign = 1.0 if largest else -1.0
    if n:
        lv, li = (local.detach().max(dim=d, keepdim=True) if largest else local.detach().min(dim=d, keepdim=True))
    else:
        shape = list(local.shape)
        shape[d] = 1
        lv = torch.full(shape, _fill_value(local.dtype, largest), dtype=local.dtype, device=local.device)
        li = torch.zeros(shape, dtype=torch.long, device=local.device)
    gv = sign * comm.all_reduce_max(sign * lv.to(torch.float64), spec.group)
    big = spec.num_global
    cand = torch.where((lv.to(torch.float64) == gv) & (n > 0), li + spec.offsets[spec.rank], torch.full_like(li, big))
    gi = -comm.all_reduce_max(-cand, spec.group)
    return gv.to(local.dtype), gi, li, n


@register(torch.max, T.max, torch.min, T.min)
def _max(func, args, kwargs):
    x = args[0]
    other = arg(args, kwargs, 1, "dim")
    largest = func in (torch.max, T.max)
    if isinstance(other, torch.Tensor):  # binary max/min: pointwise
        from ._rules_local import _pointwise

        return _pointwise(func, args, kwargs)
    if other is None:
        return _extreme(x, None, False, largest)
    d = int(other) % ndim(x)
    keepdim = bool(arg(args, kwargs, 2, "keepdim", False))
    if d != x._spec.dim:
        return _local_reduce(func, args, kwargs, x, (d,), keepdim)
    spec, local = x._spec, _plain(x)
    _, gi, _, n = _global_arg(x, d, True, largest)
    # the owner of each winning index contributes its (differentiable) value; others add zero
    mine = (gi >= spec.offsets[spec.rank]) & (gi < spec.offsets[spec.rank + 1])
    if n:
        picked = local.gather(d, (gi - spec.offsets[spec.rank]).clamp(0, n - 1))
        picked = torch.where(mine, picked, torch.zeros_like(picked))
    else:  # an empty shard: zeros that stay in the graph, so every rank joins the backward all-reduce
        picked = local.sum(dim=d, keepdim=True)
    values = comm.all_reduce(picked, spec.group)
    if not keepdim:
        values, gi = values.squeeze(d), gi.squeeze(d)
    ret = torch.return_types.max((values, gi)) if largest else torch.return_types.min((values, gi))
    return replicated(ret, spec)


@register(torch.argmax, T.argmax, torch.argmin, T.argmin)
def _argmax(func, args, kwargs):
    x = args[0]
    dim = arg(args, kwargs, 1, "dim")
    keepdim = bool(arg(args, kwargs, 2, "keepdim", False))
    largest = func in (torch.argmax, T.argmax)
    spec = x._spec
    if dim is None:
        # index into the flattened *global* tensor: reduce over all dims of a flattened view
        flat_global = torch.tensor(list(spec.global_shape))
        local = _plain(x)
        if local.numel():
            lv = local.detach().max() if largest else local.detach().min()
            li = local.detach().argmax() if largest else local.detach().argmin()
            coords = list(torch.unravel_index(li, local.shape))
            coords[spec.dim] = coords[spec.dim] + spec.offsets[spec.rank]
            gflat = torch.tensor(0)
            for c, s in zip(coords, flat_global.tolist()):
                gflat = gflat * s + c
            lv, gflat = lv.reshape(1), gflat.reshape(1).to(local.device)
        else:
            lv = torch.full((1,), _fill_value(local.dtype, largest), dtype=local.dtype, device=local.device)
            gflat = torch.full((1,), spec.global_shape.numel(), device=local.device)
        sign = 1.0 if largest else -1.0
        gv = sign * comm.all_reduce_max(sign * lv.to(torch.float64), spec.group)
        big = spec.global_shape.numel()
        cand = torch.where((lv.to(torch.float64) == gv) & (local.numel() > 0), gflat, torch.full_like(gflat, big))
        return replicated((-comm.all_reduce_max(-cand, spec.group)).reshape(()), spec)
    d = int(dim) % ndim(x)
    if d != spec.dim:
        return _local_reduce(func, args, kwargs, x, (d,), keepdim)
    _, gi, _, _ = _global_arg(x, d, keepdim, largest)
    return replicated(gi if keepdim else gi.squeeze(d), spec)


# -- softmax family -------------------------------------------------------------------------------
def _softmax_parts(x: ShardTensor, dims):
    spec, local = x._spec, _plain(x)
    m = comm.all_reduce_max(_local_extreme(local.detach(), dims, True), spec.group)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(local - m)
    s = comm.all_reduce(e.sum(dim=dims, keepdim=True), spec.group)
    return local, m, e, s


def _softmax_dim(func, args, kwargs):
    dim = arg(args, kwargs, 1, "dim")
    if dim is None:
        raise UnsupportedOpError(f"{op_name(func)} on a ShardTensor needs an explicit dim")
    return int(dim)


@register(torch.softmax, T.softmax, F.softmax, torch.log_softmax, T.log_softmax, F.log_softmax)
def _softmax(func, args, kwargs):
    x = args[0]
    d = _softmax_dim(func, args, kwargs) % ndim(x)
    if d != x._spec.dim:
        with no_subclass():
            out = func(*args, **kwargs)
        return wrap(out, x._spec, x._spec.dim)
    dtype = kwargs.get("dtype")
    if dtype is not None:
        x = x.to(dtype)
    local, m, e, s = _softmax_parts(x, (d,))
    if func in (torch.log_softmax, T.log_softmax, F.log_softmax):
        out = local - m - torch.log(s)
    else:
        out = e / s
    return wrap(out, x._spec, d)


@register(torch.logsumexp, T.logsumexp)
def _logsumexp(func, args, kwargs):
    x = args[0]
    dims = norm_dims(arg(args, kwargs, 1, "dim"), ndim(x))
    keepdim = bool(arg(args, kwargs, 2, "keepdim", False))
    if dims is not None and x._spec.dim not in dims:
        return _local_reduce(func, args, kwargs, x, dims, keepdim)
    _, m, _, s = _softmax_parts(x, dims)
    return replicated(_reduce_keep_shape(m + torch.log(s), dims, keepdim), x._spec)


# -- any / all / count_nonzero --------------------------------------------------------------------
@register(torch.any, T.any, torch.all, T.all, torch.count_nonzero, T.count_nonzero)
def _logical_reduce(func, args, kwargs):
    x = args[0]
    dims, keepdim = _parse_dim_keepdim(args, kwargs, x)
    if dims is not None and x._spec.dim not in dims:
        return _local_reduce(func, args, kwargs, x, dims, keepdim)
    spec = x._spec
    with no_subclass():
        local = func(*args, **kwargs)
    if func in (torch.count_nonzero, T.count_nonzero):
        return replicated(comm.all_reduce(local, spec.group), spec)
    if func in (torch.any, T.any):
        return replicated(comm.all_reduce_max(local.to(torch.int32), spec.group).bool(), spec)
    return replicated((-comm.all_reduce_max(-local.to(torch.int32), spec.group)).bool(), spec)


# -- contractions ---------------------------------------------------------------------------------
@register(torch.matmul, T.matmul, T.__matmul__, T.__rmatmul__, torch.mm, T.mm, torch.bmm, T.bmm)
def _matmul(func, args, kwargs):
    a, b = args[0], args[1]
    if func is T.__rmatmul__:
        a, b = b, a
    shards = shard_args((a, b), {})
    spec = common_spec(shards, func)
    if ndim(a) < 2 or ndim(b) < 2:
        raise UnsupportedOpError(f"{op_name(func)} with a 1-d operand and a ShardTensor is not supported")
    a_d = a._spec.dim - ndim(a) if isinstance(a, ShardTensor) else None  # negative positions
    b_d = b._spec.dim - ndim(b) if isinstance(b, ShardTensor) else None
    with no_subclass():
        out = torch.matmul(a, b)
    if a_d == -1 and b_d == -2:  # contraction over the sharded dim on both sides
        return replicated(comm.all_reduce(out, spec.group), spec)
    if a_d == -1 or b_d == -2:
        raise ShardingError(
            f"{op_name(func)} contracts the sharded dimension of one operand with a plain operand; both must be "
            "sharded alike along the contracted dimension"
        )
    if a_d is not None and b_d is not None and a_d != b_d:
        raise ShardingError(f"{op_name(func)}: operands are sharded along different dimensions")
    if a_d is not None:  # rows or batch dims of a
        return wrap(out, spec, a_d)
    return wrap(out, spec, b_d)  # columns or batch dims of b


@register(torch.einsum)
def _einsum(func, args, kwargs):
    eq = args[0].replace(" ", "")
    operands = list(args[1:])
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = list(operands[0])
    if "..." in eq:
        raise UnsupportedOpError("einsum with '...' on ShardTensors is not supported; write the dims out")
    ins, _, out_sub = eq.partition("->")
    in_subs = ins.split(",")
    if not _:
        letters = "".join(in_subs)
        out_sub = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    shards = [o for o in operands if isinstance(o, ShardTensor)]
    spec = common_spec(shards, func)
    letter = None
    for sub, op in zip(in_subs, operands):
        if isinstance(op, ShardTensor):
            this = sub[op._spec.dim]
            if letter is not None and this != letter:
                raise ShardingError(f"einsum '{eq}': operands are sharded along different subscripts")
            letter = this
    for sub, op in zip(in_subs, operands):
        if not isinstance(op, ShardTensor) and letter in sub:
            raise ShardingError(
                f"einsum '{eq}': plain operand with subscripts '{sub}' spans the sharded subscript '{letter}'"
            )
    with no_subclass():
        out = torch.einsum(eq, *operands)
    if letter in out_sub:
        return wrap(out, spec, out_sub.index(letter))
    return replicated(comm.all_reduce(out, spec.group), spec)
