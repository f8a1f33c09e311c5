"""CPU candidate pairs from ``scipy.spatial.cKDTree`` (dual-tree traversal)."""

from __future__ import annotations

import numpy as np
import torch

from ._common import INFLATE

__all__ = ["scipy_radius_candidates", "scipy_knn_candidates"]


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


def scipy_radius_candidates(
    points: torch.Tensor, queries: torch.Tensor, r2: float | torch.Tensor, queries_are_prefix: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate ``(query_row, point_row)`` pairs: a superset of the pairs with ``d2 <= r2``.

    A scalar radius uses the dual-tree ``query_pairs`` (when the queries are the first rows of the
    points) or ``sparse_distance_matrix``; per-query radii use ``query_ball_point``.
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
            m = queries.shape[0]
            pairs = tree.query_pairs(radius, output_type="ndarray").astype(np.int64, copy=False)
            a, b = pairs[:, 0], pairs[:, 1]  # a < b
            fwd = a < m
            bwd = b < m
            diag = np.arange(m, dtype=np.int64)
            qi = np.concatenate([a[fwd], b[bwd], diag])
            pj = np.concatenate([b[fwd], a[bwd], diag])
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
