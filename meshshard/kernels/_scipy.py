"""CPU candidate pairs from ``scipy.spatial.cKDTree`` (dual-tree traversal)."""

from __future__ import annotations

import numpy as np
import torch

from ._common import INFLATE

__all__ = ["scipy_knn_candidates", "scipy_query", "scipy_radius_candidates", "scipy_tree"]


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


def scipy_radius_candidates(
    points: torch.Tensor, queries: torch.Tensor, r2: float | torch.Tensor, queries_are_prefix: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate ``(query_row, point_row)`` pairs: a superset of the pairs with ``d2 <= r2``.

    A scalar radius uses the dual-tree ``sparse_distance_matrix``; per-query radii use
    ``query_ball_point``. When the queries are the first ``M`` rows of the points, the dual-tree
    ``query_pairs`` returns each unordered pair once: ``(a, b)`` with ``a < b`` and ``a < M``,
    without the pairs ``(i, i)``; the caller symmetrises them (see ``radius_pairs``).
    """
    from scipy.spatial import cKDTree

    pts = _np(points)
    tree = cKDTree(pts)
    if isinstance(r2, torch.Tensor):
        radii = np.sqrt(_np(r2)) * (1 + INFLATE)
        lists = tree.query_ball_point(_np(queries), radii)
        lens = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
        pj = np.zeros(0, np.int64)
        if lens.sum():
            pj = np.concatenate([np.asarray(x, dtype=np.int64) for x in lists])
        qi = np.repeat(np.arange(len(lists), dtype=np.int64), lens)
    else:
        radius = float(np.sqrt(r2)) * (1 + INFLATE)
        if queries_are_prefix:
            m, n = queries.shape[0], points.shape[0]
            pairs = tree.query_pairs(radius, output_type="ndarray").astype(np.int64, copy=False)
            a, b = pairs[:, 0], pairs[:, 1]  # a < b
            if m < n:  # only the first m points are queries; a < b, so b < m implies a < m
                fwd = a < m
                a, b = a[fwd], b[fwd]
            device = points.device
            return torch.from_numpy(a).to(device), torch.from_numpy(b).to(device)
        else:
            out = tree.sparse_distance_matrix(cKDTree(_np(queries)), radius, output_type="ndarray")
            pj, qi = out["i"].astype(np.int64), out["j"].astype(np.int64)
    device = points.device
    return torch.from_numpy(qi).to(device), torch.from_numpy(pj).to(device)


def scipy_knn_candidates(points: torch.Tensor, queries: torch.Tensor, k: int) -> torch.Tensor:
    """``(M, k)`` rows of ``k`` distinct points per query (approximately the nearest; ``k <= N``)."""
    from scipy.spatial import cKDTree

    _, idx = cKDTree(_np(points)).query(_np(queries), k=k)
    idx = np.asarray(idx, dtype=np.int64).reshape(queries.shape[0], k)
    return torch.from_numpy(idx).to(points.device)


def scipy_tree(points: torch.Tensor):
    """A ``cKDTree`` over ``points`` (float64 copy)."""
    from scipy.spatial import cKDTree

    return cKDTree(_np(points))


def scipy_query(
    tree, queries: torch.Tensor, k: int, radius: float | None, workers: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cKDTree.query``: the ``k`` nearest (by scipy's own rounding) within ``radius`` (inflated).

    Returns ``(dist, index)`` ``(M, k)``: float64 distances (``inf`` and index ``N`` when missing).
    """
    bound = np.inf if radius is None else radius * (1 + INFLATE)
    dist, idx = tree.query(_np(queries), k=k, distance_upper_bound=bound, workers=workers)
    m = queries.shape[0]
    dist = np.asarray(dist, dtype=np.float64).reshape(m, k)
    idx = np.asarray(idx, dtype=np.int64).reshape(m, k)
    return torch.from_numpy(dist), torch.from_numpy(idx)
