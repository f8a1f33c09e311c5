"""CUDA build of the fused neighbour kernel: the functions of :mod:`._fused`, compiled by ``numba.cuda``.

One thread per query runs :func:`~._fused.query_one` and :func:`~._fused.finish_row`, the very
functions the CPU build runs, on a grid built with torch on the device (sort of the cell keys,
``searchsorted`` for the cell starts). Only the squared distance is specialised: NVVM contracts a
multiply and an add into one FMA by default, which would change the last bit of some distances,
so the CUDA overload of :func:`~._fused.sq_dist3` rounds every product and sum explicitly
(``libdevice`` ``dmul_rn`` / ``dadd_rn``), giving the CPU's and torch's values bit for bit.

The kernels take plain arrays, so :func:`launch_search` / :func:`launch_mark` also run under
numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) with NumPy arrays: the tests check the CUDA
logic on a CPU that way. Kernels compile on first use (a few seconds), not at import.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import cuda
from numba.extending import overload

from ._fused import MODE_MARK, MODE_SEARCH, finish_row, query_one, sq_dist3

__all__ = ["cuda_mark", "cuda_nearest", "launch_mark", "launch_search"]

_THREADS = 128


@overload(sq_dist3, target="cuda")
def _sq_dist3_cuda(ax, ay, az, bx, by, bz):
    from numba.cuda import libdevice

    def impl(ax, ay, az, bx, by, bz):
        dx = ax - bx
        dy = ay - by
        dz = az - bz
        s = libdevice.dadd_rn(libdevice.dmul_rn(dx, dx), libdevice.dmul_rn(dy, dy))
        return libdevice.dadd_rn(s, libdevice.dmul_rn(dz, dz))

    return impl


@cuda.jit
def _search_kernel(sp, sid, order, cell_start, lo, c, dims, margin, q, qorder, r2, k, out_d2, out_pos, counts, dummy):
    t = cuda.grid(1)
    if t >= qorder.shape[0]:
        return
    row = qorder[t]
    rr = r2[row] if r2.shape[0] > 1 else r2[0]
    n = query_one(
        q[row, 0], q[row, 1], q[row, 2], rr, k, MODE_SEARCH, row, sp, sid, cell_start, lo, c, 1.0 / c, dims,
        margin, out_d2, out_pos, dummy,
    )
    finish_row(out_d2, out_pos, sid, order, row, n, k)
    counts[row] = n


@cuda.jit
def _mark_kernel(sp, sid, cell_start, lo, c, dims, margin, q, qorder, r2, no_d2, no_pos, keep):
    t = cuda.grid(1)
    if t >= qorder.shape[0]:
        return
    row = qorder[t]
    rr = r2[row] if r2.shape[0] > 1 else r2[0]
    query_one(
        q[row, 0], q[row, 1], q[row, 2], rr, 0, MODE_MARK, 0, sp, sid, cell_start, lo, c, 1.0 / c, dims, margin,
        no_d2, no_pos, keep,
    )


def _blocks(m: int) -> int:
    return max(1, -(-m // _THREADS))


def launch_search(sp, sid, order, cell_start, lo, c, dims, margin, q, qorder, r2, k, out_d2, out_pos, counts, dummy,
                  stream=0) -> None:
    """Run the search kernel (arguments as :func:`._fused.search`; device or, simulated, NumPy arrays)."""
    _search_kernel[_blocks(qorder.shape[0]), _THREADS, stream](
        sp, sid, order, cell_start, lo, c, dims, margin, q, qorder, r2, k, out_d2, out_pos, counts, dummy
    )


def launch_mark(sp, sid, cell_start, lo, c, dims, margin, q, qorder, r2, no_d2, no_pos, keep, stream=0) -> None:
    """Run the mark kernel (arguments as :func:`._fused.mark_within`, plus the dummy heap arrays)."""
    _mark_kernel[_blocks(qorder.shape[0]), _THREADS, stream](
        sp, sid, cell_start, lo, c, dims, margin, q, qorder, r2, no_d2, no_pos, keep
    )


# -- torch front end ---------------------------------------------------------------------------------
def _cell_keys(x: torch.Tensor, lo: torch.Tensor, cell: float, dims: torch.Tensor) -> torch.Tensor:
    """Linear cell key of every row (the clamping of ``_fused._cell_of``)."""
    t = (x - lo) / cell
    idx = torch.minimum(torch.floor(t.clamp(min=0.0)), (dims - 1).to(x.dtype)).long()
    return (idx[:, 0] * dims[1] + idx[:, 1]) * dims[2] + idx[:, 2]


def _grid(x: torch.Tensor, lo: torch.Tensor, cell: float, dims: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    keys = _cell_keys(x, lo, cell, dims)
    sorted_keys, order = torch.sort(keys)
    num_cells = int(dims.prod())
    starts = torch.searchsorted(sorted_keys, torch.arange(num_cells + 1, device=x.device))
    return order, starts


def _stream():
    return cuda.external_stream(torch.cuda.current_stream().cuda_stream)


def cuda_nearest(
    p: torch.Tensor,
    q: torch.Tensor,
    ids: torch.Tensor,
    lo: np.ndarray,
    cell: float,
    dims: np.ndarray,
    margin: float,
    r2: torch.Tensor,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`._numba.fused_nearest` on CUDA tensors (``p``, ``q`` ``(N, 3)``/``(M, 3)`` float64)."""
    device = p.device
    lo_t = torch.as_tensor(lo, dtype=torch.float64, device=device)
    dims_t = torch.as_tensor(dims, dtype=torch.long, device=device)
    order, starts = _grid(p, lo_t, cell, dims_t)
    _, qorder = torch.sort(_cell_keys(q, lo_t, cell, dims_t))
    sp = p.index_select(0, order).contiguous()
    sid = ids.index_select(0, order).contiguous()
    m = q.shape[0]
    out_d2 = torch.empty((m, k), dtype=torch.float64, device=device)
    out_pos = torch.empty((m, k), dtype=torch.long, device=device)
    counts = torch.empty(m, dtype=torch.long, device=device)
    dummy = torch.zeros(1, dtype=torch.uint8, device=device)
    a = cuda.as_cuda_array
    launch_search(
        a(sp), a(sid), a(order), a(starts), a(lo_t), float(cell), a(dims_t), float(margin), a(q), a(qorder), a(r2),
        int(k), a(out_d2), a(out_pos), a(counts), a(dummy), stream=_stream(),
    )
    return out_pos, counts, out_d2


