"""Local neighbour-search kernels behind one interface, with identical results on every backend.

The kernels layer: below :mod:`meshshard.halo` and :mod:`meshshard.ops`, which use it, above the
geometry layer (:mod:`meshshard.partition`). It works on plain tensors of one process only.

``"numba"`` (the CPU default when numba is installed; on CUDA through ``numba.cuda``, opt-in) is the
fused kernel of :mod:`._fused`: per query a grid walk and a bounded heap ordered by (exact float64
distance, id), writing the ``(M, K)`` result directly, never a list of pairs. The other backends
only propose candidate pairs; :func:`radius_pairs` then decides ``d2 <= r2`` with the same float64
formula (:func:`~._common.sq_dist`), so ``"scipy"`` (``cKDTree`` dual-tree traversal), ``"grid"``
(pure-torch cell list, runs on any device) and ``"torch_cluster"`` (optional) return the same
pairs, and :func:`~._common.select_rows` orders and truncates them the same way (distance, then
id). The fused kernel handles ``D <= 3``; higher dimensions use ``"scipy"`` (CPU) or ``"grid"``.
"""

from __future__ import annotations

import math

import torch

from .._checks import check_choice
from ._common import pair_d2, select_rows, sq_dist
from ._grid import grid_radius_candidates
from ._numba import available as numba_available
from ._numba import fused_mark, fused_nearest
from ._scipy import scipy_knn_candidates, scipy_query, scipy_radius_candidates, scipy_tree
from ._torch_cluster import available as torch_cluster_available
from ._torch_cluster import cluster_radius_candidates

__all__ = [
    "BACKENDS",
    "check_backend",
    "default_backend",
    "knn_bound",
    "nearest_neighbors",
    "numba_available",
    "points_near_boxes",
    "points_within",
    "radius_pairs",
    "sq_dist",
    "torch_cluster_available",
]

BACKENDS = ("numba", "scipy", "grid", "torch_cluster")
#: Largest dimension the fused kernel handles (coordinates are padded to 3).
_FUSED_MAX_DIM = 3

#: Elements of a brute-force distance block in :func:`knn_bound` on the torch path.
_BRUTE_BLOCK = 1 << 23
#: Entries of one block of ``(queries, neighbours)`` in the scipy path of :func:`nearest_neighbors`.
_QUERY_BLOCK = 1 << 21
#: scipy's distances and ours differ by a few ulps: a margin far above that decides certainty.
_CERTAIN = 1 - 1e-9
_NO_INDEX = torch.iinfo(torch.long).max


def default_backend(device: torch.device) -> str:
    """``"numba"`` on CPU when numba is installed (else ``"scipy"``), ``"grid"`` on other devices.

    The CUDA build of the fused kernel (``backend="numba"`` on CUDA tensors) is opt-in until it has
    run on a GPU: its logic is tested under numba's CUDA simulator only.
    """
    if torch.device(device).type == "cpu":
        return "numba" if numba_available() else "scipy"
    return "grid"


def _pair_backend(backend: str, device: torch.device) -> str:
    """The candidate-pair backend standing in for ``"numba"`` where pairs are wanted."""
    if backend != "numba":
        return backend
    return "scipy" if torch.device(device).type == "cpu" else "grid"


def _use_fused(backend: str, dim: int) -> bool:
    return backend == "numba" and dim <= _FUSED_MAX_DIM


