"""Selection and sorting along the sharded dimension: ``sort``/``argsort``/``msort``, ``topk``,
``kthvalue``, ``median``/``nanmedian``, ``quantile``/``nanquantile``.

**The order.** Every element is ranked by ``(value, global index)``: NaN above everything (torch's
order; first when descending), ``-0.0`` equal to ``0.0``, ties broken by the global index along the
dim — torch's *stable* order on the gathered tensor. Values always equal torch's; indices equal
torch's wherever the values are distinct, and torch's ``stable=True`` sort always (torch's unstable
sort, ``topk``, ``kthvalue`` and ``median`` pick an implementation-defined index among equal values).

**The distributed sort** (:func:`sort_positions`, a sample sort): each rank sorts its elements as
records ``(column, key, global row)`` (the column is the flat index over the other dims), sends a few
regularly spaced samples to every rank, and every rank picks the same ``P - 1`` splitters from them
(weighted by the ranks' sizes, so the buckets are balanced for uneven shards). Records travel to
their bucket's rank (one uneven ``all_to_all``), are merged there, numbered within their column
(one ``all_gather`` of per-rank column counts), and sent to the owner of their output row (the
result is sharded with the input's sizes). Values are then fetched from their owners
(:func:`~meshshard.tensor._rules._index.fetch_rows`, differentiable: the backward sends each
gradient back to the element it came from). Memory per rank: ``O(N_local * K)`` records plus
``P * K`` column counts, ``K`` the number of columns.

Results: ``sort``/``argsort``/``msort`` are ShardTensors sharded like the input; ``topk``,
``kthvalue``, ``median``, ``quantile`` are replicated (:class:`~meshshard.tensor.ReplicatedTensor`).

**Communication** (along the sharded dim, ``P > 1``; ``K`` columns, ``M = N_local * K``):

=================================  ================================================================
``argsort``                        2 ``all_gather`` (``4 P`` samples of 3 int64; ``K`` int64 counts)
                                   + 4 ``all_to_all`` (counts, ``M`` records of 3 int64, twice)
``sort``, ``msort``                the same + 3 ``all_to_all`` fetching the values (backward: 1)
``kthvalue``, ``median``           ``sort`` + 2 ``all_reduce`` of ``K`` values (the picked element,
                                   its index; backward: 1) (+ 1 of ``K`` NaN counts for ``median``)
``quantile``                       ``sort`` + 1 ``all_reduce`` of ``K`` NaN counts + 4 ``all_reduce``
                                   of ``Q * K`` (the two neighbours and their indices)
``topk``                           2 ``all_to_all``: each rank's ``min(k, N_local)`` best rows per
                                   column, values and indices (backward: 1)
=================================  ================================================================
"""

from __future__ import annotations

import math

import torch

from ... import comm
from ..._sizes import owner_of
from .._dispatch import bind, op_name
from .._dispatch import register_rule as register
from .._tensor import ShardTensor, wrap_shard
from ._common import along_other_dim, dim_of, no_subclass, refuse, replicated, shard_args, wrap
from ._index import fetch_rows

T = torch.Tensor
_SAMPLES_PER_RANK = 4  # x P: regular samples each rank offers for the splitters


# -- the order -------------------------------------------------------------------------------------
def order_keys(values: torch.Tensor, descending: bool, func) -> torch.Tensor:
    """int64 keys whose order is torch's sort order of ``values`` (NaN largest, -0.0 == 0.0)."""
    if values.dtype.is_complex or values.dtype == torch.uint64:
        raise refuse(func, f"cannot order {values.dtype} values along the sharded dim")
    if values.dtype.is_floating_point:
        f = values.to(torch.float64) + 0.0  # -0.0 + 0.0 is +0.0
        f = torch.where(torch.isnan(f), torch.full_like(f, math.nan), f)  # one NaN bit pattern, above +inf
        bits = f.view(torch.int64)
        key = bits ^ ((bits >> 63) & 0x7FFFFFFFFFFFFFFF)  # IEEE order as signed integers
    else:
        key = values.to(torch.int64)
    return ~key if descending else key


def _lex_order(*keys: torch.Tensor) -> torch.Tensor:
    """The permutation sorting records by ``keys`` (most significant first), ties kept in place."""
    perm = torch.arange(keys[0].numel(), device=keys[0].device)
    for k in reversed(keys):
        perm = perm[torch.argsort(k[perm], stable=True)]
    return perm


