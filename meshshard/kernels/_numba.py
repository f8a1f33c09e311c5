"""Host side of the fused kernel (:mod:`._fused`): grid parameters, array preparation, dispatch.

CPU tensors run the ``numba`` parallel build (threads follow ``torch.get_num_threads()``), CUDA
tensors the ``numba.cuda`` build of the same functions (:mod:`._fused_cuda`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["available", "fused_mark", "fused_nearest", "grid_params"]

#: Cells of the dense grid per point, at most (the grid then costs 8 bytes x this per point).
_CELLS_PER_POINT = 4
#: kNN: target points per occupied cell.
_KNN_CELL_POINTS = 2.0
#: Relative margin of the pruning tests (see :mod:`._fused`).
_MARGIN = 1e-12


def available() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def _require() -> None:
    if not available():
        raise ImportError("backend='numba' needs numba: pip install numba")


def _as3(x: torch.Tensor) -> torch.Tensor:
    """``(N, 3)`` contiguous float64 (zero columns appended for D < 3)."""
    x = x.detach().to(torch.float64)
    if x.shape[1] < 3:
        x = torch.cat([x, x.new_zeros(x.shape[0], 3 - x.shape[1])], 1)
    return x.contiguous()


def grid_params(
    points: torch.Tensor, queries: torch.Tensor, radius: float, k: int
) -> tuple[np.ndarray, float, np.ndarray, float]:
    """``(lo, cell, dims, margin)`` of the dense grid over ``points`` ``(N, 3)`` float64.

    ``radius`` finite: cells of side about ``radius``; ``inf``: side from the density so that an
    occupied cell holds about ``_KNN_CELL_POINTS`` points (one occupancy pass corrects the
    estimate on surfaces). The cell count is capped at ``_CELLS_PER_POINT`` per point.
    """
    n = points.shape[0]
    lo_t, hi_t = points.min(0).values, points.max(0).values
    lo, hi = lo_t.cpu().numpy(), hi_t.cpu().numpy()
    extent = hi - lo
    top = float(max(np.abs(lo).max(), np.abs(hi).max()))
    if queries.shape[0]:
        top = max(top, float(queries.abs().max()))
    longest = float(extent.max())
    max_cells = _CELLS_PER_POINT * n + 64
    if math.isfinite(radius):
        cell = radius * (1 + 1e-6)
    else:
        volume = float(np.prod(np.maximum(extent, longest * 1e-3)))
        cell = (volume * _KNN_CELL_POINTS / max(n, 1)) ** (1 / 3) if longest > 0 else 1.0
        occupied = _occupied(points, lo, cell)
        if occupied:  # points on a surface or in clusters: fewer occupied cells than the volume says
            per_cell = n / occupied
            if per_cell > 2 * _KNN_CELL_POINTS:
                cell *= math.sqrt(_KNN_CELL_POINTS / per_cell)
    cell = max(cell, longest * 1e-9, 1e-300)
    dims = np.floor(extent / cell).astype(np.int64) + 1
    while float(np.prod(dims.astype(np.float64))) > max_cells:
        cell *= (float(np.prod(dims.astype(np.float64))) / max_cells) ** (1 / 3) * 1.01
        dims = np.floor(extent / cell).astype(np.int64) + 1
    margin = _MARGIN * (top + longest + cell) + 1e-300
    return lo.astype(np.float64), float(cell), dims, margin


def _occupied(points: torch.Tensor, lo: np.ndarray, cell: float) -> int:
    """Occupied cells of side ``cell`` (on a subsample of at most 2^16 points, scaled)."""
    n = points.shape[0]
    step = max(1, n // 65536)
    sample = points[::step]
    idx = torch.floor((sample - torch.as_tensor(lo, device=points.device)) / cell).long()
    occ = torch.unique(idx, dim=0).shape[0]
    return int(round(occ * n / sample.shape[0])) if step > 1 else occ


def _sync_threads() -> None:
    import numba

    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))


def fused_nearest(
    points: torch.Tensor,
    queries: torch.Tensor,
    k: int,
    r2: float | torch.Tensor | None,
    point_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per query, the first ``k`` points in (distance, id) order within ``r2`` (``None``: kNN).

    ``points`` ``(N, D)``, ``queries`` ``(M, D)`` with ``D <= 3`` and ``N, M >= 1``; ``r2`` a
    float or ``(M,)`` float64; ``point_ids`` ``(N,)`` int64 (``None``: the row). Returns
    ``(index, count, dist2)`` as :func:`~._common.select_rows`, on the points' device.
    """
    _require()
    device = points.device
    p, q = _as3(points), _as3(queries)
    n, m = p.shape[0], q.shape[0]
    if r2 is None:
        r2_t = torch.full((1,), torch.inf, dtype=torch.float64, device=device)
    elif isinstance(r2, torch.Tensor):
        r2_t = r2.detach().to(device, torch.float64).reshape(-1).contiguous()
    else:
        r2_t = torch.tensor([float(r2)], dtype=torch.float64, device=device)
    r2max = float(r2_t.max()) if r2_t.numel() else 0.0
    lo, cell, dims, margin = grid_params(p, q, math.sqrt(r2max), k)
    ids = torch.arange(n, device=device) if point_ids is None else point_ids.to(device, torch.long)
    if device.type == "cuda":
        from ._fused_cuda import cuda_nearest

        return cuda_nearest(p, q, ids, lo, cell, dims, margin, r2_t, k)
    from ._fused import counting_sort, search

    _sync_threads()
    p_np, q_np = p.numpy(), q.numpy()
    inv = 1.0 / cell
    order, cell_start = counting_sort(p_np, lo, inv, dims)
    qorder, _ = counting_sort(q_np, lo, inv, dims)  # queries in cell order: neighbouring queries share cache
    sp = p_np[order]
    sid = ids.contiguous().numpy()[order]
    out_d2 = np.empty((m, k), np.float64)
    out_pos = np.empty((m, k), np.int64)
    counts = np.empty(m, np.int64)
    search(sp, sid, order, cell_start, lo, cell, dims, margin, q_np, qorder, r2_t.numpy(), k, out_d2, out_pos, counts)
    return torch.from_numpy(out_pos), torch.from_numpy(counts), torch.from_numpy(out_d2)


