"""The fused kernel's CUDA build, checked without a GPU: numba's CUDA simulator and a PTX compile.

The simulator must be switched on before numba.cuda is imported, so those checks run in a fresh
interpreter (``NUMBA_ENABLE_CUDASIM=1``); they compare the CUDA kernels, run thread by thread on
the CPU, with the CPU build and with brute force on a lattice (exact ties everywhere).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SIMULATED = textwrap.dedent(
    """
    import numpy as np, torch
    from meshshard.kernels._fused import counting_sort, mark_within, search
    from meshshard.kernels._fused_cuda import launch_mark, launch_search
    from meshshard.kernels._numba import _as3, grid_params

    g = torch.Generator().manual_seed(0)
    pts = _as3(torch.randint(0, 5, (70, 3), generator=g).double() * 0.25)
    pts[60:] = pts[:10]  # duplicates
    q = _as3(torch.randint(0, 6, (25, 2), generator=g).double() * 0.25 - 0.1)
    ids = torch.randperm(70, generator=g).numpy() * 2 + 1
    d2_all = ((q[:, None, :] - pts[None, :, :]) ** 2).sum(-1).numpy()
    bad = []
    for r2, k in [(0.25**2, 6), (0.5**2, 11), (np.inf, 7)]:
        lo, cell, dims, margin = grid_params(pts, q, float(np.sqrt(r2)), k)
        order, starts = counting_sort(pts.numpy(), lo, 1 / cell, dims)
        qorder, _ = counting_sort(q.numpy(), lo, 1 / cell, dims)
        sp, sid, r2a = pts.numpy()[order], ids[order], np.array([r2])
        outs = []
        for cuda_build in (False, True):
            d2 = np.empty((25, k)); pos = np.empty((25, k), np.int64); cnt = np.empty(25, np.int64)
            args = (sp, sid, order, starts, lo, cell, dims, margin, q.numpy(), qorder, r2a, k, d2, pos, cnt)
            launch_search(*args, np.zeros(1, np.uint8)) if cuda_build else search(*args)
            outs.append((d2, pos, cnt))
        if not all(np.array_equal(a, b) for a, b in zip(*outs)):
            bad.append(("cpu != cuda", r2, k))
        for i in range(25):
            order_i = np.lexsort((ids, d2_all[i]))
            order_i = order_i[d2_all[i][order_i] <= r2][:k]
            if outs[1][1][i, : len(order_i)].tolist() != order_i.tolist() or outs[1][2][i] != len(order_i):
                bad.append(("brute force", r2, k, i))
        if np.isfinite(r2):
            keep_cpu, keep_cuda = np.zeros(70, np.uint8), np.zeros(70, np.uint8)
            mark_within(sp, starts, lo, cell, dims, margin, q.numpy(), qorder, r2a, keep_cpu)
            launch_mark(sp, np.zeros(1, np.int64), starts, lo, cell, dims, margin, q.numpy(), qorder, r2a,
                        np.zeros((1, 1)), np.zeros((1, 1), np.int64), keep_cuda)
            want = (d2_all <= r2).any(0)[order]
            if not (np.array_equal(keep_cpu, keep_cuda) and np.array_equal(keep_cuda.astype(bool), want)):
                bad.append(("mark", r2))
    print("BAD", bad)
    """
)


@pytest.mark.timeout(600)
def test_cuda_kernels_under_the_simulator_match_cpu_and_brute_force():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", SIMULATED], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "BAD []"


PTX = textwrap.dedent(
    """
    import types
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda, types as T
    from numba.cuda.cudadrv import nvvm
    try:
        nvvm.NVVM()
    except Exception:
        print("NO-NVVM")
        raise SystemExit(0)
    # no GPU here: the device functions ask the current device for its compute capability
    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
    from meshshard.kernels import _fused_cuda as F
    f2, i1, f1, i2 = (T.Array(T.float64, 2, "C"), T.Array(T.int64, 1, "C"), T.Array(T.float64, 1, "C"),
                      T.Array(T.int64, 2, "C"))
    u1 = T.Array(T.uint8, 1, "C")
    sig = (f2, i1, i1, i1, f1, T.float64, i1, T.float64, f2, i1, f1, T.int64, f2, i2, i1, u1)
    ptx, _ = cuda.compile_ptx(F._search_kernel.py_func, sig, cc=(9, 0))
    # the distance: three explicitly rounded products and two sums, never contracted to an FMA
    print("MUL", ptx.count("mul.rn.f64"), "ADD", ptx.count("add.rn.f64"))
    sig = (f2, i1, i1, f1, T.float64, i1, T.float64, f2, i1, f1, f2, i2, u1)
    cuda.compile_ptx(F._mark_kernel.py_func, sig, cc=(9, 0))
    print("OK")
    """
)


@pytest.mark.timeout(600)
def test_cuda_kernels_compile_to_ptx():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    proc = subprocess.run([sys.executable, "-c", PTX], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    if lines[-1] == "NO-NVVM":
        pytest.skip("libNVVM not found: PTX cannot be generated on this machine")
    assert lines[-2:] == ["MUL 3 ADD 2", "OK"]