def _columns(x: ShardTensor, d: int) -> tuple[torch.Tensor, int]:
    """The local shard as ``(N_local, K)``: the sorted dim first, the other dims flattened."""
    local = x.to_local()
    moved = local.movedim(d, 0)
    k = math.prod(moved.shape[1:])
    return moved.reshape(moved.shape[0], k), k


def _exchange(rows: torch.Tensor, dest: torch.Tensor, spec) -> torch.Tensor:
    """Send each row of ``rows`` (int64 records, grouped by ``dest`` in rank order) to rank ``dest``."""
    P = spec.num_ranks
    send = torch.bincount(dest, minlength=P) if dest.numel() else torch.zeros(P, dtype=torch.long)
    recv = comm.all_to_all(send.cpu(), [1] * P, [1] * P, spec.group)
    return comm.all_to_all(rows, send.tolist(), recv.tolist(), spec.group)


def sort_positions(x: ShardTensor, d: int, descending: bool, func) -> torch.Tensor:
    """For every element of this rank's output shard of ``sort(x, d)``, the global row it comes from.

    **Shapes:** ``(N_local, K)`` int64 (``K`` the number of columns); see the module docstring for
    the algorithm and its communication.
    """
    spec = x._spec
    P, rank = spec.num_ranks, spec.rank
    vals, K = _columns(x, d)
    vals = vals.detach()
    n, off = vals.shape[0], spec.offsets[rank]
    dev = vals.device
    key = order_keys(vals, descending, func).reshape(-1)
    col = torch.arange(K, device=dev).repeat(n)
    row = (torch.arange(n, device=dev) + off).repeat_interleave(K)
    order = _lex_order(col, key)  # records are row-major, so the global row is already ascending
    rec = torch.stack([col[order], key[order], row[order]], 1)  # (M, 3) sorted
    # splitters: regular samples of every rank's sorted records, each weighted by its rank's size
    S = _SAMPLES_PER_RANK * P
    m = rec.shape[0]
    if m:
        pick = (torch.arange(S, device=dev) * m) // S
        mine = torch.cat([rec[pick], torch.ones(S, 1, dtype=torch.long, device=dev)], 1)
    else:
        mine = torch.zeros(S, 4, dtype=torch.long, device=dev)
    samples = comm.all_gather(mine, spec.group).to(dev)  # (P, S, 4)
    weight = torch.tensor([spec.sizes[s] * K for s in range(P)], dtype=torch.float64, device=dev)
    weight = weight[:, None].expand(P, S).reshape(-1)
    samples = samples.reshape(P * S, 4)
    valid = samples[:, 3] == 1
    samples, weight = samples[valid], weight[valid]
    so = _lex_order(samples[:, 0], samples[:, 1], samples[:, 2])
    samples, cum = samples[so, :3], torch.cumsum(weight[so], 0)
    goals = torch.arange(1, P, dtype=torch.float64, device=dev) * (cum[-1] / P)
    splitters = samples[torch.searchsorted(cum, goals).clamp(max=samples.shape[0] - 1)]  # (P - 1, 3)
    # bucket of each record: the number of splitters at or before it (a splitter goes before its equal)
    joint = torch.cat([splitters, rec], 0)
    flag = torch.cat([torch.zeros(P - 1, dtype=torch.long, device=dev), torch.ones(m, dtype=torch.long, device=dev)])
    jo = _lex_order(joint[:, 0], joint[:, 1], joint[:, 2], flag)
    before = torch.cumsum(flag[jo] == 0, 0)
    bucket = torch.empty(P - 1 + m, dtype=torch.long, device=dev)
    bucket[jo] = before
    got = _exchange(rec, bucket[P - 1:], spec)  # sorted runs, bucket order = rank order
    go = _lex_order(got[:, 0], got[:, 1], got[:, 2])
    got = got[go]
    # number each record within its column: the earlier buckets' counts, then the local position
    counts = torch.bincount(got[:, 0], minlength=K) if got.numel() else torch.zeros(K, dtype=torch.long, device=dev)
    table = comm.all_gather(counts, spec.group).to(dev)  # (P, K)
    base = table[:rank].sum(0)
    start = torch.cumsum(counts, 0) - counts
    c = got[:, 0]
    k = torch.arange(got.shape[0], device=dev) - start[c] + base[c]
    # to the owner of output row k
    dest = owner_of(k, spec.offsets).clamp_(0, P - 1)
    by = torch.argsort(dest, stable=True)
    placed = _exchange(torch.stack([k, c, got[:, 2]], 1)[by], dest[by], spec)
    out = torch.empty(n * K, dtype=torch.long, device=dev)
    out[(placed[:, 0] - off) * K + placed[:, 1]] = placed[:, 2]
    return out.reshape(n, K)


