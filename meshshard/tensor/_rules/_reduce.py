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

from ... import comm
from ...errors import ShardingError
from .._dispatch import bind, no_subclass, op_name
from .._dispatch import register_rule as register
from .._spec import ShardSpec
from .._tensor import ShardTensor
from ._common import common_spec, extreme_fill, local_of, ndim, norm_dims, plain_along_shard, refuse, replicated, wrap

T = torch.Tensor


def _kept_dim(spec_dim: int, dims: tuple[int, ...], keepdim: bool) -> int:
    return spec_dim if keepdim else spec_dim - sum(1 for d in dims if d < spec_dim)


def _count(spec: ShardSpec, dims: tuple[int, ...] | None) -> int:
    shape = spec.global_shape
    return shape.numel() if dims is None else math.prod([shape[d] for d in dims])


def _local_reduce(func, args, kwargs, x: ShardTensor, dims, keepdim):
    with no_subclass():
        out = func(*args, **kwargs)
    return wrap(out, x._spec, _kept_dim(x._spec.dim, dims, keepdim))


def _reduce_keep_shape(local: torch.Tensor, dims, keepdim: bool) -> torch.Tensor:
    """Drop the (kept, size-1) reduced dims unless ``keepdim``."""
    if dims is None:
        return local.reshape(()) if not keepdim else local
    if keepdim:
        return local
    for d in sorted(dims, reverse=True):
        local = local.squeeze(d)
    return local


def _first_sharded(func, x) -> ShardTensor:
    if not isinstance(x, ShardTensor):
        raise refuse(func, "the reduced tensor must be the ShardTensor (got a plain tensor with sharded arguments)")
    return x


class SafeRoot(torch.autograd.Function):
    """``s ** (1 / p)`` whose gradient at ``s == 0`` is 0, as torch's norms define it (not ``inf * 0``)."""

    @staticmethod
    def forward(ctx, s: torch.Tensor, p: float) -> torch.Tensor:
        out = s.pow(1.0 / p)
        ctx.save_for_backward(s, out)
        ctx.p = p
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        s, out = ctx.saved_tensors
        safe = torch.where(s > 0, s, torch.ones_like(s))
        g = grad * out / (ctx.p * safe)
        return torch.where(s > 0, g, torch.zeros_like(g)), None


# -- sum / mean -----------------------------------------------------------------------------------
@register(torch.sum, T.sum, torch.nansum, T.nansum)
def _sum(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "dim", "keepdim"), {"keepdim": False}, kwonly=("dtype",))
    x = _first_sharded(func, a["input"])
    dims, keepdim = norm_dims(a["dim"], ndim(x), func), bool(a["keepdim"])
    if dims is not None and x._spec.dim not in dims:
        return _local_reduce(func, args, kwargs, x, dims, keepdim)
    with no_subclass():
        local = func(*args, **kwargs)
    return replicated(comm.all_reduce(local, x._spec.group), x._spec)


@register(torch.mean, T.mean, torch.nanmean, T.nanmean)
def _mean(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "dim", "keepdim"), {"keepdim": False}, kwonly=("dtype",))
    x = _first_sharded(func, a["input"])
    dims, keepdim = norm_dims(a["dim"], ndim(x), func), bool(a["keepdim"])
    if dims is not None and x._spec.dim not in dims:
        return _local_reduce(func, args, kwargs, x, dims, keepdim)
    spec, local = x._spec, x.to_local()
    if not (local.dtype.is_floating_point or local.dtype.is_complex) and a["dtype"] is None:
        with no_subclass():
            return func(*args, **kwargs)  # torch's own error for integer input, on every rank
    if a["dtype"] is not None:
        local = local.to(a["dtype"])
    if func in (torch.nanmean, T.nanmean):
        valid = ~torch.isnan(local)
        s = torch.where(valid, local, torch.zeros_like(local)).sum(dim=dims, keepdim=keepdim)
        c = valid.to(local.dtype).sum(dim=dims, keepdim=keepdim)
        both = comm.all_reduce(torch.stack([s, c]), spec.group)
        return replicated(both[0] / both[1], spec)
    s = local.sum(dim=dims, keepdim=keepdim)
    return replicated(comm.all_reduce(s, spec.group) / _count(spec, dims), spec)


