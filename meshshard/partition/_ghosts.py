"""Exact ghost sets: which points of other parts lie within a radius of a part.

The one serial implementation, used by :func:`~meshshard.partition.quality` (ghost counts), by
:func:`meshshard.halo.simulate_halo` (the halo plans of ``P`` ranks in one process) and by
:func:`meshshard.io.write_partitions` (the ghost points and cells of every piece). The ball is
closed and decided with the library's one distance formula (:func:`._distance.sq_dist`,
``sq_dist(p, q) <= radius * radius``), exactly as :class:`meshshard.halo.HaloPlan` and the neighbour
kernels decide it, so a pair on the boundary is a ghost here if and only if it is one there.
"""

from __future__ import annotations

import numpy as np
import torch

from ._distance import sq_dist

__all__ = ["ghost_sets"]

#: Relative widening of the radius for scipy's candidate search: far above the rounding of its
#: distances, so no pair that :func:`sq_dist` accepts is missed; :func:`sq_dist` then decides.
_SLACK = 1e-9


def _as_numpy(x: torch.Tensor | np.ndarray, dtype: type) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().to(torch.float64 if dtype is np.float64 else torch.long).numpy()
    return np.asarray(x, dtype=dtype)


def _within(a: np.ndarray, b: np.ndarray, r2: float) -> np.ndarray:
    return (sq_dist(torch.from_numpy(a), torch.from_numpy(b)) <= r2).numpy()


def ghost_sets(
    points: torch.Tensor | np.ndarray,
    owner: torch.Tensor | np.ndarray,
    num_parts: int,
    radius: float,
    *,
    queries: torch.Tensor | np.ndarray | None = None,
    query_owner: torch.Tensor | np.ndarray | None = None,
) -> list[torch.Tensor]:
    """For every part, the sorted ids of the points owned by other parts within ``radius`` of it.

    A point ``p`` owned by part ``s`` is a ghost of part ``r != s`` when
    ``sq_dist(p, q) <= radius * radius`` for at least one query ``q`` of ``r``; the queries are the
    part's own points unless ``queries`` is given. Serial, on CPU: per part, the points of other
    parts in its bounding box grown by the radius (one slab of a copy sorted along axis 0) query a
    scipy ``cKDTree`` of the part's queries for their nearest one, which :func:`sq_dist` then
    checks; the rare point whose nearest query lies just outside the ball (within scipy's
    rounding) is checked against every query near it.

    Parameters
    ----------
    points : Tensor or ndarray
        ``(N, D)`` coordinates (any float dtype; compared in float64).
    owner : Tensor or ndarray
        ``(N,)`` part of every point, in ``[0, num_parts)``.
    num_parts : int
        ``P``.
    radius : float
        Positive finite radius (closed ball).
    queries, query_owner : Tensor or ndarray, optional
        ``(M, D)`` query coordinates and ``(M,)`` their parts (both or neither).

    Returns
    -------
    list of LongTensor
        ``P`` sorted CPU tensors of point ids (rows of ``points``).
    """
    from scipy.spatial import cKDTree

    if (queries is None) != (query_owner is None):
        raise ValueError("queries and query_owner must be given together")
    pts = _as_numpy(points, np.float64)
    own = _as_numpy(owner, np.int64)
    q = pts if queries is None else _as_numpy(queries, np.float64)
    q_own = own if query_owner is None else _as_numpy(query_owner, np.int64)
    out = [torch.zeros(0, dtype=torch.long) for _ in range(num_parts)]
    if pts.shape[0] == 0 or q.shape[0] == 0:
        return out
    r2 = radius * radius
    bound = radius * (1 + _SLACK)
    order = np.argsort(pts[:, 0], kind="stable")
    sorted_pts, sorted_own = pts[order], own[order]
    q_order = np.argsort(q_own, kind="stable")
    q_bounds = np.searchsorted(q_own[q_order], np.arange(num_parts + 1))
    for r in range(num_parts):
        mine = q[q_order[q_bounds[r] : q_bounds[r + 1]]]
        if mine.shape[0] == 0:
            continue
        lo, hi = mine.min(axis=0) - bound, mine.max(axis=0) + bound
        i0 = np.searchsorted(sorted_pts[:, 0], lo[0], side="left")
        i1 = np.searchsorted(sorted_pts[:, 0], hi[0], side="right")
        slab = sorted_pts[i0:i1]
        inside = sorted_own[i0:i1] != r
        for a in range(1, pts.shape[1]):
            inside &= (slab[:, a] >= lo[a]) & (slab[:, a] <= hi[a])
        (cand,) = np.nonzero(inside)
        if cand.size == 0:
            continue
        tree = cKDTree(mine)
        dist, nearest = tree.query(slab[cand], k=1, distance_upper_bound=bound, workers=-1)
        close = dist <= bound
        cand, nearest = cand[close], nearest[close]
        hit = _within(slab[cand], mine[nearest], r2)
        (unsure,) = np.nonzero(~hit)
        if unsure.size:
            for i, near in zip(unsure, tree.query_ball_point(slab[cand[unsure]], bound)):
                hit[i] = bool(_within(slab[cand[i]][None], mine[near], r2).any())
        out[r] = torch.from_numpy(np.sort(order[i0 + cand[hit]]))
    return out
