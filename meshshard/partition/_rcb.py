r"""Recursive coordinate bisection (a k-d tree), one tree level at a time for all nodes at once.

State: the tree node of every point (in the original order) and, per node, its parts ``[p0, p1)``
and its cell ``[lo, hi]``. At each level, for all nodes together:

* the bounding box of each node's points (``D`` ``scatter_reduce``) gives its extents;
* a weighted histogram of each candidate axis per node (``B`` equal buckets over the node's
  extent, one ``bincount`` for all nodes) locates the bucket holding the weighted median; the
  cut axis is the one whose median plane has the least weight per unit thickness in a window of
  ``+-B/64`` buckets (``axis_rule="density"``: the first-order ghost cost of the cut; ties go to
  the longest extent), or simply the longest extent (``axis_rule="longest"``, classic RCB);
* only the points of the median bucket (about ``N / B`` per node) are sorted, by coordinate and
  then original index, to place the cut exactly;
* points go to the left or right child, which take the node's place in the node list.

No Python loop runs over points or nodes (only over the ``D <= 3`` axes); cost ``O(N D)`` per
level, ``ceil(log2 P)`` levels. Given the axis, the cut does not depend on ``B``: it is the exact
weighted median of the node's points ordered by (coordinate, original index).

Cut placement: part boundary ``b`` sits where the cumulative weight, in partition order, is
nearest to ``W * (f_0 + ... + f_{b-1})`` (lower on ties). These global targets are the
proportional targets of the tree (a node holding parts ``[p0, p1)`` sends parts
``[p0, p0 + ceil((p1 - p0) / 2))`` left, aiming at their share of the weight) but rounding does
not compound down the tree: every unweighted part is within one point of its target, every
weighted part within the largest point weight. The cut plane lies halfway between the last point
sent left and the first sent right; points on a plane lie in both closed cells.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

__all__ = ["ShardedOps", "cum_fractions", "monotone_cuts", "nearest_boundaries", "rcb"]


class ShardedOps(Protocol):
    """What :func:`rcb` needs from a sharded run (see :mod:`meshshard.ops.parallel_partition`)."""

    num_points: int  # global N
    total_weight: float  # global weight (exact: weights are integer-valued, see quantize_weights)

    def reduce_sum(self, t: torch.Tensor) -> torch.Tensor: ...  # noqa: D102

    def reduce_box(self, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...  # noqa: D102

    def select(  # noqa: D102
        self, cand: torch.Tensor, cand_x: torch.Tensor, cand_node: torch.Tensor, need: torch.Tensor
    ) -> torch.Tensor: ...


def cum_fractions(
    num_parts: int, fractions: torch.Tensor | None = None, device: torch.device | str | None = None
) -> torch.Tensor:
    """``(P + 1,)`` float64 cumulative target shares ``[0, f0, f0 + f1, ..., 1]`` (``1 / P`` each by default).

    The one construction of the partitioners' targets (serial, parallel, and the planner's part
    sizes): a float64 cumulative sum with the last entry set to exactly 1, so every caller places
    boundary ``b`` at the same integer.
    """
    f = (
        torch.full((num_parts,), 1.0 / num_parts, dtype=torch.float64, device=device)
        if fractions is None
        else fractions.to(torch.float64)
    )
    cum = torch.zeros(num_parts + 1, dtype=torch.float64, device=f.device)
    torch.cumsum(f, 0, out=cum[1:])
    cum[-1] = 1.0
    return cum


def nearest_boundaries(prefix: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Positions ``k`` where the prefix sum is nearest each target (lower ``k`` on ties).

    ``prefix`` is the non-decreasing ``(n + 1,)`` inclusive-of-zero prefix sum (``prefix[0] = 0``).
    Returns ``(T,)`` positions in ``[0, n]``.
    """
    n = prefix.numel() - 1
    hi = torch.searchsorted(prefix, targets, side="left").clamp_(max=n)
    lo = (hi - 1).clamp_(min=0)
    take_lo = (targets - prefix[lo]) <= (prefix[hi] - targets)
    return torch.where(take_lo, lo, hi)


def monotone_cuts(bounds: torch.Tensor, num_points: int) -> torch.Tensor:
    """Part boundaries from the positions nearest each target: ``0`` first, ``num_points`` last, non-decreasing.

    ``bounds`` is the ``(P + 1,)`` long tensor of positions (:func:`nearest_boundaries` of the prefix
    weights, or the same computed over ranks); it is modified in place and its running maximum returned,
    so part ``p`` holds positions ``bounds[p]:bounds[p + 1]`` of the curve order.
    """
    bounds[0] = 0
    bounds[-1] = num_points
    return torch.cummax(bounds, 0).values


