"""Neighbour search and ghost traffic: meshshard vs scipy vs torch-cluster, plan vs ring, P=2 vs P=1.

Three parts, in one run:

1. **Local kernels** on a uniform cube of ``N`` points (1M; ``--quick``: 100k) with a radius that
   gives ~30 neighbours: ``meshshard.ops.ball_query`` (exact: sorted by distance then index,
   truncated to 32) with its scipy and grid backends, against scipy's dual-tree ``query_pairs``
   and ``sparse_distance_matrix`` (unordered pairs, nothing sorted), scipy's per-point
   ``query_ball_point`` (unsorted lists) and ``torch_cluster.radius`` (traversal-order truncation)
   when importable; kNN (k = 16) against ``cKDTree.query``. Wall and CPU seconds.
2. **Ghost traffic** at ``P = 8`` (RCB and Hilbert partitions of the same cloud, plan simulated in
   one process with :func:`meshshard.halo.simulate_halo`): bytes one exchange sends vs a ring
   that moves every point to every rank (PhysicsNeMo's sharded ball query).
3. **P = 2 vs P = 1** wall time of plan + ball query + a PointConv forward/backward (gloo ranks,
   one thread each).

    .venv/bin/python benchmarks/bench_neighbors.py [--quick]
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


def _radius(n: int) -> float:
    """Radius of a ball holding ``NEIGHBOURS`` points on average in a unit cube of ``n`` points."""
    return (NEIGHBOURS * 3 / (4 * math.pi * n)) ** (1 / 3)


def _timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def _kernels(n: int, with_grid: bool) -> dict:
    import numpy as np
    import torch
    from scipy.spatial import cKDTree

    from meshshard.ops import ball_query, knn
    from meshshard.ops._kernels import torch_cluster_available

    torch.manual_seed(0)
    pts = torch.rand(n, 3)
    x = pts.double().numpy()
    r = _radius(n)
    workers = torch.get_num_threads()
    rows: dict[str, dict] = {}
    warm = torch.rand(500, 3)  # imports (scipy.spatial) and first-call costs stay out of the timings
    for backend in ("scipy", "grid"):
        ball_query(warm, None, 0.1, 4, backend=backend)
    knn(warm, None, 4)
    cKDTree(warm.double().numpy()).query_pairs(0.1)

    def add(name, fn, note):
        out, wall, cpu = _timed(fn)
        rows[name] = {"wall_s": wall, "cpu_s": cpu, "note": note}
        return out

    nbr = add(
        "meshshard ball_query (scipy)",
        lambda: ball_query(pts, None, r, MAX_NEIGHBORS),
        "exact: sorted (distance, index), truncated",
    )
    rows["meshshard ball_query (scipy)"]["mean_neighbours"] = float(nbr.count.double().mean())
    if with_grid:
        add(
            "meshshard ball_query (grid)",
            lambda: ball_query(pts, None, r, MAX_NEIGHBORS, backend="grid"),
            "same result, pure torch cell list",
        )
    add(
        "scipy query_pairs",
        lambda: cKDTree(x).query_pairs(r, output_type="ndarray"),
        "dual tree, unordered unique pairs",
    )
    add(
        "scipy sparse_distance_matrix",
        lambda: cKDTree(x).sparse_distance_matrix(cKDTree(x), r, output_type="ndarray"),
        "dual tree, unordered pairs",
    )
    add(
        "scipy query_ball_point",
        lambda: cKDTree(x).query_ball_point(x, r, workers=workers),
        f"per point, unsorted lists, {workers} workers",
    )
    if torch_cluster_available():
        import torch_cluster

        add(
            "torch_cluster.radius",
            lambda: torch_cluster.radius(pts, pts, r, max_num_neighbors=MAX_NEIGHBORS),
            "traversal-order truncation",
        )
    add("meshshard knn k=16 (scipy)", lambda: knn(pts, None, 16), "exact, ties by index")
    add(
        "scipy cKDTree.query k=16",
        lambda: cKDTree(x).query(x, k=16, workers=workers),
        f"{workers} workers, ties unordered",
    )
    return {"num_points": n, "radius": r, "max_neighbors": MAX_NEIGHBORS, "rows": rows, "np_version": np.__version__}


def _ghosts(n: int, num_parts: int) -> dict:
    import torch

    from meshshard.halo import simulate_halo
    from meshshard.partition import partition

    torch.manual_seed(0)
    pts = torch.rand(n, 3)
    r = _radius(n)
    out = {}
    for method in ("rcb", "hilbert"):
        part = partition(pts, num_parts, method=method)
        per_rank = [pts[part.perm[part.offsets[i] : part.offsets[i + 1]]] for i in range(num_parts)]
        rep, wall, _ = _timed(lambda per_rank=per_rank: simulate_halo(per_rank, r))
        rep["simulate_s"] = wall
        rep["ratio_to_ring"] = rep["total_ghost_bytes"] / rep["total_ring_bytes"]
        rep["candidates_over_ghosts"] = sum(rep["num_candidates"]) / max(sum(rep["num_sent"]), 1)
        out[method] = rep
    return {"num_points": n, "num_parts": num_parts, "radius": r, "methods": out}


def _distributed_step(n: int, repeats: int) -> dict:
    import torch
    import torch.distributed as dist

    import meshshard as ms
    from meshshard.ops import ball_query
    from meshshard.partition import partition

    mesh = ms.init_mesh()
    world = dist.get_world_size()
    torch.manual_seed(0)
    pts = torch.rand(n, 3)
    feats = torch.randn(n, 16)
    part = partition(pts, world)
    pos = ms.scatter(pts, part, mesh)
    x = ms.scatter(feats, part, mesh).requires_grad_()
    torch.manual_seed(1)
    conv = ms.nn.PointConv(16, 32, hidden_channels=(32,))
    r = _radius(n)
    times = {"plan+ball_query": [], "pointconv fwd+bwd": []}
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        nbr = ball_query(pos, None, r, MAX_NEIGHBORS)
        dist.barrier()
        t1 = time.perf_counter()
        out = conv(x, pos, nbr)
        out.pow(2).mean().backward()
        ms.nn.sync_gradients(conv, mesh)
        dist.barrier()
        t2 = time.perf_counter()
        times["plan+ball_query"].append(t1 - t0)
        times["pointconv fwd+bwd"].append(t2 - t1)
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()} | {"num_ghosts": nbr.plan.num_ghosts}


def _scaling(n: int, repeats: int) -> dict:
    from meshshard.testing import run_distributed

    out = {}
    for world in (1, 2):
        res = run_distributed(_distributed_step, world, n, repeats, timeout=600)
        out[f"P={world}"] = {
            "plan+ball_query_s": max(r["plan+ball_query"] for r in res),
            "pointconv_fwd_bwd_s": max(r["pointconv fwd+bwd"] for r in res),
            "ghosts_per_rank": [r["num_ghosts"] for r in res],
        }
    for key in ("plan+ball_query_s", "pointconv_fwd_bwd_s"):
        out[f"speedup_{key[:-2]}"] = out["P=1"][key] / out["P=2"][key]
    return {"num_points": n, "repeats": repeats, **out}


def main(quick: bool = False) -> dict:
    n_kernel = 100_000 if quick else 1_000_000
    n_ghost = 100_000 if quick else 1_000_000
    n_scale = 30_000 if quick else 200_000
    load = os.getloadavg()
    kernels = _kernels(n_kernel, with_grid=True)
    ghosts = _ghosts(n_ghost, 8)
    scaling = _scaling(n_scale, 2 if quick else 3)

    rows = kernels["rows"]
    ref = rows["meshshard ball_query (scipy)"]
    print(
        f"\nLocal kernels: {n_kernel:,} points, r for ~{NEIGHBOURS} neighbours, "
        f"K = {MAX_NEIGHBORS} (load average at start {load[0]:.1f})"
    )
    print(f"{'kernel':<34}{'wall s':>9}{'cpu s':>9}{'x ours':>8}  note")
    for name, row in rows.items():
        row["wall_over_ours"] = row["wall_s"] / ref["wall_s"]
        print(f"{name:<34}{row['wall_s']:>9.2f}{row['cpu_s']:>9.2f}{row['wall_over_ours']:>8.2f}  {row['note']}")
    print(f"\nGhost traffic at P = {ghosts['num_parts']}, {n_ghost:,} points (one exchange, all ranks)")
    print(f"{'partition':<10}{'ghosts':>10}{'ghost MB':>10}{'ring MB':>10}{'ratio':>8}{'box/exact':>11}")
    for method, rep in ghosts["methods"].items():
        print(
            f"{method:<10}{sum(rep['num_ghosts']):>10,}{rep['total_ghost_bytes'] / 1e6:>10.2f}"
            f"{rep['total_ring_bytes'] / 1e6:>10.2f}{rep['ratio_to_ring']:>8.3f}{rep['candidates_over_ghosts']:>11.2f}"
        )
    print(f"\nP = 2 vs P = 1 ({n_scale:,} points; seconds, median of {scaling['repeats']})")
    for key in ("plan+ball_query_s", "pointconv_fwd_bwd_s"):
        print(
            f"{key:<24}P=1 {scaling['P=1'][key]:>7.2f}   P=2 {scaling['P=2'][key]:>7.2f}   "
            f"speedup {scaling['speedup_' + key[:-2]]:.2f}"
        )
    summary = {"quick": quick, "load_average_at_start": load, "kernels": kernels, "ghosts": ghosts, "scaling": scaling}
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "bench_neighbors_quick" if quick else "bench_neighbors"
    (RESULTS / f"{stem}.json").write_text(json.dumps(summary, indent=1))
    _plot(summary, RESULTS / f"{stem}.png")
    return summary


def _plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    rows = summary["kernels"]["rows"]
    names = list(rows)
    ax = axes[0]
    ax.barh(
        names,
        [rows[n]["wall_s"] for n in names],
        color=["tab:blue" if n.startswith("meshshard") else "tab:gray" for n in names],
    )
    ax.set_xlabel("wall seconds")
    ax.set_title(f"Neighbour search, {summary['kernels']['num_points']:,} points")
    ax.invert_yaxis()
    ax = axes[1]
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
    ax = axes[2]
    sc = summary["scaling"]
    keys = ("plan+ball_query_s", "pointconv_fwd_bwd_s")
    for i, p in enumerate(("P=1", "P=2")):
        ax.bar([k + 0.4 * i for k in range(len(keys))], [sc[p][k] for k in keys], 0.4, label=p)
    ax.set_xticks([k + 0.2 for k in range(len(keys))])
    ax.set_xticklabels(["plan + ball query", "PointConv fwd+bwd"])
    ax.set_ylabel("seconds")
    ax.set_title(f"P = 2 vs P = 1, {sc['num_points']:,} points")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    main(parser.parse_args().quick)