# -- var / std ------------------------------------------------------------------------------------
def _parse_var(func, args, kwargs):
    """var/std in all three of torch's forms: (input, unbiased), (input, dim, unbiased, keepdim), and
    (input, dim=None, *, correction=1, keepdim=False)."""
    args = list(args)
    unbiased = None
    if len(args) > 1 and isinstance(args[1], bool):  # var(x, unbiased)
        unbiased = args.pop(1)
    elif len(args) > 2 and isinstance(args[2], bool):  # var(x, dim, unbiased, keepdim)
        unbiased = args.pop(2)
    a = bind(func, args, kwargs, ("input", "dim", "keepdim"), {"keepdim": False}, kwonly=("unbiased", "correction"))
    if a["unbiased"] is not None:
        unbiased = bool(a["unbiased"])
    if a["correction"] is not None and unbiased is not None:
        raise RuntimeError(f"{op_name(func)}: cannot specify both correction and unbiased")
    correction = float(a["correction"]) if a["correction"] is not None else 1.0 if unbiased in (None, True) else 0.0
    return a["input"], a["dim"], correction, bool(a["keepdim"])


@register(torch.var, T.var, torch.std, T.std)
def _var(func, args, kwargs):
    x, dim, correction, keepdim = _parse_var(func, args, kwargs)
    x = _first_sharded(func, x)
    dims = norm_dims(dim, ndim(x), func)
    if dims is not None and x._spec.dim not in dims:
        return _local_reduce(func, args, kwargs, x, dims, keepdim)
    spec, local = x._spec, x.to_local()
    if not (local.dtype.is_floating_point or local.dtype.is_complex):
        raise refuse(func, f"needs a floating-point input (got {local.dtype})")
    count = _count(spec, dims)
    mean = comm.all_reduce(local.sum(dim=dims, keepdim=True), spec.group) / count
    sq = comm.all_reduce(((local - mean).abs() ** 2).sum(dim=dims, keepdim=True), spec.group)
    var = _reduce_keep_shape(sq / max(count - correction, 0), dims, keepdim)
    if count - correction <= 0:
        var = var * float("nan")
    out = var.sqrt() if func in (torch.std, T.std) else var
    return replicated(out, spec)


# -- norms ----------------------------------------------------------------------------------------
def _vector_norm(x: ShardTensor, p, dims, keepdim: bool, dtype, func):
    spec, local = x._spec, x.to_local()
    if dtype is not None:
        local = local.to(dtype)
    if not (local.dtype.is_floating_point or local.dtype.is_complex):
        raise refuse(func, f"needs a floating-point input (got {local.dtype})")
    if isinstance(p, bool) or not isinstance(p, (int, float)) and p not in ("fro",):
        raise refuse(func, f"ord/p={p!r} is not a vector norm supported over the sharded dimension")
    p = 2.0 if p == "fro" else float(p)
    if p == math.inf:
        return _extreme(x.abs() if dtype is None else x.to(dtype).abs(), dims, keepdim, largest=True)
    if p == -math.inf:
        return _extreme(x.abs() if dtype is None else x.to(dtype).abs(), dims, keepdim, largest=False)
    if p <= 0:
        raise refuse(func, f"p={p} over the sharded dimension is not supported")
    mag = local.abs()
    s = comm.all_reduce((mag * mag if p == 2 else mag.pow(p)).sum(dim=dims, keepdim=keepdim), spec.group)
    return replicated(s if p == 1 else SafeRoot.apply(s, p), spec)


@register(torch.norm, T.norm)
def _norm(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "p", "dim", "keepdim", "dtype"), {"p": "fro", "keepdim": False})
    x = _first_sharded(func, a["input"])
    dims, keepdim = norm_dims(a["dim"], ndim(x), func), bool(a["keepdim"])
    if dims is not None and x._spec.dim not in dims:
        return _local_reduce(func, args, kwargs, x, dims, keepdim)
    if a["p"] == "fro" and dims is not None and len(dims) > 2:
        raise refuse(func, "the Frobenius norm takes at most 2 dims")
    return _vector_norm(x, a["p"], dims, keepdim, a["dtype"], func)