def check_backend(backend: str | None, device: torch.device) -> str:
    if backend is None:
        return default_backend(device)
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str or None (got {type(backend).__name__})")
    return check_choice(backend, "backend", BACKENDS)


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
        ``"scipy"``, ``"grid"`` or ``"torch_cluster"`` (default by device; ``"numba"``, which
    makes no pair list, stands for ``"scipy"`` on CPU and ``"grid"`` elsewhere).
    queries_are_prefix:
        The queries are ``points[:M]`` (lets the scipy backend use its one-tree ``query_pairs``).

    Returns
    -------
    qi, pj, d2:
        ``(E,)`` query rows, point rows and float64 squared distances, in no particular order.
    """
    device = points.device
    backend = _pair_backend(check_backend(backend, device), device)
    if points.shape[0] == 0 or queries.shape[0] == 0:
        return _empty(device)
    if backend == "scipy" and queries_are_prefix and not isinstance(r2, torch.Tensor):
        return _symmetric_pairs(points, queries.shape[0], r2)
    if backend == "scipy":
        chunks = [scipy_radius_candidates(points, queries, r2, False)]
    elif backend == "grid":
        chunks = grid_radius_candidates(points, queries, r2)
    else:
        chunks = [cluster_radius_candidates(points, queries, r2)]
    out_q, out_p, out_d = [], [], []
    for qi, pj in chunks:
        d2 = pair_d2(points, queries, qi, pj)
        bound = r2.index_select(0, qi) if isinstance(r2, torch.Tensor) else r2
        qi, pj, d2 = _keep(d2 <= bound, qi, pj, d2)
        out_q.append(qi)
        out_p.append(pj)
        out_d.append(d2)
    if not out_q:
        return _empty(device)
    if len(out_q) == 1:
        return out_q[0], out_p[0], out_d[0]
    return torch.cat(out_q), torch.cat(out_p), torch.cat(out_d)


def points_within(
    points: torch.Tensor, queries: torch.Tensor, r2: float | torch.Tensor, *, backend: str | None = None
) -> torch.Tensor:
    """``(N,)`` bool: which points lie within ``r2`` (closed) of at least one query, exactly.

    ``r2`` is a finite float or ``(M,)`` finite float64 per query. The fused backend flags the
    points during its grid walk (no pair list); the others reduce :func:`radius_pairs`.
    """
    device = points.device
    backend = check_backend(backend, device)
    keep = torch.zeros(points.shape[0], dtype=torch.bool, device=device)
    if points.shape[0] == 0 or queries.shape[0] == 0:
        return keep
    if _use_fused(backend, points.shape[1]):
        return fused_mark(points, queries, r2).to(device)
    _, pj, _ = radius_pairs(points, queries, r2, backend=backend)
    keep[pj] = True
    return keep


def points_near_boxes(points: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
    """``(B, N)`` bool: point ``n`` lies within ``r2[b]`` of the box ``[lo[b], hi[b]]`` (closed).

    The squared gap is summed in axis order like :func:`sq_dist`, so every backend decides alike:
    numba on CPU (one pass), torch blocks elsewhere.

    **Shapes:** ``points`` ``(N, D)``, ``lo``/``hi`` ``(B, D)``, ``r2`` ``(B,)`` -> ``(B, N)``.
    """
    device = points.device
    p = points.detach().to(torch.float64).contiguous()
    lo, hi, r2 = (t.to(device, torch.float64).contiguous() for t in (lo, hi, r2))
    if device.type == "cpu" and numba_available():
        from ._fused import near_boxes

        out = torch.empty((lo.shape[0], p.shape[0]), dtype=torch.bool)
        near_boxes(p.numpy(), lo.numpy(), hi.numpy(), r2.numpy(), out.numpy())
        return out
    return _points_near_boxes_torch(p, lo, hi, r2)


def _points_near_boxes_torch(p: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
    device = p.device
    step = max(1, _BRUTE_BLOCK // max(lo.shape[0] * p.shape[1], 1))
    parts = []
    for a in range(0, p.shape[0], step):
        x = p[a : a + step, None, :]
        gap = torch.clamp(torch.maximum(lo[None] - x, x - hi[None]), min=0.0)  # (n, B, D)
        parts.append((sq_dist(gap, torch.zeros_like(gap)) <= r2[None, :]).t())
    return torch.cat(parts, 1) if parts else torch.zeros((lo.shape[0], 0), dtype=torch.bool, device=device)


def _keep(ok: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if bool(ok.all()):  # the usual case: the inflation admitted no extra pair
        return tensors
    rows = ok.nonzero().flatten()
    return tuple(t.index_select(0, rows) for t in tensors)


def _symmetric_pairs(
    points: torch.Tensor, num_queries: int, r2: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Self query of the first ``num_queries`` points: each unordered pair is measured once.

    ``sq_dist`` is symmetric bit for bit (``(a - b)^2 == (b - a)^2``), so the pair's distance
    serves both directions.
    """
    a, b = scipy_radius_candidates(points, points[:num_queries], r2, True)
    d2 = pair_d2(points, points, a, b)
    a, b, d2 = _keep(d2 <= r2, a, b, d2)
    back = (b < num_queries).nonzero().flatten() if num_queries < points.shape[0] else None
    ba, bb, bd = (
        (b, a, d2) if back is None else (b.index_select(0, back), a.index_select(0, back), d2.index_select(0, back))
    )
    diag = torch.arange(num_queries, device=points.device)
    zero = torch.zeros(num_queries, dtype=torch.float64, device=points.device)
    return torch.cat([a, ba, diag]), torch.cat([b, bb, diag]), torch.cat([d2, bd, zero])


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
    if _use_fused(backend, points.shape[1]):
        return fused_nearest(points, queries, k, None, None)[2][:, k - 1].to(device)
    backend = _pair_backend(backend, device)
    if backend == "scipy":
        idx = scipy_knn_candidates(points, queries, k)
        return sq_dist(queries[:, None, :], points[idx]).max(1).values
    if n * m > _BRUTE_BLOCK * 8:
        return _grid_knn_bound(points, queries, k)
    step = max(1, _BRUTE_BLOCK // max(n, 1))
    out = []
    for a in range(0, m, step):
        d2 = sq_dist(queries[a : a + step, None, :], points[None, :, :])
        out.append(torch.topk(d2, k, dim=1, largest=False).values[:, -1])
    return torch.cat(out)


def _grid_knn_bound(points: torch.Tensor, queries: torch.Tensor, k: int) -> torch.Tensor:
    """k-th nearest squared distance with the cell list: a radius from the mean density, doubled
    for the queries that found fewer than ``k`` points (terminates once it spans the cloud)."""
    n, m, dim = points.shape[0], queries.shape[0], points.shape[1]
    p = points.detach().to(torch.float64)
    q = queries.detach().to(torch.float64)
    extent = torch.maximum(p.max(0).values, q.max(0).values) - torch.minimum(p.min(0).values, q.min(0).values)
    diameter = float(extent.norm())
    volume = float(extent.clamp(min=diameter * 1e-3 + 1e-300).prod())
    radius = max((k / n * volume) ** (1.0 / dim), diameter * 1e-6, 1e-300)
    bound = torch.full((m,), torch.inf, dtype=torch.float64, device=points.device)
    todo = torch.arange(m, device=points.device)
    while todo.numel():
        qi, pj, d2 = radius_pairs(points, queries.index_select(0, todo), radius * radius, backend="grid")
        _, count, dist2 = select_rows(qi, pj, d2, None, todo.numel(), k)
        done = count >= k
        bound[todo[done]] = dist2[done, k - 1]
        todo = todo[~done]
        radius *= 2.0
    return bound


def nearest_neighbors(
    points: torch.Tensor,
    queries: torch.Tensor,
    k: int,
    r2: float | None = None,
    *,
    point_gidx: torch.Tensor | None = None,
    backend: str | None = None,
    queries_are_prefix: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per query, the first ``k`` points in (distance, global index) order, within ``r2`` if given.

    Exact on every backend: the result is what :func:`radius_pairs` followed by
    :func:`select_rows` gives. ``r2=None`` is k nearest neighbours. ``point_gidx`` are the ids that
    order equidistant points (default: the row).

    ``"numba"``: the fused kernel (:mod:`._fused`) computes the rows directly. Otherwise a ball
    (``r2`` given) collects all pairs (scipy: dual-tree traversal), then sorts them with one
    composite-key sort. For kNN, the scipy backend avoids materialising all pairs:
    ``cKDTree.query`` returns a few more than ``k`` neighbours per query (multithreaded), rows are
    re-ordered with the exact float64 distance and global index, and a row is accepted only if
    its ``k``-th exact distance is clearly below the farthest one scipy returned (so no point left
    out can tie or beat it). The few other rows (exact ties beyond the buffer, e.g. many duplicate
    points) are redone exactly with all pairs.

    Returns ``(index, count, dist2)`` as :func:`select_rows`.
    """
    device = points.device
    n, m = points.shape[0], queries.shape[0]
    backend = check_backend(backend, device)
    if n == 0 or m == 0:
        return (
            torch.full((m, k), -1, dtype=torch.long, device=device),
            torch.zeros(m, dtype=torch.long, device=device),
            torch.full((m, k), torch.inf, dtype=torch.float64, device=device),
        )
    if _use_fused(backend, points.shape[1]):
        return tuple(t.to(device) for t in fused_nearest(points, queries, k, r2, point_gidx))
    backend = _pair_backend(backend, device)
    if backend != "scipy" or r2 is not None:
        bound = knn_bound(points, queries, k, backend=backend, strict=False) if r2 is None else r2
        qi, pj, d2 = radius_pairs(points, queries, bound, backend=backend, queries_are_prefix=queries_are_prefix)
        return select_rows(qi, pj, d2, point_gidx, m, k)
    cpu = torch.device("cpu")
    gidx = None if point_gidx is None else point_gidx.to(cpu)
    out = _scipy_nearest(points.detach().to(cpu), queries.detach().to(cpu), k, r2, gidx)
    return tuple(t.to(device) for t in out)


def _sort_rows(d2: torch.Tensor, g: torch.Tensor, idx: torch.Tensor) -> None:
    """Sort (in place) the rows of ``(d2, g)`` that are not already in lexicographic order."""
    bad = ((d2[:, 1:] < d2[:, :-1]) | ((d2[:, 1:] == d2[:, :-1]) & (g[:, 1:] < g[:, :-1]))).any(1)
    rows = bad.nonzero().flatten()
    if rows.numel() == 0:
        return
    sd, sg, si = d2[rows], g[rows], idx[rows]
    order = torch.argsort(sg, dim=1, stable=True)
    sd, sg, si = sd.gather(1, order), sg.gather(1, order), si.gather(1, order)
    order = torch.argsort(sd, dim=1, stable=True)
    d2[rows], g[rows], idx[rows] = sd.gather(1, order), sg.gather(1, order), si.gather(1, order)


def _scipy_nearest(
    points: torch.Tensor,
    queries: torch.Tensor,
    k: int,
    r2: float | None,
    point_gidx: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, m = points.shape[0], queries.shape[0]
    kq = min(n, k + max(4, k // 4))
    width = min(k, kq)
    tree = scipy_tree(points)
    radius = None if r2 is None else math.sqrt(r2)
    workers = max(1, torch.get_num_threads())
    index = torch.full((m, k), -1, dtype=torch.long)
    dist2 = torch.full((m, k), torch.inf, dtype=torch.float64)
    unsure_rows, unsure_r2 = [], []
    step = max(1, _QUERY_BLOCK // kq)
    for a in range(0, m, step):
        q = queries[a : a + step]
        ds, idx = scipy_query(tree, q, kq, radius, workers)
        valid = idx < n
        idx = torch.where(valid, idx, 0)
        d2 = sq_dist(q[:, None, :], points[idx])
        ok = valid if r2 is None else valid & (d2 <= r2)
        d2 = d2.masked_fill(~ok, torch.inf)
        g = (idx if point_gidx is None else point_gidx[idx]).masked_fill(~ok, _NO_INDEX)
        _sort_rows(d2, g, idx)
        kth = d2[:, k - 1] if kq >= k else torch.full((q.shape[0],), torch.inf, dtype=torch.float64)
        if kq < n:
            # scipy filled every slot: a point it left out is at least as far as its last one.
            unsure = valid[:, -1] & ~(kth < ds[:, -1] * ds[:, -1] * _CERTAIN)
            rows = unsure.nonzero().flatten()
            if rows.numel():
                unsure_rows.append(rows + a)
                unsure_r2.append(kth[rows] if r2 is None else kth[rows].clamp(max=r2))
        found = torch.isfinite(d2[:, :width])
        index[a : a + step, :width] = torch.where(found, idx[:, :width], -1)
        dist2[a : a + step, :width] = d2[:, :width]
    if unsure_rows:
        rows, bound = torch.cat(unsure_rows), torch.cat(unsure_r2)
        qi, pj, d2 = radius_pairs(points, queries[rows], bound, backend="scipy")
        index[rows], _, dist2[rows] = select_rows(qi, pj, d2, point_gidx, rows.numel(), k)
    return index, (index >= 0).sum(1), dist2
