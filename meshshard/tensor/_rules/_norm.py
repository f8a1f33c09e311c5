"""Normalisation whose statistics span the points of every rank: ``batch_norm`` and ``instance_norm``.

``F.batch_norm`` (``nn.BatchNorm1d/2d/3d``) on an input ``(N, C, ...)`` sharded on any dim but the
channel dim 1: in training the per-channel mean and (biased) variance are those of the gathered
tensor, the running statistics are updated on every rank with the same numbers as single-process
torch (unbiased variance), forward and backward are exact. In evaluation (or with ``training=False``)
the running statistics are used as they are: local, no communication.

``F.instance_norm`` (``nn.InstanceNorm1d/2d/3d``) on ``(B, C, N, ...)`` sharded on a spatial dim:
per-sample, per-channel statistics over the points of every rank.

Why by hand: ``SyncBatchNorm`` gathers per-rank statistics with ``all_gather`` and needs even
batches; here one sum all-reduce carries (sum, sum of squares, count) for uneven and empty shards,
and autograd differentiates through it (the all-reduce's backward is the one of
:func:`meshshard.comm.all_reduce`). Sums are accumulated in float64, so the one-pass variance
``E[x^2] - E[x]^2`` keeps float32 inputs at torch's precision.

**Communication:**

=======================================  ==========================================================
``batch_norm``, training                 one ``all_reduce`` of ``2 C + 1`` float64 (sum, sum of
                                         squares, count); backward: one of the same size
``batch_norm``, evaluation               none
``instance_norm`` over the points        one ``all_reduce`` of ``2 B C`` float64; backward: one
sharded on the batch dim (either op)     none (per-sample statistics are local) for instance_norm
=======================================  ==========================================================
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import comm
from .._dispatch import bind, no_subclass
from .._dispatch import register_rule as register
from .._tensor import ShardTensor
from ._common import local_of, ndim, refuse, sharded_input, wrap

_BN = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
_IN = ("input", "running_mean", "running_var", "weight", "bias", "use_input_stats", "momentum", "eps")


def _check(func, a) -> ShardTensor:
    x = sharded_input(func, a["input"])
    for n in ("running_mean", "running_var", "weight", "bias"):
        if isinstance(a[n], ShardTensor):
            raise refuse(func, f"{n} must be a plain (replicated) tensor")
    if ndim(x) < 2:
        raise ValueError(f"{func.__name__}: expected an input of at least 2 dims (N, C, ...) (got {ndim(x)})")
    if x._spec.dim == 1:
        raise refuse(func, "the channel dim (1) is sharded; shard the points instead")
    return x


def _affine(y: torch.Tensor, weight, bias, nd: int) -> torch.Tensor:
    shape = [1, -1] + [1] * (nd - 2)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def _global_moments(local: torch.Tensor, dims: tuple[int, ...], spec):
    """(mean, biased var, count) over ``dims`` of the gathered tensor: one fused all-reduce in float64."""
    x64 = local.to(torch.float64)
    s = x64.sum(dim=dims)
    sq = (x64 * x64).sum(dim=dims)
    n_local = 1
    for d in dims:
        n_local *= local.shape[d]
    n_part = torch.full((1,), float(n_local), dtype=torch.float64, device=local.device)
    both = comm.all_reduce(torch.cat([s.reshape(-1), sq.reshape(-1), n_part]), spec.group)
    k = s.numel()
    s, sq, count = both[:k].reshape(s.shape), both[k : 2 * k].reshape(s.shape), both[2 * k].detach()
    mean = s / count
    var = (sq / count - mean * mean).clamp_min(0)
    return mean, var, count


@register(F.batch_norm)
def _batch_norm(func, args, kwargs):
    a = bind(func, args, kwargs, _BN, {"training": False, "momentum": 0.1, "eps": 1e-5})
    x = _check(func, a)
    spec = x._spec
    if not a["training"] or spec.dim == 0 and spec.num_ranks == 1:
        with no_subclass():
            out = func(**{k: local_of(v) for k, v in a.items()})
        return wrap(out, spec, spec.dim)
    local = x.to_local()
    nd = local.dim()
    dims = tuple(d for d in range(nd) if d != 1)
    c = local.shape[1]
    mean, var, count = _global_moments(local, dims, spec)
    n = int(spec.global_shape.numel() // spec.global_shape[1]) if spec.global_shape[1] else 0
    if n <= 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size "
                         f"{list(spec.global_shape)}")
    shape = [1, c] + [1] * (nd - 2)
    y = (local - mean.to(local.dtype).reshape(shape)) * torch.rsqrt(var + a["eps"]).to(local.dtype).reshape(shape)
    y = _affine(y, a["weight"], a["bias"], nd)
    rm, rv, m = a["running_mean"], a["running_var"], a["momentum"]
    with torch.no_grad():
        if rm is not None:
            rm.mul_(1 - m).add_(mean.to(rm.dtype), alpha=m)
        if rv is not None:
            rv.mul_(1 - m).add_((var * (count / (count - 1))).to(rv.dtype), alpha=m)
    return wrap(y, spec, spec.dim)


@register(F.instance_norm)
def _instance_norm(func, args, kwargs):
    a = bind(func, args, kwargs, _IN, {"use_input_stats": True, "momentum": 0.1, "eps": 1e-5})
    x = _check(func, a)
    spec = x._spec
    if spec.dim == 0 and a["use_input_stats"] and a["running_mean"] is not None:
        raise refuse(func, "running statistics average over the sharded batch", "track_running_stats=False")
    if spec.dim == 0 or not a["use_input_stats"]:  # per-sample statistics: local
        local = x.to_local()
        with no_subclass():
            if local.shape[spec.dim] == 0:  # torch refuses an empty batch; there is nothing to normalise
                out = local * 1
            else:
                out = func(**{k: local_of(v) for k, v in a.items()})
        return wrap(out, spec, spec.dim)
    local = x.to_local()
    nd = local.dim()
    if nd < 3:
        raise refuse(func, "needs an input (B, C, N, ...) with the points sharded")
    dims = tuple(range(2, nd))
    b, c = local.shape[0], local.shape[1]
    mean, var, count = _global_moments(local, dims, spec)
    if int(spec.global_shape.numel() // (b * c) if b * c else 0) <= 1:
        raise ValueError(f"Expected more than 1 spatial element when training, got input size "
                         f"{list(spec.global_shape)}")
    shape = [b, c] + [1] * (nd - 2)
    y = (local - mean.to(local.dtype).reshape(shape)) * torch.rsqrt(var + a["eps"]).to(local.dtype).reshape(shape)
    y = _affine(y, a["weight"], a["bias"], nd)
    rm, rv, m = a["running_mean"], a["running_var"], a["momentum"]
    with torch.no_grad():
        if rm is not None:
            rm.mul_(1 - m).add_(mean.mean(0).to(rm.dtype), alpha=m)
        if rv is not None:
            rv.mul_(1 - m).add_((var * (count / (count - 1))).mean(0).to(rv.dtype), alpha=m)
    return wrap(y, spec, spec.dim)
