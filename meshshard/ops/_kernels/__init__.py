"""Local neighbour-search kernels behind one interface, with identical results on every backend.

Backends only propose candidate pairs; :func:`radius_pairs` then decides ``d2 <= r2`` with one
float64 formula (:func:`~._common.sq_dist`), so ``"scipy"`` (CPU default: ``cKDTree`` dual-tree
traversal), ``"grid"`` (pure-torch cell list; the default on CUDA, runs on CPU too) and
``"torch_cluster"`` (optional) return the same pairs, and :func:`~._common.select_rows` orders and
truncates them the same way (distance, then global index).
"""

from __future__ import annotations

import torch

from ._common import pair_d2, select_rows, sq_dist
from ._grid import grid_radius_candidates
from ._scipy import scipy_knn_candidates, scipy_radius_candidates
from ._torch_cluster import available as torch_cluster_available
from ._torch_cluster import cluster_radius_candidates

__all__ = [
    "BACKENDS",
    "default_backend",
    "knn_bound",
    "pair_d2",
    "radius_pairs",
    "select_rows",
    "sq_dist",
    "torch_cluster_available",
]

BACKENDS = ("scipy", "grid", "torch_cluster")

#: Elements of a brute-force distance block in :func:`knn_bound` on the torch path.
_BRUTE_BLOCK = 1 << 23


def default_backend(device: torch.device) -> str:
    """``"scipy"`` for CPU tensors, ``"grid"`` otherwise."""
    return "scipy" if torch.device(device).type == "cpu" else "grid"


def check_backend(backend: str | None, device: torch.device) -> str:
    if backend is None:
        return default_backend(device)
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str or None (got {type(backend).__name__})")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} (got {backend!r})")
    return backend


def _empty(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    z = torch.zeros(0, dtype=torch.long, device=device)
    return z, z.clone(), torch.zeros(0, dtype=torch.float64, device=device)


def radius_pairs(
    points: torch.Tensor,
    queries: torch.Tensor,
    r2: float | torch.Tensor,
    *,
    backend: str | None = None,
    queries_are_prefix: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every pair with ``sq_dist(query, point) <= r2`` (closed ball), exactly.

    Parameters
    ----------
    points, queries:
        ``(N, D)`` and ``(M, D)`` plain tensors on one device.
    r2:
        Squared radius: a finite float, or ``(M,)`` float64 per query.
    backend:
        ``"scipy"``, ``"grid"`` or ``"torch_cluster"`` (default by device).
    queries_are_prefix:
        The queries are ``points[:M]`` (lets the scipy backend use its one-tree ``query_pairs``).

    Returns
    -------
    qi, pj, d2:
        ``(E,)`` query rows, point rows and float64 squared distances, in no particular order.
    """
    device = points.device
    backend = check_backend(backend, device)
    if points.shape[0] == 0 or queries.shape[0] == 0:
        return _empty(device)
    if backend == "scipy":
        chunks = [scipy_radius_candidates(points, queries, r2, queries_are_prefix)]
    elif backend == "grid":
        chunks = grid_radius_candidates(points, queries, r2)
    else:
        chunks = [cluster_radius_candidates(points, queries, r2)]
    out_q, out_p, out_d = [], [], []
    for qi, pj in chunks:
        d2 = pair_d2(points, queries, qi, pj)
        bound = r2.index_select(0, qi) if isinstance(r2, torch.Tensor) else r2
        ok = d2 <= bound
        out_q.append(qi[ok])
        out_p.append(pj[ok])
        out_d.append(d2[ok])
    if not out_q:
        return _empty(device)
    if len(out_q) == 1:
        return out_q[0], out_p[0], out_d[0]
    return torch.cat(out_q), torch.cat(out_p), torch.cat(out_d)


def knn_bound(
    points: torch.Tensor, queries: torch.Tensor, k: int, *, backend: str | None = None, strict: bool = True
) -> torch.Tensor:
    """Per query, a squared distance ``b`` such that at least ``k`` points have ``d2 <= b``.

    ``b`` is the largest exact ``d2`` over ``k`` distinct points (the backend's nearest ``k``), so
    the true ``k``-th nearest distance never exceeds it. With fewer than ``k`` points: ``inf`` when
    ``strict``, else the bound over all points.

    **Shapes:** ``points`` ``(N, D)``, ``queries`` ``(M, D)`` -> ``(M,)`` float64.
    """
    device = points.device
    n, m = points.shape[0], queries.shape[0]
    if n < k and strict or n == 0:
        return torch.full((m,), torch.inf, dtype=torch.float64, device=device)
    k = min(k, n)
    if m == 0:
        return torch.zeros(0, dtype=torch.float64, device=device)
    backend = check_backend(backend, device)
    if backend == "scipy":
        idx = scipy_knn_candidates(points, queries, k)
        return sq_dist(queries[:, None, :], points[idx]).max(1).values
    step = max(1, _BRUTE_BLOCK // max(n, 1))
    out = []
    for a in range(0, m, step):
        d2 = sq_dist(queries[a : a + step, None, :], points[None, :, :])
        out.append(torch.topk(d2, k, dim=1, largest=False).values[:, -1])
    return torch.cat(out)