@register(torch.linalg.vector_norm)
def linalg_vector_norm_rule(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "ord", "dim", "keepdim"), {"ord": 2, "keepdim": False}, kwonly=("dtype",))
    x = _first_sharded(func, a["input"])
    dims, keepdim = norm_dims(a["dim"], ndim(x), func), bool(a["keepdim"])
    if dims is not None and x._spec.dim not in dims:
        return _local_reduce(func, args, kwargs, x, dims, keepdim)
    return _vector_norm(x, a["ord"], dims, keepdim, a["dtype"], func)


# -- max / min ------------------------------------------------------------------------------------

def _local_extreme(local: torch.Tensor, dims, largest: bool) -> torch.Tensor:
    """amax/amin over ``dims`` (keepdim; NaN propagates) that also works on an empty shard."""
    fill = extreme_fill(local.dtype, largest)
    if local.numel() == 0:
        shape = [1 if (dims is None or d in dims) else s for d, s in enumerate(local.shape)]
        return torch.full(shape, fill, dtype=local.dtype, device=local.device)
    dims_ = tuple(range(local.dim())) if dims is None else dims
    return local.amax(dim=dims_, keepdim=True) if largest else local.amin(dim=dims_, keepdim=True)


def _order_key(v: torch.Tensor, largest: bool) -> torch.Tensor:
    """A key whose max over ranks is the wanted extreme, in a dtype gloo reduces exactly (NaN excluded)."""
    if v.dtype.is_floating_point:
        v = v.to(torch.float64)
        v = torch.where(torch.isnan(v), torch.full_like(v, -math.inf if largest else math.inf), v)
        return v if largest else -v
    v = v.to(torch.int64)
    return v if largest else ~v  # ~ reverses the order of int64 without overflow


