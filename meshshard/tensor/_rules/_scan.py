"""Scans along the sharded dimension: ``cumsum``, ``cumprod``, ``cummax``/``cummin``, ``logcumsumexp``.

Rank r scans its own rows, then combines the result with an *exclusive prefix* of the ranks before
it: the sum (product, running extreme, log-sum-exp) of the last row of every earlier rank's local
scan. Those last rows are the only data that travel: one row per rank, gathered on every rank by a
differentiable all-to-all (:func:`meshshard.comm.gather_uneven`), so the backward is autograd's own
through the local scans, the gather and the combination — exact, with gradients reaching earlier
ranks through the gathered rows. Empty ranks contribute the identity (no row). Along any other
dimension a scan is local.

Floating-point results equal the single-process scan up to rounding (the prefix is added as one
term instead of row by row); integer results are exact. ``cummax``/``cummin`` return global indices
and break ties as torch does (the latest index among equal values; a NaN, once seen, wins).

**Communication** (along the sharded dim, ``P > 1``):

=====================================  ===========================================================
``cumsum``, ``cumprod``,               one ``all_to_all`` (every rank sends its last row to each
``logcumsumexp``                       rank: ``P * row_bytes``); backward: one ``all_to_all``
``cummax``/``cummin``                  the same for the values + one ``all_gather`` of the last
                                       row's int64 indices (forward only)
=====================================  ===========================================================

``row_bytes`` is the size of one slice across the sharded dim (``numel / N_global`` elements).
"""

from __future__ import annotations

import math

import torch

from ... import comm
from .._dispatch import bind
from .._dispatch import register_rule as register
from .._tensor import ShardTensor
from ._common import along_other_dim, dim_of, extreme_fill, local_of, no_subclass, refuse, wrap

T = torch.Tensor

_SUM = (torch.cumsum, T.cumsum)
_PROD = (torch.cumprod, T.cumprod)
_MAX = (torch.cummax, T.cummax)
_MIN = (torch.cummin, T.cummin)
_LSE = (torch.logcumsumexp, T.logcumsumexp)


def _last_rows(scanned: torch.Tensor, d: int, spec, identity) -> torch.Tensor:
    """Every rank's last row of its local scan, stacked along ``d`` in rank order (P rows, differentiable).

    An empty rank sends a row of ``identity`` (dropped again by the callers, who know the sizes)."""
    n = scanned.shape[d]
    if n:
        last = scanned.narrow(d, n - 1, 1)
    else:
        shape = list(scanned.shape)
        shape[d] = 1
        last = torch.full(shape, identity, dtype=scanned.dtype, device=scanned.device)
        if scanned.requires_grad:  # in the graph (an empty sum adds 0), so this rank joins the backward
            last = last + scanned.sum(d, keepdim=True)
    return comm.gather_uneven(last, [1] * spec.num_ranks, d, spec.group)


def _earlier(spec) -> list[int]:
    """The non-empty ranks before this one (from the sizes: the same view on every rank)."""
    return [s for s in range(spec.rank) if spec.sizes[s] > 0]


def _earlier_rows(scanned: torch.Tensor, d: int, spec, identity) -> torch.Tensor:
    """The last rows of the earlier non-empty ranks' local scans, along ``d`` (possibly none)."""
    rows = _last_rows(scanned, d, spec, identity)
    return rows.index_select(d, torch.tensor(_earlier(spec), dtype=torch.long, device=rows.device))


def _take_first(a: torch.Tensor, b: torch.Tensor, largest: bool) -> torch.Tensor:
    """Where the running extreme moves to ``a`` (the later one) from ``b``: torch's rule
    (``isnan(a) or (not isnan(b) and a >= b)`` for cummax, ``<=`` for cummin)."""
    later_wins = a >= b if largest else a <= b
    if a.dtype.is_floating_point:
        return torch.isnan(a) | (~torch.isnan(b) & later_wins)
    return later_wins