def _histogram(
    x: torch.Tensor,
    node_lo: torch.Tensor,
    node_extent: torch.Tensor,
    node_of: torch.Tensor,
    node_key: torch.Tensor,
    buckets: int,
    weights: torch.Tensor | None,
    work: torch.dtype,
    out: torch.Tensor,
) -> torch.Tensor:
    """Bucket of every point's coordinate ``x`` in its node (into ``out``), and every node's histogram.

    Buckets split ``[node_lo, node_lo + node_extent]`` evenly; the bucket is monotone in ``x``.
    ``node_key`` is ``node_of * buckets``. Returns the ``(M, B)`` histogram (int64 counts, or
    float64 weights); the caller reduces it over ranks (if sharded) and takes the cumulative sum.
    """
    num_nodes = node_lo.numel()
    scale = torch.where(node_extent > 0, buckets / node_extent, torch.zeros_like(node_extent))
    scale = torch.nan_to_num(scale, nan=0.0, posinf=0.0)  # empty nodes, or an extent that underflows
    bucket = (x.to(work) - node_lo.to(work).index_select(0, node_of)).mul_(scale.to(work).index_select(0, node_of))
    out.copy_(bucket.floor_().clamp_(0, buckets - 1))  # exact small integers: the copy truncates nothing
    return torch.bincount(node_key + out, weights=weights, minlength=num_nodes * buckets).view(num_nodes, buckets)


@dataclass(frozen=True)
class _Cloud:
    """What every level of :func:`rcb` reads: the (local) points by axis and the global counts."""

    columns: torch.Tensor  # (D, N_local): one contiguous coordinate array per axis
    weights: torch.Tensor | None
    num_points: int  # global N
    sharded: ShardedOps | None
    work: torch.dtype  # bucket arithmetic
    all_bucket: torch.Tensor  # (D, N_local) scratch: bucket of every point along every axis

    @property
    def n_local(self) -> int:
        return self.columns.shape[1]

    def reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over ranks (the identity in a serial run)."""
        return t if self.sharded is None else self.sharded.reduce_sum(t)

    def along(self, axis: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The coordinate of point ``rows[i]`` on axis ``axis[i]``."""
        return self.columns.reshape(-1).index_select(0, axis * self.n_local + rows)