def _from_key(key: torch.Tensor, largest: bool, dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point:
        return (key if largest else -key).to(dtype)
    return (key if largest else ~key).to(dtype)


def _global_extreme_value(m_local: torch.Tensor, spec: ShardSpec, largest: bool) -> torch.Tensor:
    """The extreme over ranks of ``m_local`` (NaN anywhere gives NaN, as torch): one max all-reduce."""
    key = _order_key(m_local, largest)
    if m_local.dtype.is_floating_point:
        nan = torch.isnan(m_local).to(torch.float64)
        both = comm.all_reduce_max(torch.stack([key, nan]), spec.group)
        out = _from_key(both[0], largest, m_local.dtype)
        return torch.where(both[1] > 0, torch.full_like(out, math.nan), out)
    return _from_key(comm.all_reduce_max(key, spec.group), largest, m_local.dtype)


def _extreme(x: ShardTensor, dims, keepdim: bool, largest: bool):
    """Global max/min over ``dims``; the gradient is shared evenly between tied elements (as torch)."""
    spec, local = x._spec, x.to_local()
    m = _global_extreme_value(_local_extreme(local.detach(), dims, largest), spec, largest)
    if local.dtype.is_floating_point and local.requires_grad:
        dims_ = tuple(range(local.dim())) if dims is None else dims
        tie = local.detach() == m
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
    a = bind(func, args, kwargs, ("input", "dim", "keepdim"), {"dim": (), "keepdim": False})
    x = _first_sharded(func, a["input"])
    dims, keepdim = norm_dims(a["dim"], ndim(x), func), bool(a["keepdim"])
    if dims is not None and x._spec.dim not in dims:
        return _local_reduce(func, args, kwargs, x, dims, keepdim)
    if x._spec.num_global == 0:
        raise IndexError(f"{op_name(func)}(): Expected reduction dim {x._spec.dim} to have non-zero size.")
    return _extreme(x, dims, keepdim, largest=func in (torch.amax, T.amax))


def _global_arg(x: ShardTensor, d: int | None, largest: bool):
    """The global index of the extreme along the sharded dim ``d`` (keepdim), or of the flattened
    tensor when ``d`` is None: the first NaN if any (as torch), else the first among ties."""
    spec, local = x._spec, x.to_local().detach()
    if d is None:
        flat = local.reshape(-1)
        n = flat.numel()
        if n:
            lv = flat.max() if largest else flat.min()
            li = flat.argmax() if largest else flat.argmin()
            coords = list(torch.unravel_index(li, local.shape))
            coords[spec.dim] = coords[spec.dim] + spec.offsets[spec.rank]
            gi = torch.zeros((), dtype=torch.long)
            for c, size in zip(coords, spec.global_shape):
                gi = gi * size + c
        else:
            lv = torch.full((), extreme_fill(local.dtype, largest), dtype=local.dtype)
            gi = torch.zeros((), dtype=torch.long)
        lv, gi = lv.reshape(1), gi.reshape(1)
    else:
        n = local.shape[d]
        if n:
            lv, gi = local.max(dim=d, keepdim=True) if largest else local.min(dim=d, keepdim=True)
            gi = gi + spec.offsets[spec.rank]
        else:
            shape = list(local.shape)
            shape[d] = 1
            lv = torch.full(shape, extreme_fill(local.dtype, largest), dtype=local.dtype, device=local.device)
            gi = torch.zeros(shape, dtype=torch.long, device=local.device)
    gv = _global_extreme_value(lv, spec, largest)
    if local.dtype.is_floating_point:
        win = torch.where(torch.isnan(gv), torch.isnan(lv), lv == gv)
    else:
        win = lv == gv
    big = torch.iinfo(torch.int64).max
    cand = torch.where(win & (n > 0), gi, torch.full_like(gi, big))
    return ~comm.all_reduce_max(~cand, spec.group)  # the smallest winning global index


@register(torch.max, T.max, torch.min, T.min)
def _max(func, args, kwargs):
    largest = func in (torch.max, T.max)
    second = args[1] if len(args) > 1 else kwargs.get("other", kwargs.get("dim", kwargs.get("axis")))
    if isinstance(second, torch.Tensor):  # binary max/min: pointwise
        from ._local import pointwise_rule

        a = bind(func, args, kwargs, ("input", "other"))
        return pointwise_rule(torch.maximum if largest else torch.minimum, (a["input"], a["other"]), {})
    if second is None:
        a = bind(func, args, kwargs, ("input",))
        x = _first_sharded(func, a["input"])
        if x._spec.global_shape.numel() == 0:
            raise RuntimeError(f"{op_name(func)}(): Expected reduction dim to be specified for input.numel() == 0. "
                               "Specify the reduction dim with the 'dim' argument.")
        return _extreme(x, None, False, largest)
    a = bind(func, args, kwargs, ("input", "dim", "keepdim"), {"keepdim": False})
    x = _first_sharded(func, a["input"])
    (d,) = norm_dims(a["dim"], ndim(x), func)
    keepdim = bool(a["keepdim"])
    if d != x._spec.dim:
        return _local_reduce(func, args, kwargs, x, (d,), keepdim)
    spec, local = x._spec, x.to_local()
    if spec.num_global == 0:
        raise IndexError(f"{op_name(func)}(): Expected reduction dim {d} to have non-zero size.")
    gi = _global_arg(x, d, largest)
    n = local.shape[d]
    # the owner of each winning index contributes its (differentiable) value; others add zero
    mine = (gi >= spec.offsets[spec.rank]) & (gi < spec.offsets[spec.rank + 1])
    if n:
        picked = local.gather(d, (gi - spec.offsets[spec.rank]).clamp(0, n - 1))
        picked = torch.where(mine, picked, torch.zeros_like(picked))
    else:  # an empty shard: zeros that stay in the graph, so every rank joins the backward all-reduce
        picked = local.sum(dim=d, keepdim=True)
    if local.dtype.is_floating_point or local.dtype.is_complex:
        values = comm.all_reduce(picked, spec.group)
    else:
        values = comm.all_reduce(picked.to(torch.int64), spec.group).to(local.dtype)
    if not keepdim:
        values, gi = values.squeeze(d), gi.squeeze(d)
    ret = torch.return_types.max((values, gi)) if largest else torch.return_types.min((values, gi))
    return replicated(ret, spec)


@register(torch.argmax, T.argmax, torch.argmin, T.argmin)
def _argmax(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "dim", "keepdim"), {"keepdim": False})
    x = _first_sharded(func, a["input"])
    largest = func in (torch.argmax, T.argmax)
    spec, keepdim = x._spec, bool(a["keepdim"])
    if a["dim"] is None:
        if spec.global_shape.numel() == 0:
            raise RuntimeError(f"{op_name(func)}(): Expected reduction dim to be specified for input.numel() == 0.")
        gi = _global_arg(x, None, largest)
        return replicated(gi.reshape([1] * ndim(x)) if keepdim else gi.reshape(()), spec)
    (d,) = norm_dims(a["dim"], ndim(x), func)
    if d != spec.dim:
        return _local_reduce(func, args, kwargs, x, (d,), keepdim)
    if spec.num_global == 0:
        raise IndexError(f"{op_name(func)}(): Expected reduction dim {d} to have non-zero size.")
    gi = _global_arg(x, d, largest)
    return replicated(gi if keepdim else gi.squeeze(d), spec)