@register(*_SUM, *_PROD, *_MAX, *_MIN, *_LSE)
def _scan(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "dim"), kwonly=("dtype",) if func in (*_SUM, *_PROD) else ())
    x = a["input"]
    if not isinstance(x, ShardTensor):
        raise refuse(func, "only the scanned tensor may be a ShardTensor")
    d = dim_of(func, x, a["dim"])
    spec = x._spec
    if d != spec.dim or spec.num_ranks == 1:
        return along_other_dim(func, args, kwargs, x, d)
    with no_subclass():
        local = func(*args, **kwargs)  # the local scan, with torch's dtype rules and errors
    if func in (*_MAX, *_MIN):
        return _extreme_scan(func, local, x, d)
    if func in _LSE and not local.dtype.is_floating_point:
        raise refuse(func, f"needs a floating-point input along the sharded dim (got {local.dtype})")
    # the prefix is applied on every rank, the first one included (an empty sum, product, log-sum-exp):
    # the gathered rows then enter every rank's graph, so every rank joins the gather's backward
    if func in _SUM:
        local = local + _earlier_rows(local, d, spec, 0).sum(d, keepdim=True)
    elif func in _PROD:
        local = local * _earlier_rows(local, d, spec, 1).prod(d, keepdim=True)
    else:
        local = _log_add_prefix(args, kwargs, local.dtype, d, spec)
    return wrap(local, spec, d)


def _log_add_prefix(args, kwargs, dtype: torch.dtype, d: int, spec) -> torch.Tensor:
    """The local scan rerun over ``[prefix; local rows]``, ``prefix`` the log-sum-exp of the earlier ranks' rows.

    As the single process sees it: combining ``logaddexp(prefix, scanned)`` instead would send a NaN
    gradient through the local scan wherever its own running value is still ``-inf``. Where every
    earlier row is ``-inf`` the prefix row is ``-inf`` and cut off from the gradient.
    """
    x = local_of(args[0] if args else kwargs["input"]).to(dtype)
    total = torch.logsumexp(x, d, keepdim=True)  # -inf on an empty rank, and in the graph
    rows = comm.gather_uneven(total, [1] * spec.num_ranks, d, spec.group)
    rows = rows.index_select(d, torch.tensor(_earlier(spec), dtype=torch.long, device=rows.device))
    if rows.shape[d]:
        m = rows.detach().amax(d, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    else:
        m = torch.zeros_like(total)
    s = torch.exp(rows - m).sum(d, keepdim=True)  # finite gradients, also with no rows or only -inf ones
    has = s > 0
    prefix = torch.where(has, torch.log(torch.where(has, s, torch.ones_like(s))) + m, torch.full_like(s, -math.inf))
    return torch.logcumsumexp(torch.cat([prefix, x], d), d).narrow(d, 1, x.shape[d])


def _extreme_scan(func, local_ret, x: ShardTensor, d: int):
    spec = x._spec
    largest = func in _MAX
    values, indices = local_ret
    indices = indices + spec.offsets[spec.rank]
    n = values.shape[d]
    fill = extreme_fill(values.dtype, largest)
    rows = _last_rows(values, d, spec, fill)
    last_i = indices.narrow(d, n - 1, 1) if n else torch.zeros_like(rows.narrow(d, 0, 1), dtype=torch.long)
    rows_i = comm.all_gather(last_i, spec.group).to(indices.device)  # (P, ...) in rank order
    # no earlier rank: a carry that never wins, still taken through where() so that the gathered
    # rows enter every rank's graph (every rank then joins the gather's backward)
    carry_v, carry_i, carry_ok = rows.narrow(d, 0, 1), rows_i[0], False
    for s in _earlier(spec):
        v, i = rows.narrow(d, s, 1), rows_i[s]
        if not carry_ok:
            carry_v, carry_i, carry_ok = v, i, True
        else:
            take = _take_first(v, carry_v, largest)
            carry_v, carry_i = torch.where(take, v, carry_v), torch.where(take, i, carry_i)
    own = _take_first(values, carry_v, largest) if carry_ok else torch.ones_like(values, dtype=torch.bool)
    values = torch.where(own, values, carry_v)
    indices = torch.where(own, indices, carry_i)
    ret = type(local_ret)((values, indices))
    return wrap(ret, spec, d)

