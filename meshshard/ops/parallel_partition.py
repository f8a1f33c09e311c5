r"""``repartition()``: the serial partitioners, run on a sharded cloud without gathering it.

Each rank starts with an arbitrary contiguous chunk of the points (a slice of a file, its ``.vtu``
pieces, an empty chunk) and ends with its part of the partition, in original order. No rank ever
holds more than its chunk, its part, and histograms or samples whose size depends on ``P`` only.

RCB (:func:`meshshard.partition.rcb`, ``sharded=`` mode)
    The serial level loop runs on every rank over its own points; the node boxes are reduced
    with one ``all_reduce`` (max) and the histograms with one ``all_reduce`` (sum) per level,
    so every rank takes the serial decisions (axis, median bucket) from the same numbers. The
    points of the median bucket are spread over ranks: :meth:`_RcbOps.select` refines that
    bucket by coordinate (then by original index, when all its coordinates are equal) with
    further all-reduced sub-histograms until at most :data:`GATHER_LIMIT` points per node
    remain, gathers those, and applies the serial rule to them.
Morton / Hilbert
    Keys on one global grid (the bounding box is all-reduced), then a distributed sample sort of
    ``(key, original index)`` (regular sampling: one ``all_gather`` of samples, one
    ``all_to_all`` of ``(key, index, weight)``). Part boundaries come from two all-reduces over
    the sorted prefix weights; each point's part goes back to the rank that holds it.

Then one ``all_to_all`` moves the coordinates (with their original indices) to their owners.

Why it is exact (the tie rule)
    The serial partition orders points by (coordinate, original index) inside an RCB node and by
    (curve key, original index) along a curve; part boundaries are the cumulative weights nearest
    each target, the lower on ties. ``repartition`` uses the same orders, so the only source of
    disagreement would be floating-point sums grouped differently on several ranks. Weights are
    therefore quantised (:func:`~meshshard.partition.quantize_weights`, in the serial
    partitioner too) to integers below ``2**53 / N``: every partial sum is exact in ``float64``
    in any grouping. Unit weights already are. Hence ``ids.full_tensor()`` equals
    ``partition(x.full_tensor(), P).perm`` bit for bit, and the sizes are equal.

Written here rather than taken from a library: the partition must equal meshshard's own serial
partitioner point for point, which no distributed partitioner (ParMETIS, Zoltan) offers.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import comm, faults
from .._checks import check_points, check_positive_int, nonnegative_problem, points_problem
from .._sizes import owner_of
from ..partition import (
    DEFAULT_BITS,
    check_method,
    cum_fractions,
    hilbert_keys,
    monotone_cuts,
    morton_keys,
    quantize,
    quantize_weights,
    rcb,
)
from ..tensor import ShardTensor

__all__ = ["repartition", "repartition_with_payload"]

GATHER_LIMIT = 64  # median-bucket points per node gathered to every rank once refinement is done
SUB_BUCKETS = 1024  # resolution of each refinement histogram
SAMPLES_PER_RANK = 64  # regular samples per rank for the curve sample sort

_F64 = torch.float64


def _local_problem(local: torch.Tensor, w: torch.Tensor | None, first: int) -> str | None:
    """This rank's verdict on its shard of ``x`` (checked :func:`check_points` first) and weights.

    ``first``: the shard's first global row, so messages number rows as the global tensor does.
    """
    problem = points_problem(local, "x", first_row=first)
    if problem is not None or w is None:
        return problem
    if w.is_complex() or w.dtype == torch.bool:
        return f"weights must hold real numbers (got {w.dtype})"
    if w.ndim != 1:
        return f"weights must be one-dimensional (got local shape {tuple(w.shape)})"
    return nonnegative_problem(w.to(_F64), "weights", first_index=first)


def repartition(  # its collectives are named after repartition_with_payload, which it calls
    x: ShardTensor,
    method: str = "rcb",
    weights: ShardTensor | None = None,
    *,
    axis_rule: str = "density",
    num_parts: int | None = None,
) -> tuple[ShardTensor, ShardTensor]:
    r"""Partition a sharded point cloud over its ranks and move every point to its owner.

    The result equals the serial partition of the gathered cloud into ``P`` (the number of
    ranks) parts: ``ids.full_tensor()`` equals ``partition(x.full_tensor(), P, method,
    weights.full_tensor(), axis_rule=axis_rule).perm``, and ``points.sharding_sizes`` equals its
    ``sizes``, for any input distribution (empty chunks included). The tie rule that makes this
    exact: points are ordered by (coordinate, original index) in RCB nodes and by (curve key,
    original index) along curves, and weights are quantised so that every sum is exact (see
    :mod:`meshshard.ops.parallel_partition`).

    Parameters
    ----------
    x : ShardTensor
        ``(N, D)`` coordinates, ``D`` in ``{2, 3}``, sharded along dim 0 in any sizes; the
        original index of a point is its row in ``x.full_tensor()``.
    method : {"rcb", "morton", "hilbert"}
        Partitioner, as in :func:`meshshard.partition.partition`.
    weights : ShardTensor, optional
        ``(N,)`` non-negative per-point cost, sharded like ``x``.
    axis_rule : {"density", "longest"}
        How RCB picks its cut axis.
    num_parts : int, optional
        ``P`` (default: the number of ranks ``W``). With more parts than ranks, part ``p`` goes to
        rank ``p * W // P`` (contiguous blocks) and each rank holds its parts one after the other:
        ``ids.full_tensor()`` is still the serial ``perm`` of a ``P``-part partition.

    Returns
    -------
    points : ShardTensor
        ``(N, D)``: rank ``r`` holds the coordinates of part ``r`` in original order (the rows
        ``perm[offsets[r]:offsets[r + 1]]`` of the serial partition; with ``num_parts``, its
        block of parts).
    ids : ShardTensor
        ``(N,)`` int64, sharded like ``points``: each point's original index.

    Raises
    ------
    TypeError
        ``x`` or ``weights`` is not a ShardTensor sharded along dim 0, or ``method`` is no string.
    ValueError
        On every rank, naming the offending ranks: non-finite or non-floating coordinates, wrong
        shapes, negative or non-finite weights, all-zero weights, an unknown method or axis rule.

    **Shapes**: ``x`` ``(N_global, D)``, ``weights`` ``(N_global,)`` -> ``(N_global, D)``,
    ``(N_global,)``; no rank holds more than its input chunk plus its part plus ``O(P)``-sized
    histograms and samples (RCB: ``D * P/2 * 1024`` histogram entries at the last level).

    **Communication**: ``2`` ``all_gather`` (bad-input flags; the final send sizes), and with
    weights ``2`` ``all_reduce`` (max, total). Then:

    * ``rcb``: per tree level (``ceil(log2 P)``, plus one box reduction after the last):
      ``1`` ``all_reduce`` of the node boxes (max),
      ``1`` of the histograms (sum), ``2`` for the median buckets' sizes and bounds, ``3`` more
      per refinement round (rare: each divides a median bucket by 1024), and ``2`` ``all_gather``
      of at most ``GATHER_LIMIT`` candidates per node (sizes, rows).
    * ``morton``/``hilbert``: ``1`` ``all_reduce`` (bounding box), ``2`` ``all_gather`` (samples,
      split sizes), ``1`` ``all_gather`` (sorted counts and weights), ``2`` ``all_reduce``
      (boundaries), ``2`` ``all_to_all`` (keys to the sorters, parts back: ``24`` and ``16``
      bytes per point).
    * Always ``1`` ``all_to_all`` that moves the points (coordinates and index per row); with
      ``num_parts`` other than the number of ranks, ``1`` more ``all_reduce`` (part sizes).

    Examples
    --------
    >>> points, ids = repartition(x, "hilbert")          # doctest: +SKIP
    >>> part = ms.partition.partition(x.full_tensor(), world_size, "hilbert")  # doctest: +SKIP
    >>> torch.equal(ids.full_tensor(), part.perm)        # doctest: +SKIP
    True

    Not run as a doctest: ``x`` is a sharded ``ShardTensor``, which needs a process group of several ranks.
    """
    points, ids, _, _ = repartition_with_payload(x, method, weights, axis_rule=axis_rule, num_parts=num_parts)
    return points, ids


@faults.entry
def repartition_with_payload(
    x: ShardTensor,
    method: str = "rcb",
    weights: ShardTensor | None = None,
    *,
    axis_rule: str = "density",
    num_parts: int | None = None,
    payload: torch.Tensor | None = None,
) -> tuple[ShardTensor, ShardTensor, torch.Tensor | None, list[int]]:
    """:func:`repartition`, also moving ``payload`` rows with their points, and returning part sizes.

    ``payload``: ``(n_local, B)`` ``uint8`` rows (any per-point data as bytes) travelling in the
    same ``all_to_all`` as the points. Returns ``(points, ids, payload rows, part sizes)``.
    """
    if not isinstance(x, ShardTensor):
        raise TypeError(f"x must be a ShardTensor of coordinates (got {type(x).__name__})")
    if x.shard_dim != 0:
        raise TypeError(f"x must be sharded along dim 0, the point dim (got shard_dim {x.shard_dim})")
    method = check_method(method)
    if axis_rule not in ("density", "longest"):
        raise ValueError(f"axis_rule must be 'density' or 'longest' (got {axis_rule!r})")
    if weights is not None:
        if not isinstance(weights, ShardTensor):
            raise TypeError(f"weights must be a ShardTensor sharded like x, or None (got {type(weights).__name__})")
        if weights.shard_dim != 0 or tuple(weights.sharding_sizes) != tuple(x.sharding_sizes):
            raise ValueError(
                f"weights must be sharded like x along dim 0 (sizes {tuple(x.sharding_sizes)}; "
                f"got sizes {tuple(weights.sharding_sizes)} along dim {weights.shard_dim})"
            )
    spec = x.spec
    group, rank, world = spec.group, spec.rank, spec.num_ranks
    if num_parts is None:
        num_parts = world
    num_parts = check_positive_int(num_parts, "num_parts")
    check_points(x, "x", dims=(2, 3), sharded=True)  # global metadata: every rank decides alike
    local = x.to_local().detach()
    w_local = None if weights is None else weights.to_local().detach()
    problem = _local_problem(local, w_local, x.offsets[rank])
    comm.agree(problem, group, error_type=ValueError, what="repartition: bad input")
    device = local.device
    n_local, dim = local.shape
    offsets = x.offsets
    num_points = int(offsets[-1])
    ids = torch.arange(int(offsets[rank]), int(offsets[rank + 1]), dtype=torch.long, device=device)

    w = None
    if w_local is not None:
        w = w_local.to(_F64)
        local_max = w.max() if n_local else torch.zeros((), dtype=_F64, device=device)
        max_weight = float(comm.all_reduce_max(local_max.reshape(1), group)[0])
        if num_points > 0 and max_weight <= 0.0:
            raise ValueError(f"[rank {rank}] repartition: weights must have a positive sum (got all zeros)")
        w = quantize_weights(w, num_points, max_weight)
        total = comm.all_reduce_(w.sum().reshape(1), group)[0]  # exact: integer-valued float64
    else:
        total = torch.tensor(float(num_points), dtype=_F64, device=device)

    # Cumulative targets built exactly as the serial partitioner builds them.
    cum = cum_fractions(num_parts, device=device)

    if num_points == 0:
        owner = torch.zeros(0, dtype=torch.long, device=device)
    elif method == "rcb":
        ops = _RcbOps(num_points, total, group, ids, w)
        owner = rcb(local, w, cum, axis_rule=axis_rule, sharded=ops)[0]
    else:
        owner = _sharded_curve_owner(local, ids, w, total, cum, method, offsets, group, rank, world)
    if payload is not None and (payload.dtype != torch.uint8 or payload.ndim != 2 or payload.shape[0] != n_local):
        raise ValueError(f"payload must be ({n_local}, B) uint8 rows (got {payload.dtype} {tuple(payload.shape)})")
    return _move(local, ids, owner, x, group, rank, world, num_parts, payload)


# ----------------------------------------------------------------------------------------- RCB
class _RcbOps:
    """The reductions and the median-bucket selection of a sharded :func:`rcb` run."""

    def __init__(
        self, num_points: int, total: torch.Tensor, group: Any, ids: torch.Tensor, weights: torch.Tensor | None
    ) -> None:
        self.num_points = num_points
        self.total_weight = total
        self.group = group
        self.ids = ids
        self.weights = weights

    def reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return comm.all_reduce_(t.contiguous(), self.group)

    def reduce_box(self, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        both = comm.all_reduce_max(torch.cat([hi, -lo]).to(_F64), self.group).to(lo.dtype)  # exact casts
        return -both[lo.shape[0] :], both[: lo.shape[0]]

    def _stats(
        self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, node: torch.Tensor, num_nodes: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Global count and weight, and bounds ``(max x, -min x, max id, -min id)`` of each node's points."""
        sums = torch.zeros((2, num_nodes), dtype=_F64, device=x.device)
        sums[0].index_add_(0, node, torch.ones_like(w))
        sums[1].index_add_(0, node, w)
        bounds = torch.full((4, num_nodes), -torch.inf, dtype=_F64, device=x.device)
        idf = ids.to(_F64)
        for row, value in enumerate((x, -x, idf, -idf)):
            bounds[row].scatter_reduce_(0, node, value, reduce="amax")
        sums = comm.all_reduce_(sums, self.group)
        bounds = comm.all_reduce_max(bounds, self.group)
        return sums[0], sums[1], bounds

    def select(
        self, cand: torch.Tensor, cand_x: torch.Tensor, cand_node: torch.Tensor, need: torch.Tensor
    ) -> torch.Tensor:
        """Local indices (among ``cand``) that the serial rule sends left; see ``rcb._take_left``.

        Over all ranks, node ``m``'s candidates ordered by (coordinate, original index) send
        their first ``j`` left, ``j`` the count whose prefix weight is nearest ``need[m]``
        (fewer on ties). Found by refining a window that holds the first candidate whose prefix
        reaches ``need`` (or the last one) until it holds at most ``GATHER_LIMIT`` points.
        """
        device = cand.device
        num_nodes = need.numel()
        x = cand_x.to(_F64)
        ids = self.ids.index_select(0, cand)
        w = torch.ones_like(x) if self.weights is None else self.weights.index_select(0, cand)
        node = cand_node
        active = torch.ones(cand.numel(), dtype=torch.bool, device=device)
        below_w = torch.zeros(num_nodes, dtype=_F64, device=device)  # weight ordered before the window
        count, _, bounds = self._stats(x, ids, w, node, num_nodes)
        live = need > 0  # need <= 0: nothing goes left
        while True:
            refine = live & (count > GATHER_LIMIT)
            if not bool(refine.any()):
                break
            by_id = bounds[0] <= -bounds[1]  # one coordinate value left: refine by original index
            pick = refine.index_select(0, node) & active
            pn = node[pick]
            xa, ia = x[pick], ids[pick]
            half_lo = -bounds[1].index_select(0, pn) * 0.5  # halves: no overflow of the differences
            half_span = bounds[0].index_select(0, pn) * 0.5 - half_lo
            sub_x = ((xa * 0.5 - half_lo) / half_span * SUB_BUCKETS).floor_().clamp_(0, SUB_BUCKETS - 1)
            id_lo = (-bounds[3]).index_select(0, pn).to(torch.long)
            id_span = bounds[2].index_select(0, pn).to(torch.long) - id_lo + 1
            sub_id = (ia - id_lo) * SUB_BUCKETS // id_span
            sub = torch.where(by_id.index_select(0, pn), sub_id, torch.nan_to_num(sub_x).to(torch.long))
            key = pn * SUB_BUCKETS + sub
            hist = torch.zeros((2, num_nodes * SUB_BUCKETS), dtype=_F64, device=device)
            hist[0].index_add_(0, key, torch.ones_like(xa))
            hist[1].index_add_(0, key, w[pick])
            hist = comm.all_reduce_(hist, self.group).view(2, num_nodes, SUB_BUCKETS)
            cum_w = below_w[:, None] + hist[1].cumsum(dim=1)
            chosen = torch.searchsorted(cum_w, need[:, None], side="left")[:, 0]
            # No window reaches need: the last candidate decides, in the last non-empty sub-bucket.
            last = SUB_BUCKETS - 1 - (hist[0] > 0).flip(1).to(torch.long).argmax(dim=1)
            chosen = torch.where(chosen >= SUB_BUCKETS, last, chosen)
            before = torch.where(chosen > 0, cum_w.gather(1, (chosen - 1).clamp(min=0)[:, None])[:, 0], below_w)
            below_w = torch.where(refine, before, below_w)
            keep = torch.ones_like(pick)
            keep[pick] = sub == chosen.index_select(0, pn)
            active &= keep
            idx = active.nonzero()[:, 0]
            count, _, bounds = self._stats(x[idx], ids[idx], w[idx], node[idx], num_nodes)
            # Bounds of nodes not refined are unchanged; their counts too (all their points stay).

        # Gather each live node's window to every rank and apply the serial rule there.
        send = active & live.index_select(0, node)
        rows = torch.stack([node[send].to(_F64), x[send], ids[send].to(_F64), w[send]], dim=1)
        sizes = comm.all_gather_object_sizes(rows.shape[0], self.group, device=device)
        width = max(sizes)
        padded = torch.zeros((width, 4), dtype=_F64, device=device)
        padded[: rows.shape[0]] = rows
        table = comm.all_gather(padded, self.group)
        rows = torch.cat([table[r, :s] for r, s in enumerate(sizes)])
        thr_x, thr_id, include = _threshold(rows, below_w, need, num_nodes)
        tx = thr_x.index_select(0, node)
        tid = thr_id.index_select(0, node)
        inc = include.index_select(0, node)
        left = (x < tx) | ((x == tx) & ((ids < tid) | ((ids == tid) & inc)))
        return cand[left & live.index_select(0, node)]