def _fetch_elements(x: ShardTensor, d: int, rows: torch.Tensor) -> torch.Tensor:
    """``x`` at (global row ``rows[i, c]`` along ``d``, column ``c``), from the owners; differentiable.

    **Shapes:** ``rows`` ``(R, K)`` -> ``(R, K)``.
    """
    spec = x._spec
    vals, K = _columns(x, d)
    flat_spec = spec.resized(0, [s * K for s in spec.sizes], [spec.num_global * K])
    flat = wrap_shard(vals.reshape(-1), flat_spec)
    cols = torch.arange(K, device=rows.device).expand_as(rows)
    return fetch_rows(flat, rows * K + cols, "sort").reshape(rows.shape)


def _back(t: torch.Tensor, x: ShardTensor, d: int) -> torch.Tensor:
    """``(N_local, K)`` back to the local shard's layout (the sorted dim at ``d``)."""
    moved = x.to_local().movedim(d, 0)
    return t.reshape(t.shape[0], *moved.shape[1:]).movedim(0, d)


def sharded_sort(x: ShardTensor, d: int, descending: bool, func, values: bool = True):
    """(values, indices) of the stable sort along the sharded dim ``d``, both sharded like ``x``."""
    rows = sort_positions(x, d, descending, func)
    idx = wrap(_back(rows, x, d), x._spec, d)
    if not values:
        return None, idx
    return wrap(_back(_fetch_elements(x, d, rows), x, d), x._spec, d), idx


def _sortable(func, x) -> ShardTensor:
    if not isinstance(x, ShardTensor):
        raise refuse(func, "only the sorted tensor may be a ShardTensor")
    return x


def _trivial(x: ShardTensor, d: int) -> bool:
    """Nothing to exchange: another dim, one rank, or no elements (decided from metadata)."""
    spec = x._spec
    return d != spec.dim or spec.num_ranks == 1 or spec.global_shape.numel() == 0


@register(torch.sort, T.sort, torch.argsort, T.argsort)
def _sort(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "dim", "descending"), {"dim": -1, "descending": False}, kwonly=("stable",))
    x = _sortable(func, a["input"])
    d = dim_of(func, x, a["dim"])
    if _trivial(x, d):
        return along_other_dim(func, args, kwargs, x, d)
    values, idx = sharded_sort(x, d, bool(a["descending"]), func, values=func in (torch.sort, T.sort))
    return idx if values is None else torch.return_types.sort((values, idx))


@register(torch.msort, T.msort)
def _msort(func, args, kwargs):
    a = bind(func, args, kwargs, ("input",))
    x = _sortable(func, a["input"])
    if _trivial(x, 0):
        return along_other_dim(func, args, kwargs, x, 0)
    return sharded_sort(x, 0, False, func)[0]


# -- picking elements of the sorted tensor -----------------------------------------------------------
def _owner_pick(cols: torch.Tensor, spec, rows: torch.Tensor) -> torch.Tensor:
    """``cols[rows[i, c], c]`` (global rows of a ``(N, K)`` tensor sharded like ``spec``) on every rank.

    The owner of each row contributes the element, the others zeros: one ``all_reduce`` (values
    differentiable: the backward returns each gradient to the owner).
    """
    n, off = cols.shape[0], spec.offsets[spec.rank]
    mine = (rows >= off) & (rows < off + n)
    if n:
        v = cols.gather(0, (rows - off).clamp(0, n - 1))
    else:  # zeros that stay in the graph, so this rank joins the backward all-reduce
        v = cols.sum(0, keepdim=True).to(cols.dtype).expand(rows.shape)
    v = torch.where(mine, v, torch.zeros_like(v))
    if v.dtype.is_floating_point or v.dtype.is_complex:
        return comm.all_reduce(v, spec.group)
    out = comm.all_reduce(v.to(torch.int64), spec.group)
    return out.to(torch.bool) if v.dtype == torch.bool else out.to(cols.dtype)


