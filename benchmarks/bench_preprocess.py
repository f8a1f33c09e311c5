"""DrivaerML preprocessing: throughput (cells/s) with 1 and 2 workers, and the SDF backends side by side.

Peers
- Signed distance, 1e5 points (2e4 with ``--quick``) around a 20k-face synthetic car: libigl
  ``signed_distance`` (pseudonormal and its default winding-number sign), warp's
  ``mesh_query_point_sign_winding_number`` (first call with kernel compile, then warm), and
  trimesh's ``proximity.signed_distance`` (on 2000 points, extrapolated: it is ~100x slower).
- Preprocessing (:func:`meshshard.datasets.preprocess`, ``parts=(1, 2, 4, 8)``, RCB) of synthetic
  runs, surface-only and volume-only (with SDF), ``workers=1`` vs ``2``; a per-stage breakdown of
  one run (read VTK, SDF, nested partition, write) says where the time goes.
- Loading: what rank 0 of 4 reads from the store (its slice) against ``np.load`` of every array.

Run: ``.venv/bin/python benchmarks/bench_preprocess.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from meshshard.datasets import DrivaerML, DrivaerMLDataset, make_synthetic_drivaerml, preprocess
from meshshard.datasets._sdf import signed_distance
from meshshard.datasets._store import nested_partition
from meshshard.datasets.synthetic import CarParameters, car_surface

RESULTS = Path(__file__).resolve().parent / "results"


def _timed(fn) -> tuple[float, object]:  # noqa: ANN001
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def bench_sdf(num_points: int) -> list[dict]:
    import igl
    import trimesh

    vertices, faces = car_surface(CarParameters.sample(np.random.default_rng(0)), 20_000)
    rng = np.random.default_rng(0)
    points = rng.uniform(vertices.min(0) - 1.0, vertices.max(0) + 1.0, size=(num_points, 3))
    rows = []
    t, ref = _timed(lambda: signed_distance(points, vertices, faces, backend="igl"))
    rows.append({"backend": "libigl (pseudonormal)", "seconds": t, "max_abs_diff": 0.0})
    t, other = _timed(
        lambda: igl.signed_distance(points, vertices, faces.astype(np.int64))[0]  # default sign type
    )
    rows.append({"backend": "libigl (default sign)", "seconds": t, "max_abs_diff": float(np.abs(other - ref).max())})
    try:
        import warp  # noqa: F401

        t, out = _timed(lambda: signed_distance(points, vertices, faces, backend="warp"))
        rows.append(
            {"backend": "warp (1st call, compile)", "seconds": t, "max_abs_diff": float(np.abs(out - ref).max())}
        )
        t, out = _timed(lambda: signed_distance(points, vertices, faces, backend="warp"))
        rows.append({"backend": "warp (warm)", "seconds": t, "max_abs_diff": float(np.abs(out - ref).max())})
    except ImportError:
        rows.append({"backend": "warp (not installed)", "seconds": float("nan"), "max_abs_diff": float("nan")})
    body = trimesh.Trimesh(vertices, faces, process=False)
    sub = 2000
    t, out = _timed(lambda: -trimesh.proximity.signed_distance(body, points[:sub]))  # trimesh: + inside
    rows.append(
        {
            "backend": f"trimesh ({sub} pts, extrapolated)",
            "seconds": t * num_points / sub,
            "max_abs_diff": float(np.abs(out - ref[:sub]).max()),
        }
    )
    for row in rows:
        row["points"] = num_points
        row["faces"] = len(faces)
    return rows


def _import_worker(_: int) -> int:
    import meshshard.datasets._preprocess  # noqa: F401

    return os.getpid()


def bench_pool_startup(workers: int = 2) -> float:
    """Seconds to spawn ``workers`` processes that import meshshard (paid once per preprocess call)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    t0 = time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_import_worker, range(workers)))
    return time.perf_counter() - t0


def bench_stages(data: Path, kind: str) -> dict:
    """Time each stage of one run in this process."""
    ds = DrivaerML(data, runs=[1], surface=kind == "surface", volume=kind == "volume")
    t_read, arrays = _timed(lambda: ds.read_surface(1) if kind == "surface" else ds.read_volume(1))
    stages = {"read": t_read}
    if kind == "volume":
        import trimesh

        body = trimesh.load(ds.stl_path(1), force="mesh")
        stages["sdf"], _ = _timed(lambda: signed_distance(arrays["pos"], body.vertices, body.faces))
    pos = torch.from_numpy(arrays["pos"].astype(np.float32))
    stages["partition"], (perm, _) = _timed(lambda: nested_partition(pos, [1, 2, 4, 8], "rcb"))
    tmp = Path(tempfile.mkdtemp())
    p = perm.numpy()
    stages["write"], _ = _timed(lambda: [np.save(tmp / f"{k}.npy", v.astype(np.float32)[p]) for k, v in arrays.items()])
    shutil.rmtree(tmp)
    stages["cells"] = len(pos)
    return stages


def bench_throughput(data: Path, kind: str, workers: int, backend: str = "auto") -> dict:
    store = Path(tempfile.mkdtemp())
    try:
        report = preprocess(
            data, store, parts=(1, 2, 4, 8), surface=kind == "surface", volume=kind == "volume",
            workers=workers, progress=False, sdf_backend=backend,
        )  # fmt: skip
        assert report.ok, report.failed
        cells = sum(report.cells.values())
        load = bench_loading(store, kind) if workers == 1 else {}
        return {"kind": kind, "workers": workers, "sdf": backend, "runs": len(report.processed),
                "cells": cells, "seconds": report.seconds, "cells_per_s": cells / report.seconds, **load}  # fmt: skip
    finally:
        shutil.rmtree(store, ignore_errors=True)