def _threshold(
    rows: torch.Tensor, below_w: torch.Tensor, need: torch.Tensor, num_nodes: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per node, the last candidate ``(x, id)`` sent left, or ``-inf`` when none is.

    ``rows``: ``(n, 4)`` float64 ``[node, x, id, weight]`` of every rank's window. Returns the
    ``(x, id)`` of the candidate ``j_hi`` (the first whose prefix weight reaches ``need``, or the
    last) and whether it goes left itself (``take = j_hi``) or only those before it (``j_lo``).
    """
    device = rows.device
    # Order by (node, x, id) with stable sorts, least significant key first.
    order = torch.sort(rows[:, 2], stable=True).indices
    order = order[torch.sort(rows[order, 1], stable=True).indices]
    order = order[torch.sort(rows[order, 0], stable=True).indices]
    rows = rows[order]
    node = rows[:, 0].to(torch.long)
    count = torch.bincount(node, minlength=num_nodes)
    start = torch.cumsum(count, 0) - count
    running = torch.cat([torch.zeros(1, dtype=_F64, device=device), torch.cumsum(rows[:, 3], 0)])
    prefix = below_w.index_select(0, node) + running[1:] - running.index_select(0, start.index_select(0, node))
    short = (prefix < need.index_select(0, node)).to(torch.long)
    first = torch.zeros(num_nodes, dtype=torch.long, device=device).index_add_(0, node, short)
    pos = start + torch.minimum(first, (count - 1).clamp(min=0))  # row of candidate j_hi
    has = (count > 0) & (need > 0)
    pos = torch.where(has, pos, 0)
    if rows.shape[0] == 0:
        neg = torch.full((num_nodes,), -torch.inf, dtype=_F64, device=device)
        return neg, neg.to(torch.long), torch.zeros(num_nodes, dtype=torch.bool, device=device)
    prefix_hi = prefix.index_select(0, pos)
    prefix_lo = prefix_hi - rows[pos, 3]
    take_hi = ~(need - prefix_lo <= prefix_hi - need)
    thr_x = torch.where(has, rows[pos, 1], -torch.inf)
    thr_id = torch.where(has, rows[pos, 2], -1.0).to(torch.long)
    return thr_x, thr_id, take_hi & has


# ------------------------------------------------------------------------------ space-filling curves
def _lex_count_below(keys: torch.Tensor, ids: torch.Tensor, key: int, ident: int) -> int:
    """Number of ``(keys, ids)`` pairs (sorted lexicographically) below ``(key, ident)``."""
    lo = int(torch.searchsorted(keys, torch.tensor([key], device=keys.device), side="left")[0])
    hi = int(torch.searchsorted(keys, torch.tensor([key], device=keys.device), side="right")[0])
    if hi == lo:
        return lo
    return lo + int(torch.searchsorted(ids[lo:hi], torch.tensor([ident], device=keys.device), side="left")[0])


def _lex_order(keys: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    order = torch.sort(ids, stable=True).indices
    return order[torch.sort(keys[order], stable=True).indices]


def _sharded_curve_owner(
    local: torch.Tensor,
    ids: torch.Tensor,
    w: torch.Tensor | None,
    total: torch.Tensor,
    cum_fractions: torch.Tensor,
    method: str,
    offsets: tuple[int, ...],
    group: Any,
    rank: int,
    world: int,
) -> torch.Tensor:
    """Part of each local point of a Morton/Hilbert partition: the serial ``partition``'s owners, over ranks."""
    device = local.device
    n_local, dim = local.shape
    num_points = int(offsets[-1])
    bits = DEFAULT_BITS[dim]
    x = local.to(_F64)
    box = torch.full((2, dim), -torch.inf, dtype=_F64, device=device)
    if n_local:
        box[0], box[1] = x.amax(dim=0), -x.amin(dim=0)
    box = comm.all_reduce_max(box, group)
    grid = quantize(local, bits, bounds=(-box[1], box[0]))
    keys = morton_keys(grid) if method == "morton" else hilbert_keys(grid, bits)
    order = torch.sort(keys, stable=True).indices  # ids ascend locally: this is (key, id) order
    keys, sids = keys[order], ids[order]
    sw = torch.ones(n_local, dtype=_F64, device=device) if w is None else w[order]

    # Regular sampling: every rank's evenly spaced samples, sorted, give world - 1 splitters.
    take = min(n_local, SAMPLES_PER_RANK)
    samples = torch.zeros((SAMPLES_PER_RANK, 3), dtype=torch.long, device=device)
    if take:
        at = (torch.arange(take, device=device) * n_local) // take
        samples[:take, 0], samples[:take, 1], samples[:take, 2] = keys[at], sids[at], 1
    allsamp = comm.all_gather(samples, group).reshape(-1, 3)
    allsamp = allsamp[allsamp[:, 2] == 1]
    allsamp = allsamp[_lex_order(allsamp[:, 0], allsamp[:, 1])]
    picks = [(j * allsamp.shape[0]) // world for j in range(1, world)]
    cuts = [0] + [_lex_count_below(keys, sids, int(allsamp[p, 0]), int(allsamp[p, 1])) for p in picks] + [n_local]
    send_sizes = [cuts[j + 1] - cuts[j] for j in range(world)]
    table = comm.all_gather(torch.tensor(send_sizes, dtype=torch.long, device=device), group)
    recv_sizes = table[:, rank].tolist()
    payload = torch.stack([keys, sids, sw.view(torch.long)], dim=1)
    got = comm.all_to_all(payload, send_sizes, recv_sizes, group)
    order = _lex_order(got[:, 0], got[:, 1])
    got = got[order]
    gids = got[:, 1].contiguous()
    gw = _bytes_as(got[:, 2:3], _F64).reshape(-1)

    # Global positions and prefix weights (exact: integer-valued float64).
    m = got.shape[0]
    stats = comm.all_gather(torch.tensor([float(m), float(gw.sum())], dtype=_F64, device=device), group)
    base_pos = int(stats[:rank, 0].sum())
    base_w = stats[:rank, 1].sum()
    incl = base_w + torch.cumsum(gw, 0)
    targets = total * cum_fractions
    less = torch.searchsorted(incl, targets, side="left").to(_F64)  # entries of incl below each target
    less = comm.all_reduce_(less, group)
    hi = ((targets > 0).to(torch.long) + less.to(torch.long)).clamp_(max=num_points)
    lo = (hi - 1).clamp_(min=0)
    values = torch.zeros((2, hi.numel()), dtype=_F64, device=device)
    for row, pos in enumerate((hi, lo)):
        mine = (pos > base_pos) & (pos <= base_pos + m)
        values[row, mine] = incl[pos[mine] - 1 - base_pos]
    values = comm.all_reduce_(values, group)  # one rank holds each value, the others add +0
    take_lo = (targets - values[1]) <= (values[0] - targets)
    bounds = monotone_cuts(torch.where(take_lo, lo, hi), num_points)
    positions = base_pos + torch.arange(m, device=device)
    part = (torch.searchsorted(bounds, positions, side="right") - 1).clamp_(0, cum_fractions.numel() - 2)

    # Each part goes back to the rank that holds the point.
    origin = owner_of(gids, offsets)
    back = torch.sort(origin, stable=True).indices
    reply = comm.all_to_all(torch.stack([gids[back], part[back]], dim=1), recv_sizes, send_sizes, group)
    owner = torch.empty(n_local, dtype=torch.long, device=device)
    owner[reply[:, 0] - int(offsets[rank])] = reply[:, 1]
    return owner


# ---------------------------------------------------------------------------------------- moving
def _bytes_as(columns: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Reinterpret a column block of a packed buffer as ``dtype`` (through a fresh, aligned copy)."""
    out = torch.empty(columns.shape, dtype=columns.dtype, device=columns.device)
    out.copy_(columns)
    return out.view(dtype)


def _move(
    local: torch.Tensor,
    ids: torch.Tensor,
    owner: torch.Tensor,
    x: ShardTensor,
    group: Any,
    rank: int,
    world: int,
    num_parts: int,
    payload: torch.Tensor | None,
) -> tuple[ShardTensor, ShardTensor, torch.Tensor | None, list[int]]:
    """One ``all_to_all`` of ``(coordinates, original index[, part, payload])`` rows to their owners.

    Part ``p`` lives on rank ``p * world // num_parts``; rows arrive ordered by (part, original index).
    """
    device = local.device
    n = owner.numel()
    dest = owner if num_parts == world else owner * world // num_parts
    order = torch.sort(dest, stable=True).indices  # ids ascend within each destination
    send = torch.bincount(dest, minlength=world)
    table = comm.all_gather(send, group)  # table[r, s]: rank r sends s
    recv = table[:, rank].tolist()
    sizes = table.sum(dim=0).tolist()
    if num_parts == world:
        part_sizes = sizes
    else:
        part_sizes = comm.all_reduce_(torch.bincount(owner, minlength=num_parts), group).tolist()
    dim = local.shape[1]
    blocks = [
        local[order].contiguous().view(torch.uint8).reshape(n, dim * local.element_size()),
        ids[order].contiguous().view(torch.uint8).reshape(n, 8),
    ]
    if num_parts != world:
        blocks.append(owner[order].contiguous().view(torch.uint8).reshape(n, 8))
    if payload is not None:
        blocks.append(payload[order])
    widths = [b.shape[1] for b in blocks]
    got = comm.all_to_all(torch.cat(blocks, dim=1), send.tolist(), recv, group)
    # Chunks arrive in source-rank order and input chunks are contiguous: ids already ascend.
    cols = torch.split(got, widths, dim=1)
    points = _bytes_as(cols[0], local.dtype).reshape(-1, dim)
    new_ids = _bytes_as(cols[1], torch.long).reshape(-1)
    moved = cols[-1] if payload is not None else None
    if num_parts != world:
        parts = _bytes_as(cols[2], torch.long).reshape(-1)
        by_part = torch.sort(parts, stable=True).indices  # (part, original index)
        points, new_ids = points[by_part], new_ids[by_part]
        moved = None if moved is None else moved[by_part]
    if points.device != device:
        points, new_ids = points.to(device), new_ids.to(device)
    mesh, mesh_dim = x.spec.mesh, x.spec.mesh_dim
    return (
        ShardTensor.from_local(points, mesh, sizes=sizes, mesh_dim=mesh_dim),
        ShardTensor.from_local(new_ids, mesh, sizes=sizes, mesh_dim=mesh_dim),
        moved,
        part_sizes,
    )