def rcb(
    points: torch.Tensor,
    weights: torch.Tensor | None,
    cum_fractions: torch.Tensor,
    num_buckets: int = 1024,
    axis_rule: str = "density",
    sharded: ShardedOps | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Partition by recursive coordinate bisection.

    Parameters
    ----------
    points : Tensor
        ``(N, D)`` finite coordinates.
    weights : Tensor or None
        ``(N,)`` non-negative float64 weights; ``None`` for unit weights.
    cum_fractions : Tensor
        ``(P + 1,)`` float64 cumulative target shares, ``0`` first and ``1`` last.
    num_buckets : int
        Histogram resolution per node. With ``axis_rule="longest"`` the result does not depend
        on it; with ``"density"`` it sets the window that measures density.
    axis_rule : {"density", "longest"}
        How the cut axis is chosen (see the module docstring).
    sharded : ShardedOps or None
        ``None``: ``points`` are all the points, in their original order. Otherwise ``points`` are
        this rank's chunk of a sharded cloud and ``sharded`` supplies the global point count and
        weight, the reductions of boxes and histograms over ranks, and the exact selection inside
        median buckets (:mod:`meshshard.ops.parallel_partition`); every decision then sees the
        same global numbers as the serial run, so ``owner`` (of the local points), ``regions`` and
        ``boxes`` equal the serial ones.

    Returns
    -------
    owner : LongTensor
        ``(N,)`` part of each point.
    regions : Tensor
        ``(P, 2, D)`` leaf cells of the cut tree (``+-inf`` at the outer faces).
    boxes : Tensor
        ``(P, 2, D)`` bounds of each part's points (``[+inf, -inf]`` when empty).
    """
    n_local, dim = points.shape
    num_parts = cum_fractions.numel() - 1
    device, dtype = points.device, points.dtype
    long = dict(dtype=torch.long, device=device)
    cloud = _Cloud(
        columns=points.t().contiguous(),
        weights=weights,
        num_points=n_local if sharded is None else sharded.num_points,
        sharded=sharded,
        work=torch.promote_types(dtype, torch.float32),  # half types cannot count to 1024
        all_bucket=torch.empty((dim, n_local), **long),
    )
    if sharded is not None:
        total = sharded.total_weight
    else:
        total = float(n_local) if weights is None else weights.sum()
    targets = total * cum_fractions

    node_of = torch.zeros(n_local, **long)
    p0 = torch.zeros(1, **long)
    p1 = torch.full((1,), num_parts, **long)
    lo = torch.full((1, dim), -torch.inf, dtype=dtype, device=device)
    hi = torch.full((1, dim), torch.inf, dtype=dtype, device=device)
    pending = None  # (left child, right child, axis) of the previous level's cuts

    while True:
        num_nodes = p0.numel()
        box_lo, box_hi = _node_boxes(cloud, node_of, num_nodes)
        if pending is not None:
            _place_cut_planes(pending, box_lo, box_hi, lo, hi)
        split = (p1 - p0) >= 2
        if not bool(split.any()):
            break
        buckets = max(1, min(num_buckets, (4 * cloud.num_points) // num_nodes))
        mid = p0 + (p1 - p0 + 1) // 2
        if axis_rule == "longest":
            axis, hist, bucket = _longest_axis(cloud, box_lo, box_hi, node_of, buckets)
        else:
            axis, hist, bucket = _lowest_density_axis(cloud, box_lo, box_hi, node_of, buckets, targets, mid)
        goes_left = _median_split(cloud, hist, bucket, axis, node_of, split, targets, mid)
        node_of, p0, p1, lo, hi, pending = _renumber(node_of, goes_left, split, axis, p0, p1, mid, lo, hi)

    owner = p0.index_select(0, node_of)
    regions = torch.empty((num_parts, 2, dim), dtype=dtype, device=device)
    regions[p0, 0] = lo
    regions[p0, 1] = hi
    boxes = torch.empty((num_parts, 2, dim), dtype=dtype, device=device)
    boxes[p0, 0] = box_lo.t()
    boxes[p0, 1] = box_hi.t()
    return owner, regions, boxes


def _node_boxes(cloud: _Cloud, node_of: torch.Tensor, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(D, M)`` bounding box of each node's points (over all ranks); an empty node gets ``[+inf, -inf]``."""
    columns = cloud.columns
    dim = columns.shape[0]
    box_lo = torch.full((dim, num_nodes), torch.inf, dtype=columns.dtype, device=columns.device)
    box_hi = torch.full((dim, num_nodes), -torch.inf, dtype=columns.dtype, device=columns.device)
    for a in range(dim):
        box_lo[a].scatter_reduce_(0, node_of, columns[a], reduce="amin")
        box_hi[a].scatter_reduce_(0, node_of, columns[a], reduce="amax")
    if cloud.sharded is not None:
        box_lo, box_hi = cloud.sharded.reduce_box(box_lo, box_hi)
    return box_lo, box_hi


def _place_cut_planes(
    pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    box_lo: torch.Tensor,
    box_hi: torch.Tensor,
    lo: torch.Tensor,
    hi: torch.Tensor,
) -> None:
    """The previous level's cut planes (into ``lo``/``hi``), halfway between the two children's points."""
    left, right, cut_axis = pending
    left_max = box_hi[cut_axis, left]
    right_min = box_lo[cut_axis, right]
    cell_lo = lo[left, cut_axis]
    cell_hi = hi[right, cut_axis]
    has_left = torch.isfinite(left_max)
    has_right = torch.isfinite(right_min)
    fallback = torch.zeros_like(cell_lo).clamp(cell_lo, cell_hi)  # no points at all
    plane = torch.where(
        has_left & has_right,
        left_max + (right_min - left_max) / 2,
        torch.where(has_left, left_max, torch.where(has_right, right_min, fallback)),
    )
    hi[left, cut_axis] = plane
    lo[right, cut_axis] = plane


def _longest_axis(
    cloud: _Cloud, box_lo: torch.Tensor, box_hi: torch.Tensor, node_of: torch.Tensor, buckets: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``axis_rule="longest"``: each node's longest extent (first on ties), its cumulative histogram, buckets."""
    extent = box_hi - box_lo  # (D, M); -inf for empty nodes
    axis = extent.argmax(dim=0)  # first maximum on ties
    x = cloud.along(axis.index_select(0, node_of), torch.arange(cloud.n_local, dtype=torch.long, device=node_of.device))
    lo_axis, extent_axis = box_lo.gather(0, axis[None])[0], extent.gather(0, axis[None])[0]
    bucket = cloud.all_bucket[0]
    hist = _histogram(x, lo_axis, extent_axis, node_of, node_of * buckets, buckets, cloud.weights, cloud.work, bucket)
    return axis, cloud.reduce(hist).to(torch.float64).cumsum(dim=1), bucket


def _lowest_density_axis(
    cloud: _Cloud,
    box_lo: torch.Tensor,
    box_hi: torch.Tensor,
    node_of: torch.Tensor,
    buckets: int,
    targets: torch.Tensor,
    mid: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``axis_rule="density"``: the axis whose weighted-median plane crosses the least weight per thickness.

    Histograms every axis; the ghost cost of cutting at an axis's weighted median is the weight per
    unit thickness in a window of +-B/64 buckets around the plane. Returns the chosen axis per node,
    its ``(M, B)`` cumulative histogram and every point's bucket on it.
    """
    dim, num_nodes = box_lo.shape
    extent = box_hi - box_lo  # (D, M); -inf for empty nodes
    node_key = node_of * buckets
    rows = [
        _histogram(
            cloud.columns[a], box_lo[a], extent[a], node_of, node_key, buckets, cloud.weights, cloud.work,
            cloud.all_bucket[a],
        )
        for a in range(dim)
    ]  # fmt: skip
    all_hist = cloud.reduce(torch.stack(rows)).to(torch.float64).cumsum(dim=2)  # (D, M, B)
    node_weight = all_hist[0, :, -1]
    need = targets.index_select(0, mid) - (torch.cumsum(node_weight, 0) - node_weight)
    median = torch.searchsorted(all_hist, need.expand(dim, -1)[..., None].contiguous(), side="left")[..., 0]
    median = median.clamp_(max=buckets - 1)
    # The plane lies inside the median bucket, or, if that bucket is taken whole, halfway to
    # the next non-empty bucket (so a gap between clusters shows as an empty window).
    taken = all_hist.gather(2, median[..., None])
    following = torch.searchsorted(all_hist, taken, side="right")[..., 0].clamp_(max=buckets - 1)
    plane = torch.where(taken[..., 0] <= need, (median + following) // 2, median)
    half = max(1, buckets // 64)
    top = (plane + half).clamp(max=buckets - 1)
    bottom = plane - half - 1
    inside = all_hist.gather(2, top[..., None])[..., 0] - torch.where(
        bottom >= 0, all_hist.gather(2, bottom.clamp(min=0)[..., None])[..., 0], 0.0
    )
    width = (top - bottom).to(torch.float64) * extent.to(torch.float64) / buckets
    density = torch.where(width > 0, inside / width, torch.inf)
    # Lowest density; among equals (e.g. gaps on several axes) the longest extent, then lowest axis.
    lowest = density == density.min(dim=0).values
    axis = torch.where(lowest, extent, -torch.inf).argmax(dim=0)
    hist = all_hist.gather(0, axis[None, :, None].expand(1, num_nodes, buckets))[0]
    bucket = cloud.all_bucket.gather(0, axis.index_select(0, node_of)[None])[0]
    return axis, hist, bucket


def _median_split(
    cloud: _Cloud,
    hist: torch.Tensor,
    bucket: torch.Tensor,
    axis: torch.Tensor,
    node_of: torch.Tensor,
    split: torch.Tensor,
    targets: torch.Tensor,
    mid: torch.Tensor,
) -> torch.Tensor:
    """Which points go to the left child: those below the median bucket, plus the median bucket's exact share."""
    num_nodes, buckets = hist.shape
    # Weight before each node in partition order, and the weight its left child should hold.
    node_weight = hist[:, -1]
    node_base = torch.cumsum(node_weight, 0) - node_weight
    need = targets.index_select(0, mid) - node_base
    median_bucket = torch.searchsorted(hist, need[:, None], side="left")[:, 0].clamp_(max=buckets - 1)
    below = torch.where(median_bucket > 0, hist.gather(1, (median_bucket - 1).clamp(min=0)[:, None])[:, 0], 0.0)
    need = need - below  # weight still to take from the median bucket
    # Leaves keep all their points "left": no bucket reaches `buckets`.
    median_bucket = torch.where(split, median_bucket, buckets)
    point_median = median_bucket.index_select(0, node_of)
    goes_left = bucket < point_median

    cand = (bucket == point_median).nonzero()[:, 0]
    cand_x = cloud.along(axis.index_select(0, node_of.index_select(0, cand)), cand)
    if cloud.sharded is not None:
        # The median buckets' points are spread over the ranks: select them exactly there.
        goes_left.index_fill_(0, cloud.sharded.select(cand, cand_x, node_of.index_select(0, cand), need), True)
    else:
        _take_left(cand, cand_x, node_of, need, cloud.weights, num_nodes, goes_left)
    return goes_left


def _renumber(
    node_of: torch.Tensor,
    goes_left: torch.Tensor,
    split: torch.Tensor,
    axis: torch.Tensor,
    p0: torch.Tensor,
    p1: torch.Tensor,
    mid: torch.Tensor,
    lo: torch.Tensor,
    hi: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """The next level's nodes: children take their parent's place, so nodes stay ordered by their first part.

    Returns ``node_of, p0, p1, lo, hi, pending`` (``pending``: the new cuts' left children, right
    children and axes, whose planes the next level places).
    """
    step = 1 + split.long()
    first_child = torch.cumsum(step, 0) - step
    node_of = first_child.index_select(0, node_of).add_(goes_left.logical_not())
    keep = torch.stack([torch.ones_like(split), split], dim=1).reshape(-1)
    p1_new = torch.stack([torch.where(split, mid, p1), p1], 1).reshape(-1)[keep]
    p0 = torch.stack([p0, mid], 1).reshape(-1)[keep]
    lo = lo.repeat_interleave(step, dim=0)
    hi = hi.repeat_interleave(step, dim=0)
    pending = (first_child[split], first_child[split] + 1, axis[split])
    return node_of, p0, p1_new, lo, hi, pending


def _take_left(
    cand: torch.Tensor,
    cand_x: torch.Tensor,
    node_of: torch.Tensor,
    need: torch.Tensor,
    weights: torch.Tensor | None,
    num_nodes: int,
    goes_left: torch.Tensor,
) -> None:
    """Send left the prefix of each node's median-bucket points whose weight is nearest ``need``.

    The points ``cand`` (with coordinates ``cand_x`` on the cut axis) are ordered by (node,
    coordinate, original index); node ``m`` sends its first ``j`` left, ``j`` the count whose
    prefix weight is nearest ``need[m]`` (fewer on ties, none if ``need[m] <= 0``).
    """
    device = cand.device
    long = dict(dtype=torch.long, device=device)
    # Sort the median bucket's points by (node, coordinate, original index).
    cand = cand.index_select(0, torch.sort(cand_x, stable=True).indices)
    cand = cand.index_select(0, torch.sort(node_of.index_select(0, cand), stable=True).indices)
    num_cand = cand.numel()
    cand_node = node_of.index_select(0, cand)
    cand_count = torch.bincount(cand_node, minlength=num_nodes)
    cand_start = torch.cumsum(cand_count, 0) - cand_count
    cand_weight = (
        torch.ones(num_cand, dtype=torch.float64, device=device) if weights is None else weights.index_select(0, cand)
    )
    running = torch.cat([torch.zeros(1, dtype=torch.float64, device=device), torch.cumsum(cand_weight, 0)])
    # taken[i]: weight of the candidates of i's node up to and including i.
    taken = running[1:] - running.index_select(0, cand_start).index_select(0, cand_node)

    # Number j of candidates sent left: the prefix weight nearest `need` (fewer on ties).
    short = (taken < need.index_select(0, cand_node)).to(torch.long)
    j_hi = torch.zeros(num_nodes, **long).index_add_(0, cand_node, short)
    j_hi = torch.where(need > 0, torch.minimum(j_hi + 1, cand_count), 0)
    j_lo = (j_hi - 1).clamp(min=0)
    prefix = running.index_select(0, cand_start + j_hi) - running.index_select(0, cand_start)
    prefix_lo = running.index_select(0, cand_start + j_lo) - running.index_select(0, cand_start)
    take = torch.where(need - prefix_lo <= prefix - need, j_lo, j_hi)
    rank = torch.arange(num_cand, **long) - cand_start.index_select(0, cand_node)
    goes_left.index_fill_(0, cand[rank < take.index_select(0, cand_node)], True)