def bench_loading(store: Path, kind: str) -> dict:
    """Bytes and time of rank 0's slice (P = 4) against loading every array whole."""
    ds = DrivaerMLDataset(store, split="all", kind=kind, mesh=None)
    folder = store / "runs" / f"run_{ds.runs[0]}" / kind / ds.meta["order_of"]["4"]
    sizes = ds.meta["runs"][str(ds.runs[0])][kind]["sizes"]["4"]
    from meshshard.datasets._store import read_rows

    names = list(ds.meta["fields"][kind])
    t_slice, parts = _timed(lambda: [read_rows(folder / f"{n}.npy", 0, sizes[0]) for n in names])
    t_whole, whole = _timed(lambda: [np.load(folder / f"{n}.npy") for n in names])
    return {
        "rank0_of_4_bytes": sum(a.nbytes for a in parts),
        "whole_bytes": sum(a.nbytes for a in whole),
        "rank0_of_4_read_s": t_slice,
        "whole_read_s": t_whole,
    }


def main(quick: bool = False) -> dict:
    num_runs = 4
    surface_cells, volume_cells = (20_000, 40_000) if quick else (200_000, 400_000)
    sdf_points = 20_000 if quick else 100_000
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    root = Path(tempfile.mkdtemp(prefix="bench-preprocess-"))
    try:
        t_gen, _ = _timed(lambda: make_synthetic_drivaerml(root / "surface", num_runs, surface_cells, 0, seed=0))
        t_gen_vol, _ = _timed(lambda: make_synthetic_drivaerml(root / "volume", num_runs, 1000, volume_cells, seed=0))
        sdf_rows = bench_sdf(sdf_points)
        stages = {k: bench_stages(root / k, k) for k in ("surface", "volume")}
        rows = []
        for kind in ("surface", "volume"):
            for workers in (1, 2):
                rows.append(bench_throughput(root / kind, kind, workers))
        rows.append(bench_throughput(root / "volume", "volume", 1, backend="igl"))
        startup = bench_pool_startup(2)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(f"\nSigned distance, {sdf_points:,} points vs a {sdf_rows[0]['faces']:,}-face car")
    print(f"{'backend':34s} {'seconds':>9s} {'max |diff| m':>13s}")
    for r in sdf_rows:
        print(f"{r['backend']:34s} {r['seconds']:9.3f} {r['max_abs_diff']:13.2e}")
    print(f"\nPreprocessing, {num_runs} runs, parts (1, 2, 4, 8), rcb "
          f"(generation: surface {t_gen:.1f} s, volume {t_gen_vol:.1f} s)")  # fmt: skip
    print(f"{'kind':8s} {'workers':>7s} {'sdf':>5s} {'cells':>10s} {'seconds':>8s} {'cells/s':>10s}")
    for r in rows:
        print(
            f"{r['kind']:8s} {r['workers']:7d} {r['sdf']:>5s} {r['cells']:10,d} "
            f"{r['seconds']:8.2f} {r['cells_per_s']:10,.0f}"
        )
    print(f"(2 workers: spawning the pool and importing meshshard took {startup:.1f} s of that, measured apart)")
    print("\nStages of one run (one process), seconds")
    for kind, s in stages.items():
        print(f"{kind:8s} " + "  ".join(f"{k} {v:.3f}" if k != "cells" else f"{k} {v:,}" for k, v in s.items()))
    print("\nLoading one sample: rank 0 of P=4 vs every array whole")
    for r in rows:
        if "rank0_of_4_bytes" in r and r["sdf"] == "auto":
            print(
                f"{r['kind']:8s} rank 0: {r['rank0_of_4_bytes'] / 2**20:8.2f} MiB in "
                f"{r['rank0_of_4_read_s'] * 1e3:6.1f} ms; whole: {r['whole_bytes'] / 2**20:8.2f} MiB "
                f"in {r['whole_read_s'] * 1e3:6.1f} ms"
            )

    result = {
        "quick": quick,
        "cpu_count": os.cpu_count(),
        "runs": num_runs,
        "surface_cells_per_run": surface_cells,
        "volume_cells_per_run": volume_cells,
        "sdf": sdf_rows,
        "throughput": rows,
        "stages": stages,
        "pool_startup_s_2_workers": startup,
        "load_average_1min": os.getloadavg()[0],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "bench_preprocess_quick" if quick else "bench_preprocess"
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1))
    _plot(result, RESULTS / f"{name}.png")
    return result


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    sdf = [r for r in result["sdf"] if np.isfinite(r["seconds"])]
    ax1.barh([r["backend"] for r in sdf], [r["seconds"] for r in sdf], color="tab:blue")
    ax1.set_xscale("log")
    ax1.set_xlabel("seconds (log)")
    ax1.set_title(f"signed distance, {sdf[0]['points']:,} points, {sdf[0]['faces']:,} faces")
    rows = result["throughput"]
    labels = [f"{r['kind']}\n{r['workers']} w, {r['sdf']}" for r in rows]
    ax2.bar(
        labels,
        [r["cells_per_s"] for r in rows],
        color=["tab:orange" if r["kind"] == "surface" else "tab:green" for r in rows],
    )
    ax2.set_ylabel("cells / s")
    ax2.set_title(f"preprocess throughput ({result['runs']} runs, P = 1, 2, 4, 8)")
    ax2.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    main(quick=parser.parse_args().quick)
