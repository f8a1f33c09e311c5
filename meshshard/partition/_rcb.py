r"""Recursive coordinate bisection (a k-d tree), one tree level at a time for all nodes at once.

Every axis is sorted once. Each of the ``D`` sorted lists is kept grouped by tree node (every node
a contiguous segment, sorted by that axis inside the segment), so at each level:

* a node's bounding box is read off the first and last entry of its segment in each list;
* its cut axis is the longest extent (lowest axis on ties); the list of that axis gives the node's
  points in cut order, and a single global prefix sum of weights over these segments locates
  every node's weighted median with one ``searchsorted``;
* the children are formed by a stable partition of every list inside its segment (prefix sums,
  no sort), which keeps every list sorted inside the new, smaller segments.

Cost: ``D`` sorts, then ``O(N D)`` vectorised work per level, ``ceil(log2 P)`` levels.

Cut placement: part boundary ``b`` sits where the cumulative weight, in partition order, is
nearest to ``W * (f_0 + ... + f_{b-1})``. These global targets are the proportional targets of
the tree (a node holding parts ``[p0, p1)`` sends parts ``[p0, p0 + ceil((p1 - p0) / 2))`` left,
aiming at their share of the node's target weight) but rounding does not compound down the tree:
every unweighted part is within one point of its target, every weighted part within the largest
point weight.
"""

from __future__ import annotations

import torch

__all__ = ["nearest_boundaries", "rcb"]


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