# -- softmax family -------------------------------------------------------------------------------
def _softmax_parts(local: torch.Tensor, spec: ShardSpec, dims):
    """(shift, exp(local - shift), global sum of the exps); NaN propagates through the sum."""
    m = comm.all_reduce_max(_order_key(_local_extreme(local.detach(), dims, True), True), spec.group)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).to(local.dtype)
    e = torch.exp(local - m)
    s = comm.all_reduce(e.sum(dim=dims, keepdim=True), spec.group)
    return m, e, s


@register(torch.softmax, T.softmax, F.softmax, torch.log_softmax, T.log_softmax, F.log_softmax)
def _softmax(func, args, kwargs):
    if func in (F.softmax, F.log_softmax):
        a = bind(func, args, kwargs, ("input", "dim", "_stacklevel", "dtype"))
    else:
        a = bind(func, args, kwargs, ("input", "dim", "dtype"))
    x = _first_sharded(func, a["input"])
    if a["dim"] is None:
        raise refuse(func, "needs an explicit dim")
    (d,) = norm_dims(a["dim"], ndim(x), func)
    if d != x._spec.dim:
        with no_subclass():
            out = func(*args, **kwargs)
        return wrap(out, x._spec, x._spec.dim)
    local = x.to_local()
    if a["dtype"] is not None:
        local = local.to(a["dtype"])
    if not local.dtype.is_floating_point:
        raise refuse(func, f"needs a floating-point input (got {local.dtype})")
    m, e, s = _softmax_parts(local, x._spec, (d,))
    if func in (torch.log_softmax, T.log_softmax, F.log_softmax):
        out = local - m - torch.log(s)
    else:
        out = e / s
    return wrap(out, x._spec, d)


@register(torch.logsumexp, T.logsumexp)
def _logsumexp(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "dim", "keepdim"), {"keepdim": False})
    x = _first_sharded(func, a["input"])
    dims, keepdim = norm_dims(a["dim"], ndim(x), func), bool(a["keepdim"])
    if dims is not None and x._spec.dim not in dims:
        return _local_reduce(func, args, kwargs, x, dims, keepdim)
    local = x.to_local()
    if not local.dtype.is_floating_point:
        local = local.to(torch.get_default_dtype())
    m, _, s = _softmax_parts(local, x._spec, dims)
    return replicated(_reduce_keep_shape(m + torch.log(s), dims, keepdim), x._spec)


# -- any / all / count_nonzero --------------------------------------------------------------------
@register(torch.any, T.any, torch.all, T.all, torch.count_nonzero, T.count_nonzero)
def _logical_reduce(func, args, kwargs):
    if func in (torch.count_nonzero, T.count_nonzero):
        a = bind(func, args, kwargs, ("input", "dim"))
        a["keepdim"] = False
    else:
        a = bind(func, args, kwargs, ("input", "dim", "keepdim"), {"keepdim": False})
    x = _first_sharded(func, a["input"])
    dims, keepdim = norm_dims(a["dim"], ndim(x), func), bool(a["keepdim"])
    if dims is not None and x._spec.dim not in dims:
        return _local_reduce(func, args, kwargs, x, dims, keepdim)
    spec = x._spec
    with no_subclass():
        local = func(*args, **kwargs)
    if func in (torch.count_nonzero, T.count_nonzero):
        return replicated(comm.all_reduce(local, spec.group), spec)
    flag = local.to(torch.int32)
    if func in (torch.any, T.any):
        out = comm.all_reduce_max(flag, spec.group)
    else:
        out = -comm.all_reduce_max(-flag, spec.group)
    return replicated(out.to(local.dtype), spec)