def cuda_mark(
    p: torch.Tensor, q: torch.Tensor, lo: np.ndarray, cell: float, dims: np.ndarray, margin: float, r2: torch.Tensor
) -> torch.Tensor:
    """:func:`._numba.fused_mark` on CUDA tensors."""
    device = p.device
    lo_t = torch.as_tensor(lo, dtype=torch.float64, device=device)
    dims_t = torch.as_tensor(dims, dtype=torch.long, device=device)
    order, starts = _grid(p, lo_t, cell, dims_t)
    _, qorder = torch.sort(_cell_keys(q, lo_t, cell, dims_t))
    keep_sorted = torch.zeros(p.shape[0], dtype=torch.uint8, device=device)
    no_d2 = torch.zeros((1, 1), dtype=torch.float64, device=device)
    no_pos = torch.zeros((1, 1), dtype=torch.long, device=device)
    sid = torch.zeros(1, dtype=torch.long, device=device)
    a = cuda.as_cuda_array
    launch_mark(
        a(p.index_select(0, order).contiguous()), a(sid), a(starts), a(lo_t), float(cell), a(dims_t), float(margin),
        a(q), a(qorder), a(r2), a(no_d2), a(no_pos), a(keep_sorted), stream=_stream(),
    )
    keep = torch.zeros(p.shape[0], dtype=torch.bool, device=device)
    keep[order] = keep_sorted.bool()
    return keep