def rcb(
    points: torch.Tensor, weights: torch.Tensor | None, cum_fractions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Partition by recursive coordinate bisection.

    Parameters
    ----------
    points : Tensor
        ``(N, D)`` finite coordinates.
    weights : Tensor or None
        ``(N,)`` non-negative float64 weights; ``None`` for unit weights.
    cum_fractions : Tensor
        ``(P + 1,)`` float64 cumulative target shares, ``0`` first and ``1`` last.

    Returns
    -------
    owner : LongTensor
        ``(N,)`` part of each point.
    regions : Tensor
        ``(P, 2, D)`` leaf cells of the cut tree (``+-inf`` at the outer faces).
    """
    num_points, dim = points.shape
    num_parts = cum_fractions.numel() - 1
    device = points.device
    long = dict(dtype=torch.long, device=device)
    total = float(num_points) if weights is None else weights.sum()
    targets = total * cum_fractions
    axes = torch.arange(dim, **long)

    # (D, N): point ids sorted by each axis; ties keep the original order (stable sort).
    lists = torch.stack([torch.sort(points[:, a], stable=True).indices for a in range(dim)])

    # Tree nodes, ordered by their first part: segment [start, end), parts [p0, p1), cell [lo, hi].
    start = torch.zeros(1, **long)
    end = torch.full((1,), num_points, **long)
    p0 = torch.zeros(1, **long)
    p1 = torch.full((1,), num_parts, **long)
    lo = torch.full((1, dim), -torch.inf, dtype=points.dtype, device=device)
    hi = torch.full((1, dim), torch.inf, dtype=points.dtype, device=device)
    position = torch.arange(num_points, **long)

    unit_prefix = (
        None if weights is not None else torch.arange(num_points + 1, dtype=torch.float64, device=device)
    )
    row_offset = (torch.arange(dim, **long) * num_points)[:, None]

    while True:
        split = (p1 - p0) >= 2
        if not bool(split.any()):
            break
        num_nodes = start.numel()
        counts = end - start
        nonempty = counts > 0
        flat_lists = lists.reshape(-1)

        # Bounding box of each node from the ends of its segment in every sorted list.
        if num_points > 0:
            first = flat_lists.index_select(0, (row_offset + start.clamp(max=num_points - 1)).reshape(-1))
            last = flat_lists.index_select(0, (row_offset + (end - 1).clamp(min=0)).reshape(-1))
            flat_points = points.t().reshape(-1)  # (D * N,), axis-major
            extent = flat_points.index_select(0, (row_offset + last.view(dim, -1)).reshape(-1)) - (
                flat_points.index_select(0, (row_offset + first.view(dim, -1)).reshape(-1))
            )
            extent = torch.where(nonempty[None, :], extent.view(dim, -1), torch.zeros((), dtype=points.dtype, device=device))
        else:
            extent = torch.zeros((dim, num_nodes), dtype=points.dtype, device=device)
        axis = extent.argmax(dim=0)  # (M,), first maximum on ties

        # The points of every node in the order of its cut axis.
        seg = torch.repeat_interleave(torch.arange(num_nodes, **long), counts, output_size=num_points)
        sel = flat_lists.index_select(0, axis.index_select(0, seg) * num_points + position)
        if unit_prefix is None:
            prefix = torch.zeros(num_points + 1, dtype=torch.float64, device=device)
            torch.cumsum(weights.index_select(0, sel), 0, out=prefix[1:])
        else:
            prefix = unit_prefix

        mid = p0 + (p1 - p0 + 1) // 2
        cut = nearest_boundaries(prefix, targets.index_select(0, mid))
        cut = torch.where(split, torch.minimum(torch.maximum(cut, start), end), end)

        # Cut plane: halfway between the last point sent left and the first sent right.
        node_axis_lo = lo.gather(1, axis[:, None])[:, 0]
        node_axis_hi = hi.gather(1, axis[:, None])[:, 0]
        if num_points > 0:
            left_x = points[sel[(cut - 1).clamp(min=0, max=num_points - 1)], axis]
            right_x = points[sel[cut.clamp(max=num_points - 1)], axis]
        else:
            left_x = right_x = torch.zeros(num_nodes, dtype=points.dtype, device=device)
        has_left = cut > start
        has_right = cut < end
        empty_plane = torch.zeros_like(node_axis_lo).clamp(node_axis_lo, node_axis_hi)
        plane = torch.where(
            has_left & has_right,
            left_x + (right_x - left_x) / 2,
            torch.where(has_left, left_x, torch.where(has_right, right_x, empty_plane)),
        )

        # Stable partition of every list inside its node segment (left child first): a point's new
        # place is its segment start plus the number of same-side points before it in the segment.
        seg_start = start.index_select(0, seg)
        seg_cut = cut.index_select(0, seg)
        goes_left = torch.empty(num_points, dtype=torch.bool, device=device)
        goes_left.scatter_(0, sel, position < seg_cut)
        is_left = goes_left.index_select(0, flat_lists)  # (D * N,)
        left_before = torch.cumsum(is_left, 0) - is_left.long()  # exclusive, along the flat lists
        left_before = left_before.view(dim, -1)
        left_before = left_before - left_before.gather(1, seg_start.expand(dim, -1))
        new_pos = torch.where(
            is_left.view(dim, -1), seg_start + left_before, (seg_cut - seg_start + position) - left_before
        )
        lists = torch.empty_like(lists).scatter_(1, new_pos, lists)

        # Children replace split nodes in place, so nodes stay ordered by their first part.
        left_hi = hi.clone()
        left_hi.scatter_(1, axis[:, None], plane[:, None])
        right_lo = lo.clone()
        right_lo.scatter_(1, axis[:, None], plane[:, None])
        keep = torch.stack([torch.ones_like(split), split], dim=1).reshape(-1)
        start = torch.stack([start, cut], 1).reshape(-1)[keep]
        end = torch.stack([torch.where(split, cut, end), end], 1).reshape(-1)[keep]
        p1_new = torch.stack([torch.where(split, mid, p1), p1], 1).reshape(-1)[keep]
        p0 = torch.stack([p0, mid], 1).reshape(-1)[keep]
        p1 = p1_new
        lo = torch.stack([lo, right_lo], 1).reshape(-1, dim)[keep]
        hi = torch.stack([left_hi, hi], 1).reshape(-1, dim)[keep]

    owner = torch.empty(num_points, **long)
    owner[lists[0]] = torch.repeat_interleave(p0, end - start, output_size=num_points)
    regions = torch.empty((num_parts, 2, dim), dtype=points.dtype, device=device)
    regions[p0, 0] = lo
    regions[p0, 1] = hi
    return owner, regions