# -- contractions ---------------------------------------------------------------------------------
@register(torch.matmul, T.matmul, T.__matmul__, T.__rmatmul__, torch.mm, T.mm, torch.bmm, T.bmm)
def _matmul(func, args, kwargs):
    a_ = bind(func, args, kwargs, ("input", "other"))
    a, b = a_["input"], a_["other"]
    if func is T.__rmatmul__:
        a, b = b, a
    shards = [t for t in (a, b) if isinstance(t, ShardTensor)]
    spec = common_spec(shards, func)
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise TypeError(f"{op_name(func)}: expected two tensors")
    if ndim(a) < 2 or ndim(b) < 2:
        raise refuse(func, "a 1-d operand with a ShardTensor is not supported", "unsqueeze it to 2-d")
    a_d = a._spec.dim - ndim(a) if isinstance(a, ShardTensor) else None  # negative positions
    b_d = b._spec.dim - ndim(b) if isinstance(b, ShardTensor) else None
    if a_d == -1 and b_d == -2:  # contraction over the sharded dim on both sides
        with no_subclass():
            out = func(*args, **kwargs)
        return replicated(comm.all_reduce(out, spec.group), spec)
    if a_d == -1 or b_d == -2:
        raise ShardingError(
            f"[rank {spec.rank}] {op_name(func)} contracts the sharded dimension of one operand with a plain operand; "
            "both must be sharded alike along the contracted dimension"
        )
    if a_d is not None and b_d is not None and a_d != b_d:
        raise ShardingError(f"[rank {spec.rank}] {op_name(func)}: operands are sharded along different dimensions")
    d = a_d if a_d is not None else b_d
    if d < -2:  # a batch dim: the plain operand must broadcast along it
        if a_d is None:
            a = plain_along_shard(func, a, spec, -d)
        if b_d is None:
            b = plain_along_shard(func, b, spec, -d)
    with no_subclass():
        out = torch.matmul(local_of(a), local_of(b)) if func is not T.__rmatmul__ else torch.matmul(a, b)
        if func in (torch.mm, T.mm, torch.bmm, T.bmm):
            want = 2 if func in (torch.mm, T.mm) else 3
            if ndim(a) != want or ndim(b) != want:
                raise RuntimeError(f"{op_name(func)}: expected {want}-D tensors (got {ndim(a)}-D and {ndim(b)}-D)")
    nd_out = max(ndim(a), ndim(b))
    return wrap(out, spec, nd_out + d)


@register(torch.einsum)
def _einsum(func, args, kwargs):
    if kwargs or not args or not isinstance(args[0], str):
        raise refuse(func, "expected einsum(equation, *operands)")
    eq = args[0].replace(" ", "")
    operands = list(args[1:])
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = list(operands[0])
    if "..." in eq:
        raise refuse(func, "'...' is not supported", "write the dims out")
    ins, arrow, out_sub = eq.partition("->")
    in_subs = ins.split(",")
    if len(in_subs) != len(operands):
        raise ValueError(f"einsum(): {len(in_subs)} subscripts for {len(operands)} operands")
    if not arrow:
        letters = "".join(in_subs)
        out_sub = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    shards = [o for o in operands if isinstance(o, ShardTensor)]
    spec = common_spec(shards, func)
    letter = None
    for sub, op in zip(in_subs, operands):
        if isinstance(op, ShardTensor):
            if len(sub) != ndim(op):
                raise RuntimeError(f"einsum(): the subscript '{sub}' does not match a {ndim(op)}-d operand")
            this = sub[op._spec.dim]
            if letter is not None and this != letter:
                raise ShardingError(
                    f"[rank {spec.rank}] einsum '{eq}': operands are sharded along different subscripts")
            letter = this
    for sub, op in zip(in_subs, operands):
        if not isinstance(op, ShardTensor) and letter in sub and op.shape[sub.index(letter)] != 1:
            raise ShardingError(
                f"[rank {spec.rank}] einsum '{eq}': plain operand with subscripts '{sub}' spans the sharded subscript "
                f"'{letter}'"
            )
    with no_subclass():
        out = torch.einsum(eq, *operands)
    if letter in out_sub:
        return wrap(out, spec, out_sub.index(letter))
    return replicated(comm.all_reduce(out, spec.group), spec)