def fused_mark(points: torch.Tensor, queries: torch.Tensor, r2: float | torch.Tensor) -> torch.Tensor:
    """``(N,)`` bool: the points within ``r2`` (float or ``(M,)`` finite float64) of some query."""
    _require()
    device = points.device
    p, q = _as3(points), _as3(queries)
    r2_t = (
        r2.detach().to(device, torch.float64).reshape(-1).contiguous()
        if isinstance(r2, torch.Tensor)
        else torch.tensor([float(r2)], dtype=torch.float64, device=device)
    )
    lo, cell, dims, margin = grid_params(p, q, math.sqrt(float(r2_t.max())), 0)
    if device.type == "cuda":
        from ._fused_cuda import cuda_mark

        return cuda_mark(p, q, lo, cell, dims, margin, r2_t)
    from ._fused import counting_sort, mark_within

    _sync_threads()
    p_np, q_np = p.numpy(), q.numpy()
    order, cell_start = counting_sort(p_np, lo, 1.0 / cell, dims)
    qorder, _ = counting_sort(q_np, lo, 1.0 / cell, dims)
    keep_sorted = np.zeros(p_np.shape[0], np.uint8)
    mark_within(p_np[order], cell_start, lo, cell, dims, margin, q_np, qorder, r2_t.numpy(), keep_sorted)
    keep = np.zeros(p_np.shape[0], np.bool_)
    keep[order] = keep_sorted.astype(np.bool_)
    return torch.from_numpy(keep)