def _pick_sorted(x: ShardTensor, d: int, ranked: torch.Tensor, pos: torch.Tensor):
    """The value and the global index at per-column sorted positions ``pos`` (``(R, K)``), on every rank."""
    index = _owner_pick(ranked, x._spec, pos)
    return _owner_pick(_columns(x, d)[0], x._spec, index), index


def _whole(func, args, kwargs, x: ShardTensor):
    """A reducing op when no rank needs another's rows: one rank, or no elements (run on an empty tensor
    of the global shape, identical on every rank). Replicated."""
    spec = x._spec
    if spec.num_ranks > 1:
        probe = torch.empty(spec.global_shape, dtype=x.dtype, device=x.device)
        args = tuple(probe if a is x else a for a in args)
        kwargs = {k: probe if v is x else v for k, v in kwargs.items()}
    with no_subclass():
        return replicated(func(*args, **kwargs), spec)


def _nan_counts(x: ShardTensor, d: int) -> torch.Tensor:
    """NaNs per column over every rank: ``(K,)`` int64 (one ``all_reduce``; zeros for integer dtypes)."""
    vals, _ = _columns(x, d)
    if not vals.dtype.is_floating_point:
        return torch.zeros(vals.shape[1], dtype=torch.long, device=vals.device)
    return comm.all_reduce(torch.isnan(vals.detach()).sum(0), x._spec.group)


def _reduced_shape(x: ShardTensor, d: int, keepdim: bool) -> list[int]:
    shape = list(x._spec.global_shape)
    if keepdim:
        shape[d] = 1
    else:
        del shape[d]
    return shape


def _select_kth(func, x: ShardTensor, d: int, keepdim: bool, pos_of):
    """(value, index) at the per-column sorted position ``pos_of(x)``, replicated."""
    ranked = sort_positions(x, d, False, func)
    v, i = _pick_sorted(x, d, ranked, pos_of(x).reshape(1, -1))
    shape = _reduced_shape(x, d, keepdim)
    return replicated(v.reshape(shape), x._spec), replicated(i.reshape(shape), x._spec)


def _without_ranking(func, args, kwargs, x: ShardTensor, d: int, keepdim: bool):
    """The result of a selection along ``d`` that needs no ranking across ranks (``None`` when it does):
    along another dim than the points (local), or on a trivially sharded tensor (the whole op)."""
    if d != x._spec.dim:
        return along_other_dim(func, args, kwargs, x, d, drops_dim=not keepdim)
    if _trivial(x, d):
        return _whole(func, args, kwargs, x)
    return None


@register(torch.kthvalue, T.kthvalue)
def _kthvalue(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "k", "dim", "keepdim"), {"dim": -1, "keepdim": False})
    x, keepdim = _sortable(func, a["input"]), bool(a["keepdim"])
    d = dim_of(func, x, a["dim"])
    done = _without_ranking(func, args, kwargs, x, d, keepdim)
    if done is not None:
        return done
    k, n = int(a["k"]), x._spec.num_global
    if not 1 <= k <= n:
        raise IndexError(f"kthvalue(): selected number k out of range for dimension {d} (k = {k}, size {n})")
    v, i = _select_kth(func, x, d, keepdim, lambda t: torch.full((_columns(t, d)[1],), k - 1, dtype=torch.long))
    return torch.return_types.kthvalue((v, i))


