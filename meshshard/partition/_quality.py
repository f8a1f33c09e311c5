"""Partition quality: load balance and exact ghost counts (points within ``radius`` of another part)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .._checks import check_positive_int, check_radius
from ._ghosts import ghost_sets
from ._partition import Partition
from ._validate import as_points, check_weights

__all__ = ["ghost_counts", "neighbor_radius", "quality", "surface_to_volume_estimate"]


def surface_to_volume_estimate(points: torch.Tensor | np.ndarray, num_parts: int, radius: float) -> float:
    r"""Ghost fraction expected from cutting a uniformly filled box into ``P`` equal cubes.

    From ``DESIGN.md``: total ghosts ``~ 6 (P^{1/3} - 1) * 0.85 r * N`` per unit volume, i.e.
    ``3 (P^{1/3} - 1)`` cut planes, each seen from both sides through a slab of width ``~0.85 r``.
    The box is the bounding box of ``points``; axes with zero extent are dropped (a flat cloud uses
    the 2-D form ``4 (P^{1/2} - 1) * 0.85 r / sqrt(area)``). A reference for volume-filling clouds;
    on a curved surface in 3-D it is not meaningful.

    Returns the estimated ``total ghosts / N`` (``0.0`` for ``P = 1`` or a single point).
    """
    pts = as_points(points).to(torch.float64)
    num_parts = check_positive_int(num_parts, "num_parts")
    radius = check_radius(radius)
    if pts.shape[0] < 2 or num_parts <= 1:
        return 0.0
    extent = (pts.amax(dim=0) - pts.amin(dim=0)).tolist()
    extent = [e for e in extent if e > 0]
    if not extent:
        return 0.0
    dim = len(extent)
    size = math.prod(extent) ** (1.0 / dim)
    return 2 * dim * (num_parts ** (1.0 / dim) - 1) * 0.85 * radius / size


def neighbor_radius(points: torch.Tensor | np.ndarray, num_neighbors: int = 32, num_samples: int = 2048) -> float:
    """Radius whose closed ball around a typical point holds about ``num_neighbors`` other points.

    The median, over ``num_samples`` evenly spaced points, of the distance to their
    ``num_neighbors``-th nearest neighbour (scipy ``cKDTree`` on all points; CPU).
    """
    from scipy.spatial import cKDTree

    pts = as_points(points).detach().cpu().to(torch.float64).numpy()
    num_neighbors = check_positive_int(num_neighbors, "num_neighbors")
    num_samples = check_positive_int(num_samples, "num_samples")
    if pts.shape[0] <= num_neighbors:
        raise ValueError(f"points must hold more than num_neighbors = {num_neighbors} points (got {pts.shape[0]})")
    tree = cKDTree(pts)
    sample = np.unique(np.linspace(0, pts.shape[0] - 1, min(num_samples, pts.shape[0])).astype(np.int64))
    dist, _ = tree.query(pts[sample], k=num_neighbors + 1)
    return float(np.median(dist[:, -1]))


def quality(
    points: torch.Tensor | np.ndarray | Any,
    part: Partition,
    radius: float | None = None,
    weights: torch.Tensor | np.ndarray | None = None,
) -> dict[str, Any]:
    r"""Measure the balance and halo size of a partition.

    Ghosts of part ``r`` for ``radius``: the points owned by other parts that lie within
    ``radius`` (closed ball, Euclidean) of at least one point of ``r``, i.e. the halo rank ``r``
    must receive. Counted exactly, on CPU, by :func:`~._ghosts.ghost_sets` (the ghost sets that
    :class:`~meshshard.halo.HaloPlan` builds and :func:`meshshard.io.write_partitions` writes).

    Parameters
    ----------
    points : Tensor, ndarray or Data
        ``(N, D)`` coordinates the partition was made from (original order).
    part : Partition
        Partition of these points.
    radius : float, optional
        Ghost radius; without it the ghost entries are ``None``.
    weights : Tensor or ndarray, optional
        ``(N,)`` per-point load; point counts by default.

    Returns
    -------
    dict
        ``"num_parts"``, ``"num_points"``, ``"sizes"`` (list of int), ``"load"`` (float64
        tensor ``(P,)``), ``"imbalance"`` (float: ``max_r load_r / target_r`` with
        ``target_r = W * f_r``, ``f`` the partition's ``fractions`` or ``1 / P``; 1.0 is perfect;
        ``inf`` if a part with a zero target holds load), ``"radius"``, ``"ghosts"`` (LongTensor
        ``(P,)``), ``"ghost_fraction"`` (total ghosts / N), ``"max_ghost_fraction"``
        (``max_r ghosts_r / sizes_r`` over non-empty parts: the worst halo-to-owned ratio),
        ``"neighbor_parts"`` (LongTensor ``(P,)``: parts each part receives ghosts from),
        ``"max_neighbor_parts"``, ``"surface_to_volume_estimate"`` (the ghost fraction
        :func:`surface_to_volume_estimate` predicts, for comparison).

    **Shapes**: ``points`` ``(N_global, D)``; per-part entries ``(P,)``.

    **Communication**: none; a serial diagnostic on CPU (copies ``points`` to host memory).

    Examples
    --------
    >>> import torch
    >>> from meshshard.partition import partition
    >>> pts = torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [3.0, 0.0]])
    >>> q = quality(pts, partition(pts, 2), radius=1.0)
    >>> q["ghosts"].tolist(), q["ghost_fraction"], q["imbalance"]
    ([1, 1], 0.5, 1.0)
    """
    if not isinstance(part, Partition):
        raise TypeError(f"part must be a Partition (got {type(part).__name__})")
    pts = as_points(points)
    if pts.shape[0] != part.num_points:
        raise ValueError(f"points must have part.num_points = {part.num_points} rows (got {pts.shape[0]})")
    num_parts, num_points = part.num_parts, part.num_points
    owner = part.owner.cpu()
    w = (
        torch.ones(num_points, dtype=torch.float64)
        if weights is None
        else check_weights(weights, num_points, torch.device("cpu"))
    )
    load = torch.zeros(num_parts, dtype=torch.float64).index_add_(0, owner, w)
    fractions = part.params.get("fractions")
    share = (
        torch.as_tensor(fractions, dtype=torch.float64)
        if fractions is not None and len(fractions) == num_parts
        else torch.full((num_parts,), 1.0 / num_parts, dtype=torch.float64)
    )
    target = float(w.sum()) * share
    ratio = torch.where(target > 0, load / target.clamp(min=1e-300), torch.where(load > 0, torch.inf, 0.0))
    result: dict[str, Any] = {
        "num_parts": num_parts,
        "num_points": num_points,
        "sizes": part.sizes.tolist(),
        "load": load,
        "imbalance": float(ratio.max()) if num_points > 0 else 1.0,
        "radius": None,
        "ghosts": None,
        "ghost_fraction": None,
        "max_ghost_fraction": None,
        "neighbor_parts": None,
        "max_neighbor_parts": None,
        "surface_to_volume_estimate": None,
    }
    if radius is None:
        return result
    radius = check_radius(radius)
    ghosts, neighbors, _ = ghost_counts(pts, part, radius)
    sizes = part.sizes.cpu()
    nonempty = sizes > 0
    result.update(
        radius=radius,
        ghosts=ghosts,
        ghost_fraction=float(ghosts.sum()) / num_points if num_points else 0.0,
        max_ghost_fraction=float((ghosts[nonempty] / sizes[nonempty]).max()) if num_points else 0.0,
        neighbor_parts=neighbors,
        max_neighbor_parts=int(neighbors.max()),
        surface_to_volume_estimate=surface_to_volume_estimate(pts, num_parts, radius),
    )
    return result


def ghost_counts(
    points: torch.Tensor | np.ndarray, part: Partition, radius: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per part: its exact ghost count, the parts they come from, and the points it sends to others.

    From :func:`~._ghosts.ghost_sets`; three LongTensors ``(P,)``. A point that is a ghost of two
    parts is sent twice.
    """
    radius = check_radius(radius)
    points = as_points(points)
    if not isinstance(part, Partition) or part.owner.numel() != points.shape[0]:
        raise ValueError(f"part must be a Partition of the {points.shape[0]} points (got {type(part).__name__})")
    owner = part.owner.cpu()
    sets = ghost_sets(points, owner, part.num_parts, radius)
    ghosts = torch.tensor([len(s) for s in sets], dtype=torch.long)
    neighbors = torch.tensor([owner[s].unique().numel() for s in sets], dtype=torch.long)
    sent = torch.bincount(owner[torch.cat(sets)], minlength=part.num_parts)
    return ghosts, neighbors, sent
