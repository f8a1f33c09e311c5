"""Neighbour search: meshshard's fused kernel vs scipy, pykdtree and torch-cluster; ghosts; P=2 vs P=1.

Three parts, in one run, with the thread count set explicitly (``--threads``, default 2: torch,
numba, OpenMP and the k-d trees' ``workers`` all get it):

1. **Local kernels** on ``N`` points (1M; ``--quick``: 100k) of two clouds, a uniform cube and a
   car-like surface (area-uniform samples of :func:`meshshard.datasets.synthetic.car_surface`),
   with the radius that holds ~30 neighbours. Each exact meshshard op is timed next to the peer
   that computes the same thing, build included: ``ball_query(K=32)`` (the K nearest within r,
   sorted) vs ``cKDTree(pts).query(pts, k=32, distance_upper_bound=r, workers)`` and pykdtree's
   ``query`` (when importable), and ``knn(k=16)`` vs ``cKDTree.query(k=16)``; plus
   ``torch_cluster.radius`` (when importable) and meshshard's previous scipy path
   (``backend="scipy"``). Wall and CPU seconds, and ``ours / peer`` wall ratios; and the peak
   memory of ``ball_query`` over the size of its result (one process per backend).
2. **Ghost traffic** at ``P = 8`` (RCB and Hilbert, :func:`meshshard.halo.simulate_halo`): bytes
   one exchange sends vs a ring that moves every point to every rank.
3. **P = 2 vs P = 1**: plan + feature exchange + ball query (gloo ranks, one thread each), against
   one process with one thread and with two.

    .venv/bin/python benchmarks/bench_neighbors.py [--quick] [--threads 2] [--cuda]

``--cuda`` adds the fused kernel's CUDA build (``backend="numba"``) and the pure-torch grid at 1M
and 10M points against ``torch_cluster.radius`` on CUDA and warp's ``HashGrid`` (each when
importable), with an exactness check against the CPU result.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
NEIGHBOURS = 30
MAX_NEIGHBORS = 32
KNN = 16


def _timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def _set_threads(threads: int) -> None:
    import torch

    os.environ["OMP_NUM_THREADS"] = str(threads)  # pykdtree (OpenMP) reads it
    torch.set_num_threads(threads)


# -- clouds ---------------------------------------------------------------------------------------
def _uniform(n: int):
    import torch

    g = torch.Generator().manual_seed(0)
    pts = torch.rand(n, 3, generator=g)
    return pts, (NEIGHBOURS * 3 / (4 * math.pi * n)) ** (1 / 3)


def _car_surface(n: int):
    """``n`` area-uniform points on a car-like body, and the radius holding ~30 of them."""
    import numpy as np
    import torch

    from meshshard.datasets.synthetic import CarParameters, car_surface

    rng = np.random.default_rng(0)
    verts, faces = car_surface(CarParameters.sample(rng), 200_000)
    tri = verts[faces]
    area = 0.5 * np.linalg.norm(np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), axis=1)
    pick = rng.choice(len(faces), size=n, p=area / area.sum())
    u, v = rng.random(n), rng.random(n)
    flip = u + v > 1
    u[flip], v[flip] = 1 - u[flip], 1 - v[flip]
    t = tri[pick]
    pts = t[:, 0] + u[:, None] * (t[:, 1] - t[:, 0]) + v[:, None] * (t[:, 2] - t[:, 0])
    return torch.from_numpy(pts.astype(np.float32)), math.sqrt(NEIGHBOURS * area.sum() / (math.pi * n))


CLOUDS = {"uniform cube": _uniform, "car surface": _car_surface}


# -- part 1 ---------------------------------------------------------------------------------------
def _kernel_rows(pts, r: float, threads: int, with_old: bool, PyKDTree) -> dict:
    """Timings of the exact meshshard ops and their peers on one cloud."""
    from scipy.spatial import cKDTree

    from meshshard.kernels import torch_cluster_available
    from meshshard.ops import ball_query, knn

    x = pts.double().numpy()
    rows: dict[str, dict] = {}

    def add(name, fn, note):
        res, wall, cpu = _timed(fn)
        rows[name] = {"wall_s": wall, "cpu_s": cpu, "note": note}
        return res

    nbr = add("meshshard ball_query K=32", lambda: ball_query(pts, None, r, MAX_NEIGHBORS), "exact, fused kernel")
    mean_nbrs = float(nbr.count.double().mean())
    del nbr
    add(
        "cKDTree.query k=32 dub=r",
        lambda: cKDTree(x).query(x, k=MAX_NEIGHBORS, distance_upper_bound=r, workers=threads),
        "build included; ties by traversal",
    )
    if PyKDTree is not None:
        add(
            "pykdtree query k=32 dub=r",
            lambda: PyKDTree(x).query(x, k=MAX_NEIGHBORS, distance_upper_bound=r),
            "build included; OpenMP",
        )
    if torch_cluster_available():
        import torch_cluster

        add(
            "torch_cluster.radius K=32",
            lambda: torch_cluster.radius(pts, pts, r, max_num_neighbors=MAX_NEIGHBORS),
            "traversal-order truncation",
        )
    if with_old:
        add(
            "meshshard ball_query (scipy)",
            lambda: ball_query(pts, None, r, MAX_NEIGHBORS, backend="scipy"),
            "previous path: dual tree + sort",
        )
    add("meshshard knn k=16", lambda: knn(pts, None, KNN), "exact, fused kernel")
    add(
        "cKDTree.query k=16",
        lambda: cKDTree(x).query(x, k=KNN, workers=threads),
        "build included; ties by traversal",
    )
    if PyKDTree is not None:
        add("pykdtree query k=16", lambda: PyKDTree(x).query(x, k=KNN), "build included; OpenMP")
    if with_old:
        add("meshshard knn k=16 (scipy)", lambda: knn(pts, None, KNN, backend="scipy"), "previous path")
    ours_ball, ours_knn = rows["meshshard ball_query K=32"]["wall_s"], rows["meshshard knn k=16"]["wall_s"]
    for name, row in rows.items():
        if not name.startswith("meshshard"):
            ours = ours_knn if "16" in name else ours_ball
            row["ours_over_peer"] = ours / row["wall_s"]
    return {"radius": r, "mean_neighbours": mean_nbrs, "rows": rows}


def _kernels(n: int, threads: int, with_old: bool) -> dict:
    import numpy as np

    from meshshard.ops import ball_query, knn

    try:
        from pykdtree.kdtree import KDTree as PyKDTree
    except ImportError:
        PyKDTree = None
    warm = _uniform(2000)[0]  # imports, JIT cache loading and first-call costs stay out of the timings
    ball_query(warm, None, 0.1, 4)
    knn(warm, None, 4)
    ball_query(warm, None, 0.1, 4, backend="scipy")
    out = {}
    for cloud, make in CLOUDS.items():
        pts, r = make(n)
        out[cloud] = _kernel_rows(pts, r, threads, with_old, PyKDTree)
    return {"num_points": n, "threads": threads, "np_version": np.__version__, "clouds": out}


_PEAK = """
import math, resource, sys, torch
torch.set_num_threads({threads})
from meshshard.ops import ball_query
n = {n}
pts = torch.rand(n, 3, generator=torch.Generator().manual_seed(0))
ball_query(pts[:2000], None, 0.1, 4, backend="{backend}")
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
nbr = ball_query(pts, None, (30 * 3 / (4 * math.pi * n)) ** (1 / 3), {k}, backend="{backend}")
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024, nbr.index.numel() * 16)
"""


def _peak_memory(n: int, threads: int) -> dict:
    """Peak RSS growth of one ``ball_query`` (own process per backend) over its ``(N, K)`` output."""
    import subprocess
    import sys

    out = {}
    for backend in ("numba", "scipy"):
        code = _PEAK.format(threads=threads, n=n, backend=backend, k=MAX_NEIGHBORS)
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        peak, returned = (int(v) for v in res.stdout.split())
        out[backend] = {"peak_bytes": peak, "returned_bytes": returned, "peak_over_returned": peak / returned}
    return out


# -- part 2 ---------------------------------------------------------------------------------------
def _ghosts(n: int, num_parts: int) -> dict:
    from meshshard.halo import simulate_halo
    from meshshard.partition import partition

    pts, r = _uniform(n)
    out = {}
    for method in ("rcb", "hilbert"):
        part = partition(pts, num_parts, method=method)
        per_rank = [pts[part.perm[part.offsets[i] : part.offsets[i + 1]]] for i in range(num_parts)]
        rep, wall, _ = _timed(lambda per_rank=per_rank: simulate_halo(per_rank, r).to_dict())
        rep["simulate_s"] = wall
        rep["ratio_to_ring"] = rep["total_ghost_bytes"] / rep["total_ring_bytes"]
        rep["candidates_over_ghosts"] = sum(rep["num_candidates"]) / max(sum(rep["num_sent"]), 1)
        out[method] = rep
    return {"num_points": n, "num_parts": num_parts, "radius": r, "methods": out}


# -- part 3 ---------------------------------------------------------------------------------------
def _sharded_step(n: int, repeats: int, threads: int) -> dict:
    import torch
    import torch.distributed as dist

    import meshshard as ms
    from meshshard.ops import ball_query
    from meshshard.partition import partition

    torch.set_num_threads(threads)
    mesh = ms.init_mesh()
    world = dist.get_world_size()
    pts, r = _uniform(n)
    feats = torch.randn(n, 16, generator=torch.Generator().manual_seed(1))
    part = partition(pts, world)
    pos = ms.scatter(pts, part, mesh)
    x = ms.scatter(feats, part, mesh)
    ball_query(pos, None, r, 4)  # warm: JIT cache, pools
    times, cpu = [], []
    for _ in range(repeats):
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        nbr = ball_query(pos, None, r, MAX_NEIGHBORS)
        nbr.plan.exchange(x)
        cpu.append(time.process_time() - c0)  # this rank's own work: a proxy that the load hardly moves
        dist.barrier()
        times.append(time.perf_counter() - t0)
    median = len(times) // 2
    return {"seconds": sorted(times)[median], "cpu_s": sorted(cpu)[median], "num_ghosts": nbr.plan.num_ghosts}


def _scaling(n: int, repeats: int) -> dict:
    from meshshard.testing import run_distributed

    out = {}
    for label, world, threads in (("P=1, 1 thread", 1, 1), ("P=1, 2 threads", 1, 2), ("P=2, 1 thread each", 2, 1)):
        res = run_distributed(_sharded_step, world, n, repeats, threads, timeout=900)
        out[label] = {
            "seconds": max(r["seconds"] for r in res),
            "cpu_s_per_rank": [r["cpu_s"] for r in res],
            "ghosts_per_rank": [r["num_ghosts"] for r in res],
        }
    base = out["P=1, 1 thread"]["seconds"]
    for row in out.values():
        row["over_P1_1thread"] = row["seconds"] / base
    return {"num_points": n, "repeats": repeats, "rows": out}


# -- CUDA (ready to run where a GPU is lent) -----------------------------------------------------
def _cuda(sizes: tuple[int, ...]) -> dict:
    import torch

    from meshshard.ops import ball_query

    dev = torch.device("cuda")
    out = {}
    for n in sizes:
        pts, r = _uniform(n)
        g = pts.to(dev)
        rows = {}

        def add(name, fn, rows=rows):
            fn()  # compile / warm
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            res = fn()
            torch.cuda.synchronize()
            rows[name] = time.perf_counter() - t0
            return res

        fused = add("meshshard numba (cuda)", lambda g=g, r=r: ball_query(g, None, r, MAX_NEIGHBORS, backend="numba"))
        if n <= 1_000_000:
            add("meshshard grid (cuda)", lambda g=g, r=r: ball_query(g, None, r, MAX_NEIGHBORS, backend="grid"))
            cpu = ball_query(pts, None, r, MAX_NEIGHBORS)
            rows["exact_vs_cpu"] = bool(torch.equal(fused.index.cpu(), cpu.index))
        try:
            import torch_cluster

            add("torch_cluster.radius (cuda)", lambda g=g, r=r: torch_cluster.radius(g, g, r, max_num_neighbors=32))
        except ImportError:
            pass
        try:
            import warp as wp

            wp.init()
            wpts = wp.from_torch(g.contiguous(), dtype=wp.vec3)
            grid = wp.HashGrid(128, 128, 128, device="cuda:0")
            add("warp HashGrid.build", lambda wpts=wpts, r=r, grid=grid: grid.build(wpts, r))
        except ImportError:
            pass
        out[n] = rows
    return out


def main(quick: bool = False, threads: int = 2, cuda: bool = False) -> dict:
    _set_threads(threads)
    n_kernel = 100_000 if quick else 1_000_000
    n_ghost = 100_000 if quick else 1_000_000
    n_scale = 100_000 if quick else 1_000_000
    load = os.getloadavg()
    kernels = _kernels(n_kernel, threads, with_old=True)
    memory = _peak_memory(n_kernel, threads)
    ghosts = _ghosts(n_ghost, 8)
    scaling = _scaling(n_scale, 3)
    cuda_rows = _cuda((1_000_000, 10_000_000)) if cuda else None
    load_end = os.getloadavg()

    print(
        f"\nLocal kernels: {n_kernel:,} points, ~{NEIGHBOURS} neighbours, {threads} threads, wall seconds "
        f"(load average {load[0]:.1f} at start, {load_end[0]:.1f} at end on {os.cpu_count()} CPUs)"
    )
    for cloud, rep in kernels["clouds"].items():
        print(f"\n{cloud}: r = {rep['radius']:.4g}, mean neighbours within r {rep['mean_neighbours']:.1f}")
        print(f"{'kernel':<32}{'wall s':>9}{'cpu s':>9}{'ours/peer':>11}  note")
        for name, row in rep["rows"].items():
            ratio = f"{row['ours_over_peer']:.2f}" if "ours_over_peer" in row else ""
            print(f"{name:<32}{row['wall_s']:>9.2f}{row['cpu_s']:>9.2f}{ratio:>11}  {row['note']}")
    print("\nPeak memory of ball_query K=32 (RSS growth over the returned int64 index + float64 distances)")
    for backend, row in memory.items():
        print(f"{backend:<8}{row['peak_bytes'] / 2**20:>8.0f} MiB   x{row['peak_over_returned']:.2f} of the result")
    print(f"\nGhost traffic at P = {ghosts['num_parts']}, {n_ghost:,} points (one exchange, all ranks)")
    print(f"{'partition':<10}{'ghosts':>10}{'ghost MB':>10}{'ring MB':>10}{'ratio':>8}{'box/exact':>11}")
    for method, rep in ghosts["methods"].items():
        print(
            f"{method:<10}{sum(rep['num_ghosts']):>10,}{rep['total_ghost_bytes'] / 1e6:>10.2f}"
            f"{rep['total_ring_bytes'] / 1e6:>10.2f}{rep['ratio_to_ring']:>8.3f}{rep['candidates_over_ghosts']:>11.2f}"
        )
    print(f"\nPlan + exchange + ball query K=32, {n_scale:,} points (median of {scaling['repeats']}, slowest rank)")
    for label, row in scaling["rows"].items():
        cpu = ", ".join(f"{c:.2f}" for c in row["cpu_s_per_rank"])
        ratio = row["over_P1_1thread"]
        print(f"{label:<22}{row['seconds']:>8.2f} s   x{ratio:.2f} of P=1, 1 thread   cpu s per rank {cpu}")
    if cuda_rows:
        print("\nCUDA (seconds)")
        for n, rows in cuda_rows.items():
            print(n, rows)
    summary = {
        "quick": quick,
        "threads": threads,
        "load_average_at_start": load,
        "load_average_at_end": load_end,
        "kernels": kernels,
        "peak_memory": memory,
        "ghosts": ghosts,
        "scaling": scaling,
        "cuda": cuda_rows,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "bench_neighbors_quick" if quick else "bench_neighbors"
    (RESULTS / f"{stem}.json").write_text(json.dumps(summary, indent=1))
    _plot(summary, RESULTS / f"{stem}.png")
    return summary


def _plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clouds = summary["kernels"]["clouds"]
    fig, axes = plt.subplots(1, len(clouds) + 2, figsize=(6 * (len(clouds) + 2), 4.8))
    for ax, (cloud, rep) in zip(axes, clouds.items()):
        names = list(rep["rows"])
        ax.barh(
            names,
            [rep["rows"][k]["wall_s"] for k in names],
            color=["tab:blue" if k.startswith("meshshard") else "tab:gray" for k in names],
        )
        ax.set_xlabel("wall seconds")
        ax.set_title(f"{cloud}, {summary['kernels']['num_points']:,} points, {summary['threads']} threads")
        ax.invert_yaxis()
    ax = axes[len(clouds)]
    ghosts = summary["ghosts"]
    for i, (method, rep) in enumerate(ghosts["methods"].items()):
        ranks = range(len(rep["ghost_bytes"]))
        ax.bar([r + 0.4 * i for r in ranks], [b / 1e6 for b in rep["ghost_bytes"]], 0.4, label=f"plan ({method})")
    ax.plot(list(range(len(rep["ring_bytes"]))), [b / 1e6 for b in rep["ring_bytes"]], "k--", label="ring")
    ax.set_yscale("log")
    ax.set_xlabel("rank")
    ax.set_ylabel("MB sent per exchange (xyz float32)")
    ax.set_title(f"Ghost traffic, P = {ghosts['num_parts']}, {ghosts['num_points']:,} points")
    ax.legend()
    ax = axes[-1]
    sc = summary["scaling"]["rows"]
    ax.bar(list(sc), [row["seconds"] for row in sc.values()], color=["tab:gray", "tab:gray", "tab:blue"])
    ax.set_ylabel("seconds")
    ax.set_title(f"plan + exchange + ball query, {summary['scaling']['num_points']:,} points")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100k points instead of 1M")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cuda", action="store_true", help="add the CUDA rows (needs a GPU)")
    args = parser.parse_args()
    main(args.quick, args.threads, args.cuda)