def _median_pos(d: int, ignore_nan: bool):
    def pos_of(x: ShardTensor) -> torch.Tensor:
        n = x._spec.num_global
        nan = _nan_counts(x, d)
        if ignore_nan:  # the lower median of the non-NaN values; all NaN: the first NaN
            return ((n - nan - 1).clamp(min=0)) // 2
        return torch.where(nan > 0, n - nan, torch.full_like(nan, (n - 1) // 2))  # a NaN: the first one

    return pos_of


@register(torch.median, T.median, torch.nanmedian, T.nanmedian)
def _median(func, args, kwargs):
    ignore_nan = func in (torch.nanmedian, T.nanmedian)
    if len(args) < 2 and "dim" not in kwargs:  # the median of every element: a 0-d value
        a = bind(func, args, kwargs, ("input",))
        x = _sortable(func, a["input"])
        if _trivial(x, x._spec.dim):
            return _whole(func, args, kwargs, x)
        flat = x.reshape(-1)
        v, _ = _select_kth(func, flat, 0, False, _median_pos(0, ignore_nan))
        return replicated(_evenly(flat, v), x._spec)
    a = bind(func, args, kwargs, ("input", "dim", "keepdim"), {"keepdim": False})
    x, keepdim = _sortable(func, a["input"]), bool(a["keepdim"])
    d = dim_of(func, x, a["dim"])
    done = _without_ranking(func, args, kwargs, x, d, keepdim)
    if done is not None:
        return done
    v, i = _select_kth(func, x, d, keepdim, _median_pos(d, ignore_nan))
    return (torch.return_types.nanmedian if ignore_nan else torch.return_types.median)((v, i))


def _evenly(x: ShardTensor, m: torch.Tensor) -> torch.Tensor:
    """``m`` (an element's value) whose gradient is shared evenly between every element equal to it
    (all NaNs when it is NaN), as torch's ``median()``/``nanmedian()`` without a dim define it.

    **Communication:** one ``all_reduce`` of 2 values (backward: 1).
    """
    local = x.to_local()
    m = m.detach().to_plain() if hasattr(m, "to_plain") else m.detach()
    if not (local.dtype.is_floating_point and local.requires_grad):
        return m
    tie = torch.isnan(local) if bool(torch.isnan(m)) else local.detach() == m
    picked = torch.where(tie, local, torch.zeros_like(local)).sum()
    both = comm.all_reduce(torch.stack([picked, tie.sum().to(local.dtype)]), x._spec.group)
    share = both[0] / both[1]
    return m + (share - share.detach())


_INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


def _quantile_local(func, args, kwargs, x: ShardTensor, q, d: int, keepdim: bool, interpolation: str):
    """``quantile`` along a dim that is not sharded: torch's op on the local shard."""
    spec = x._spec
    if len(shard_args(args, kwargs)) != 1:
        raise refuse(func, "only the first operand may be a ShardTensor")
    sd = spec.dim - (d < spec.dim and not keepdim) + (isinstance(q, torch.Tensor) and q.dim() == 1)
    local = x.to_local()
    if local.numel() == 0 and spec.global_shape.numel():  # torch refuses an empty input: no rows here
        shape = list(local.shape)
        shape[spec.dim] = 1
        probe = torch.zeros(shape, dtype=local.dtype, device=local.device)
        with no_subclass():
            out = func(probe, q, d, keepdim, interpolation=interpolation)
        return wrap(out.narrow(sd, 0, 0) + local.sum() * 0, spec, sd)
    with no_subclass():
        out = func(*args, **kwargs)
    return wrap(out, spec, sd)


def _quantile_q(name: str, x: ShardTensor, q, interpolation: str) -> torch.Tensor:
    """torch's checks of a sharded quantile's arguments (from global metadata and the replicated ``q``);
    ``q`` as a tensor of the input's dtype."""
    dtype = x.dtype
    if dtype not in (torch.float32, torch.float64):
        raise RuntimeError(f"{name}() input tensor must be either float or double dtype")
    if x._spec.global_shape.numel() == 0:
        raise RuntimeError(f"{name}() input tensor must be non-empty")
    if interpolation not in _INTERPOLATIONS:
        raise RuntimeError(f"{name}() interpolation must be one of linear, lower, higher, midpoint or nearest. "
                           f"Found '{interpolation}'")
    q_t = q if isinstance(q, torch.Tensor) else torch.tensor(q, dtype=dtype)
    if q_t.dim() > 1:
        raise RuntimeError(f"{name}() q must be a scalar or 1D tensor")
    if q_t.dtype != dtype:
        raise RuntimeError(f"{name}() q tensor must be same dtype as the input tensor")
    if bool(((q_t < 0) | (q_t > 1)).any()):
        raise RuntimeError(f"{name}() q values must be in the range [0, 1]")
    return q_t


def _quantile_ranks(name: str, qv: torch.Tensor, n: int, nan: torch.Tensor, interpolation: str) -> torch.Tensor:
    """The (fractional) sorted positions of the quantiles, as torch computes them (NaNs sort last)."""
    if name == "nanquantile":
        ranks = qv * (n - nan - 1)
        ranks = torch.where(ranks < 0, torch.zeros_like(ranks), ranks)
    else:
        ranks = (qv * (n - 1)).expand(qv.shape[0], nan.shape[0])
        ranks = torch.where(nan > 0, torch.full_like(ranks, n - 1), ranks)
    if interpolation == "lower":
        return ranks.floor()
    if interpolation == "higher":
        return ranks.ceil()
    if interpolation == "nearest":
        return ranks.round()
    return ranks


@register(torch.quantile, T.quantile, torch.nanquantile, T.nanquantile)
def _quantile(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "q", "dim", "keepdim"), {"keepdim": False},
             kwonly=("interpolation",))
    x, q = a["input"], a["q"]
    name = "nanquantile" if func in (torch.nanquantile, T.nanquantile) else "quantile"
    if isinstance(q, ShardTensor) or not isinstance(x, ShardTensor):
        raise refuse(func, "q must be a plain (replicated) number or tensor, the input the ShardTensor")
    interpolation = a["interpolation"] or "linear"
    keepdim = bool(a["keepdim"])
    spec = x._spec
    d = None if a["dim"] is None else dim_of(func, x, a["dim"])
    if d is not None and d != spec.dim:  # local; a 1-d q prepends a dim
        return _quantile_local(func, args, kwargs, x, q, d, keepdim, interpolation)
    if _trivial(x, spec.dim):
        return _whole(func, args, kwargs, x)
    dtype = x.dtype
    q_t = _quantile_q(name, x, q, interpolation)
    src, sd = (x.reshape(-1), 0) if d is None else (x, d)
    ranked = sort_positions(src, sd, False, func)
    n = src._spec.num_global
    nan = _nan_counts(src, sd).to(dtype)
    qv = q_t.reshape(-1, 1).to(dtype)
    ranks = _quantile_ranks(name, qv, n, nan, interpolation)
    below = ranks.to(torch.long)
    out, _ = _pick_sorted(src, sd, ranked, below)
    if interpolation in ("linear", "midpoint"):
        weights = torch.full_like(ranks, 0.5) if interpolation == "midpoint" else ranks - below
        above, _ = _pick_sorted(src, sd, ranked, ranks.ceil().to(torch.long))
        out = torch.lerp(out, above, weights)
    if d is None:
        shape = [1] * spec.ndim if keepdim else []
    else:
        shape = _reduced_shape(x, d, keepdim)
    out = out.reshape([qv.shape[0], *shape] if q_t.dim() == 1 else shape)
    return replicated(out, spec)


# -- topk ------------------------------------------------------------------------------------------
@register(torch.topk, T.topk)
def _topk(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "k", "dim", "largest", "sorted"),
             {"dim": -1, "largest": True, "sorted": True})
    x = _sortable(func, a["input"])
    d = dim_of(func, x, a["dim"])
    done = _without_ranking(func, args, kwargs, x, d, keepdim=True)  # topk keeps the dim
    if done is not None:
        return done
    spec, k, largest = x._spec, int(a["k"]), bool(a["largest"])
    if not 0 <= k <= spec.num_global:
        raise RuntimeError(f"{op_name(func)}: selected index k out of range (k = {k}, size {spec.num_global})")
    local = x.to_local()
    n = local.shape[d]
    order = torch.sort(local.detach(), dim=d, descending=largest, stable=True).indices.narrow(d, 0, min(k, n))
    cand_v = local.gather(d, order)
    cand_i = order + spec.offsets[spec.rank]
    counts = [min(k, s) for s in spec.sizes]
    all_v = comm.gather_uneven(cand_v, counts, d, spec.group)  # rank order: ties stay in global-index order
    all_i = comm.gather_uneven(cand_i, counts, d, spec.group)
    best = torch.sort(all_v.detach(), dim=d, descending=largest, stable=True).indices.narrow(d, 0, k)
    ret = torch.return_types.topk((all_v.gather(d, best), all_i.gather(d, best)))
    return replicated(ret, spec)
