"""``partition()``: geometric partitioning of a point cloud into ``P`` contiguous parts."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .._checks import check_positive_int
from ._partition import Partition
from ._rcb import cum_fractions, monotone_cuts, nearest_boundaries, rcb
from ._sfc import DEFAULT_BITS, hilbert_keys, morton_keys, quantize
from ._validate import as_points, check_fractions, check_method, check_weights, quantize_weights

__all__ = ["part_boxes", "partition"]


def part_boxes(points: torch.Tensor, owner: torch.Tensor, num_parts: int) -> torch.Tensor:
    """Axis-aligned bounds of each part's points; an empty part gets the empty box ``[+inf, -inf]``.

    **Shapes**: ``points`` ``(N, D)``, ``owner`` ``(N,)`` -> ``(P, 2, D)``.
    """
    dim = points.shape[1]
    index = owner[:, None].expand(-1, dim)
    lo = torch.full((num_parts, dim), torch.inf, dtype=points.dtype, device=points.device)
    hi = torch.full((num_parts, dim), -torch.inf, dtype=points.dtype, device=points.device)
    lo.scatter_reduce_(0, index, points, reduce="amin")
    hi.scatter_reduce_(0, index, points, reduce="amax")
    return torch.stack([lo, hi], dim=1)


def _curve_owner(
    points: torch.Tensor, weights: torch.Tensor, cum_fractions: torch.Tensor, method: str, bits: int
) -> torch.Tensor:
    """Part of each point of a Morton/Hilbert partition (serial; the sharded run is ``repartition``'s)."""
    grid = quantize(points, bits)
    keys = morton_keys(grid) if method == "morton" else hilbert_keys(grid, bits)
    order = torch.sort(keys, stable=True).indices  # ties (duplicate cells) keep the original order
    num_points = points.shape[0]
    prefix = torch.zeros(num_points + 1, dtype=torch.float64, device=points.device)
    torch.cumsum(weights[order], 0, out=prefix[1:])
    bounds = monotone_cuts(nearest_boundaries(prefix, prefix[-1] * cum_fractions), num_points)
    num_parts = cum_fractions.numel() - 1
    owner = torch.empty(num_points, dtype=torch.long, device=points.device)
    owner[order] = torch.repeat_interleave(
        torch.arange(num_parts, device=points.device), bounds.diff(), output_size=num_points
    )
    return owner


def partition(
    points: torch.Tensor | np.ndarray | Any,
    num_parts: int,
    method: str = "rcb",
    weights: torch.Tensor | np.ndarray | None = None,
    fractions: torch.Tensor | np.ndarray | list[float] | None = None,
    *,
    axis_rule: str = "density",
) -> Partition:
    r"""Split a point cloud into ``num_parts`` spatially compact parts.

    Methods
    -------
    ``"rcb"`` (default)
        Recursive coordinate bisection (a k-d tree): cut each node at the weighted median of one
        axis, sending ``ceil(P_node / 2)`` parts left and ``floor(P_node / 2)`` right, so any
        ``num_parts`` works. Parts are boxes of the cut tree, kept in :attr:`Partition.regions`.
        The axis (``axis_rule``): ``"density"`` (default) takes the axis whose median plane has
        the least weight per unit thickness around it (the first-order ghost cost of the cut;
        ties, e.g. gaps on several axes, go to the longest extent); ``"longest"`` is classic RCB,
        the longest extent of the node's points. Both agree on uniform boxes; on graded clouds
        (dense near a body) ``"density"`` avoids slicing along the dense layer (about 20% fewer
        ghosts at ``P = 64``, see ``benchmarks/bench_partition.py``) for ~1.5x the time.
    ``"morton"``, ``"hilbert"``
        Quantise coordinates (21 bits per axis in 3-D, 31 in 2-D, one cubic grid over the bounding
        box), sort by curve key, cut the curve into contiguous chunks of equal weight.

    Balance: part ``r`` targets the weight share ``fractions[r]`` (``1 / P`` by default). Part
    boundaries are placed where the cumulative weight is nearest the cumulative target, so
    unweighted parts are within one point of ``N * fractions[r]`` and weighted parts within the
    largest single weight of their target.

    Weights are first quantised to integer multiples of one power-of-two quantum (below
    ``2**53 / N``), so every cumulative weight is exact whatever the order of summation; integer
    weights are unchanged up to scale. This is what lets :func:`repartition` reproduce the
    partition bit for bit on sharded data.

    Order inside a part: points keep their original relative order (for every method), as in
    :meth:`Partition.from_owner`. The result is deterministic: the same input gives the same
    partition bit for bit (ties in coordinates or keys are broken by original index).

    Parameters
    ----------
    points : Tensor, ndarray or Data
        ``(N, 3)`` or ``(N, 2)`` coordinates, any float dtype, finite; a
        ``torch_geometric.data.Data`` uses its ``pos``. For meshes see :func:`partition_mesh`.
    num_parts : int
        ``P >= 1``. ``N < P`` is allowed: surplus parts are empty (size 0).
    method : {"rcb", "morton", "hilbert"}
        Partitioner.
    weights : Tensor or ndarray, optional
        ``(N,)`` non-negative per-point cost (e.g. neighbour counts); parts balance total weight
        instead of point count.
    fractions : sequence of float, optional
        ``(P,)`` non-negative target shares summing to 1 (tolerance ``1e-6``), for deliberately
        uneven parts (e.g. heterogeneous devices). Zero shares give empty parts.
    axis_rule : {"density", "longest"}
        How ``rcb`` picks its cut axis (ignored by the curve methods).

    Returns
    -------
    Partition
        Index tensors on ``points.device``; ``boxes`` and ``regions`` in the dtype of ``points``.

    Raises
    ------
    TypeError
        ``points``, ``num_parts``, ``method``, ``weights`` or ``fractions`` of the wrong type.
    ValueError
        Wrong shapes or lengths, NaN/Inf coordinates, ``num_parts < 1``, negative or all-zero
        weights, fractions that are negative or do not sum to 1, an unknown method.

    **Shapes**: ``points`` ``(N_global, D)``, ``weights`` ``(N_global,)``, ``fractions`` ``(P,)``.

    **Communication**: none. It runs in one process on the global coordinates (any device);
    because the result is deterministic, every rank may compute it from the same input and get
    the same partition, or one rank computes it and ``save``/``load`` ships it.

    Examples
    --------
    >>> import torch
    >>> pts = torch.tensor([[0.0, 0.0], [3.0, 0.0], [1.0, 0.0], [2.0, 0.0]])
    >>> part = partition(pts, 2)
    >>> part.owner.tolist(), part.sizes.tolist(), part.regions[0, 1].tolist()
    ([0, 1, 0, 1], [2, 2], [1.5, inf])
    """
    if _is_vtk_dataset(points):
        raise TypeError(
            "points is a pyvista/VTK dataset; use meshshard.partition.partition_mesh(mesh, num_parts) "
            "to partition its cells (or pass mesh.points to partition the points)"
        )
    pts = as_points(points).detach()
    num_parts = check_positive_int(num_parts, "num_parts")
    method = check_method(method)
    num_points, dim = pts.shape
    device = pts.device
    w = (
        torch.ones(num_points, dtype=torch.float64, device=device)
        if weights is None
        else quantize_weights(check_weights(weights, num_points, device), num_points)
    )
    f = None if fractions is None else check_fractions(fractions, num_parts, device)
    cum = cum_fractions(num_parts, f, device)

    if axis_rule not in ("density", "longest"):
        raise ValueError(f"axis_rule must be 'density' or 'longest' (got {axis_rule!r})")
    params: dict[str, Any] = {
        "dim": dim,
        "weighted": weights is not None,
        "fractions": None if fractions is None else f.tolist(),
    }
    if method == "rcb":
        params["axis_rule"] = axis_rule
        owner, regions, boxes = rcb(pts, None if weights is None else w, cum, axis_rule=axis_rule)
    else:
        bits = DEFAULT_BITS[dim]
        params["bits"] = bits
        owner = _curve_owner(pts, w, cum, method, bits)
        boxes = part_boxes(pts, owner, num_parts)
        regions = boxes
    return Partition.from_owner(owner, num_parts, method=method, params=params, boxes=boxes, regions=regions)


def _is_vtk_dataset(obj: Any) -> bool:
    module = type(obj).__module__ or ""
    return module.startswith(("pyvista", "vtkmodules", "vtk"))
