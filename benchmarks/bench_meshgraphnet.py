"""Domain-parallel MeshGraphNet training on a synthetic surface mesh: memory, step time, halo bytes vs P.

Side by side in one run, on the same 10-block MeshGraphNet and the same triangulated surface
(a bumpy ``nx x ny`` grid, two triangles per quad, the mesh graph of ``ShardedGraph.from_cells``):

* ``P = 1``: the plain PyG model on the whole graph (plain tensors, one thread);
* ``P = 2`` and ``P = 4``: the same module under ``DomainParallel`` (gloo, one thread per rank),
  nodes split in row blocks of the grid;
* halo bytes per layer (one forward exchange of the ``hidden``-wide node latents, fp32) against
  a ring that moves every point to every rank, from ``simulate_graph_halo`` at ``P = 8`` (row
  blocks and an RCB partition of the same points) and measured on the ranks at ``P = 2, 4``.

Memory is measured as in ``bench_transolver.py``: each rank builds only its own rows and the
cells touching them, then ``gc.collect()`` and reads its RSS (baseline); the activation peak is
``ru_maxrss - baseline`` after the training steps (``MALLOC_MMAP_THRESHOLD_=65536`` in workers).
Step time: wall time of a full step (forward, MSE, backward, ``sync_gradients``, AdamW) between
barriers, mean over the timed steps after a warm-up one, with per-rank process CPU time beside it.

Run: ``.venv/bin/python benchmarks/bench_meshgraphnet.py [--quick] [--points N]`` (default 1M
points, capped to what the machine's available memory holds at ``P = 1``, about 28 KiB per point
for this model, and said so; quick: 40k).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import math
import os
import resource
import sys
import time
from pathlib import Path

import torch
from _finite import check_finite

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = dict(hidden=16, num_layers=10, mlp_layers=2)
IN_DIM, EDGE_DIM, OUT_DIM = 6, 4, 4
#: Measured P = 1 activation peak per point of this model (280 MiB at 10k points), for the default size cap.
BYTES_PER_POINT = 28 * 1024


def _feasible(n: int) -> int:
    """``n``, or fewer points when the P = 1 run would not fit in half the available memory."""
    import psutil

    cap = int(0.5 * psutil.virtual_memory().available / BYTES_PER_POINT)
    if n > cap:
        print(f"{n:,} points need ~{n * BYTES_PER_POINT / 2**30:.1f} GiB at P = 1; this machine has "
              f"{psutil.virtual_memory().available / 2**30:.1f} GiB available: running {cap:,} points")
        return cap
    return n


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _row_blocks(ny: int, parts: int) -> list[int]:
    return [ny // parts + (1 if r < ny % parts else 0) for r in range(parts)]


def _grid_points(nx: int, rows: range) -> torch.Tensor:
    """Coordinates of grid rows ``rows`` (row-major node ids ``j * nx + i``) on a bumpy surface."""
    j, i = torch.meshgrid(torch.tensor(list(rows), dtype=torch.float32), torch.arange(nx, dtype=torch.float32),
                          indexing="ij")
    u, v = i / max(nx - 1, 1), j / max(nx - 1, 1)
    z = 0.1 * torch.sin(6.0 * u) * torch.cos(4.0 * v)
    return torch.stack([u, v, z], -1).reshape(-1, 3)


def _grid_cells(nx: int, quad_rows: range) -> torch.Tensor:
    """Triangles of the quads between grid rows ``j`` and ``j + 1`` for ``j`` in ``quad_rows``."""
    j = torch.tensor(list(quad_rows), dtype=torch.long)[:, None]
    i = torch.arange(nx - 1)[None]
    a = j * nx + i
    b, c, d = a + 1, a + nx, a + nx + 1
    return torch.cat([torch.stack([a, b, d], -1), torch.stack([a, d, c], -1)]).reshape(-1, 3)


def _features(pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.cat([pos, torch.sin(6.28 * pos)], -1)
    s = pos.sum(-1, keepdim=True)
    return x, torch.cat([torch.sin(3 * s), torch.cos(2 * s), pos[:, :1] * pos[:, 1:2], s * s], -1)


def _train_rank(nx: int, ny: int, steps: int) -> dict:
    import torch.distributed as dist

    import meshshard as ms
    from meshshard.nn import DomainParallel, MeshGraphNet
    from meshshard.ops import ShardedGraph

    rank, world = dist.get_rank(), dist.get_world_size()
    blocks = _row_blocks(ny, world)
    r0 = sum(blocks[:rank])
    r1 = r0 + blocks[rank]
    pos = _grid_points(nx, range(r0, r1))
    cells = _grid_cells(nx, range(max(r0 - 1, 0), min(r1, ny - 1)))  # every cell touching my rows
    mesh = None
    if world > 1:
        mesh = ms.init_mesh()
        pos = ms.ShardTensor.from_local(pos, mesh, sizes=[b * nx for b in blocks])
    t_build = time.perf_counter()
    graph = ShardedGraph.from_cells(pos, cells)
    t_build = time.perf_counter() - t_build
    del cells
    x, target = _features(graph.pos[: graph.num_owned])
    rel, dist_ = graph.edge_vectors()
    edge_attr = torch.cat([rel, dist_], -1) * nx
    torch.manual_seed(0)
    model = MeshGraphNet(IN_DIM, EDGE_DIM, OUT_DIM, **MODEL)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    runner = DomainParallel(model, graph)
    target = graph.wrap(target)
    gc.collect()
    dist.barrier()
    baseline = _rss()
    walls, cpus, losses = [], [], []
    halo = {}
    for step in range(steps + 1):
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        with ms.CommCounter() as cc:
            opt.zero_grad(set_to_none=True)
            loss = ((runner(x, graph.edge_index, edge_attr) - target) ** 2).mean()
            loss.backward()
            if mesh is not None:
                ms.nn.sync_gradients(model, mesh)
            opt.step()
        dist.barrier()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        losses.append(float(loss.detach()))
        if step == 0:
            halo = {"all_to_all_per_step": cc.counts.get("all_to_all", 0),
                    "all_to_all_bytes_per_step": cc.bytes_sent.get("all_to_all", 0)}
    check_finite(f"MeshGraphNet training losses at P={dist.get_world_size()} (rank {rank})", losses)
    peak = _peak_rss()
    return {
        "rank": rank,
        "n_local": graph.num_owned,
        "num_ghosts": graph.num_ghosts,
        "num_edges": graph.num_edges,
        "halo_bytes_per_layer": graph.bytes_per_exchange(MODEL["hidden"] * 4)["send"],
        **halo,
        "build_s": t_build,
        "baseline_rss_mb": baseline / 2**20,
        "peak_rss_mb": peak / 2**20,
        "activation_peak_mb": (peak - baseline) / 2**20,
        "step_s": sum(walls[1:]) / steps,
        "cpu_s": sum(cpus[1:]) / steps,
        "losses": losses,
    }


def _worker(name: str):
    mod = sys.modules[__name__] if __name__ != "__main__" else importlib.import_module("bench_meshgraphnet")
    return getattr(mod, name)


def _run(world: int, name: str, *args) -> list[dict]:
    from meshshard.testing import WorkerPool

    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    pool = WorkerPool(world, backend="gloo", timeout=3600.0, num_threads=1)
    try:
        return pool.run(_worker(name), *args, deadline=7200.0)
    finally:
        pool.close()


def _simulate(nx: int, ny: int, parts: int) -> dict:
    """Halo vs ring bytes per layer at ``parts`` ranks: row blocks and an RCB partition."""
    from meshshard.ops import cells_to_edges, simulate_graph_halo
    from meshshard.partition import partition

    row_bytes = MODEL["hidden"] * 4
    edges = cells_to_edges(_grid_cells(nx, range(ny - 1)))
    rows = simulate_graph_halo(edges, [b * nx for b in _row_blocks(ny, parts)], row_bytes=row_bytes)
    part = partition(_grid_points(nx, range(ny)), parts, method="rcb")
    inverse = torch.empty_like(part.perm)
    inverse[part.perm] = torch.arange(part.perm.numel())
    rcb = simulate_graph_halo(inverse[edges], part.sizes.tolist(), row_bytes=row_bytes)
    out = {}
    for name, sim in (("row_blocks", rows), ("rcb", rcb)):
        out[name] = {
            "num_ghosts": sim["num_ghosts"],
            "halo_bytes_per_layer": sim["total_ghost_bytes"],
            "ring_bytes_per_layer": sim["total_ring_bytes"],
            "ratio": sim["total_ghost_bytes"] / sim["total_ring_bytes"],
        }
    return out


def _plot(rows: list[dict], sim: dict, path: Path, n: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_m, ax_t, ax_h) = plt.subplots(1, 3, figsize=(14, 4.2))
    labels = [r["label"] for r in rows]
    mem = [r["activation_peak_mb"] for r in rows]
    ax_m.bar(labels, mem, color="#4c72b0")
    ax_m.set_ylabel("per-rank activation peak (MiB, max over ranks)")
    ax_m.set_title(f"memory, 10-block MeshGraphNet, {n:,} points")
    for i, m in enumerate(mem):
        ax_m.annotate(f"{m / mem[0]:.2f}x", (i, m), ha="center", va="bottom")
    xs = range(len(labels))
    ax_t.bar([i - 0.2 for i in xs], [r["step_s"] for r in rows], width=0.4, label="wall (slowest rank)")
    ax_t.bar([i + 0.2 for i in xs], [r["cpu_s"] for r in rows], width=0.4, label="process CPU (max rank)")
    ax_t.set_xticks(list(xs), labels)
    ax_t.set_ylabel("seconds per training step")
    ax_t.set_title("step time (1 thread per rank, loaded 2-core machine)")
    ax_t.legend()
    names = list(sim)
    ax_h.bar([f"{k}\nhalo" for k in names] + ["ring"],
             [sim[k]["halo_bytes_per_layer"] / 2**20 for k in names] + [sim[names[0]]["ring_bytes_per_layer"] / 2**20])
    ax_h.set_yscale("log")
    ax_h.set_ylabel("MiB per layer, all ranks (P = 8, simulated)")
    ax_h.set_title("halo exchange vs ring")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(quick: bool = False, points: int | None = None) -> dict:
    n_target = points or (40_000 if quick else _feasible(1_000_000))
    nx = ny = int(math.isqrt(n_target))
    n = nx * ny
    steps = 2
    rows = []
    for world in (1, 2, 4):
        load_before = os.getloadavg()[0]
        ranks = _run(world, "_train_rank", nx, ny, steps)
        rows.append({
            "label": f"P={world}",
            "world_size": world,
            "activation_peak_mb": max(r["activation_peak_mb"] for r in ranks),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in ranks),
            "step_s": max(r["step_s"] for r in ranks),
            "cpu_s": max(r["cpu_s"] for r in ranks),
            "halo_bytes_per_layer": sum(r["halo_bytes_per_layer"] for r in ranks),
            "ring_bytes_per_layer": (world - 1) * n * MODEL["hidden"] * 4,
            "load_avg_1min": max(load_before, os.getloadavg()[0]),
            "ranks": ranks,
        })
    base = rows[0]
    for r in rows:
        r["memory_vs_p1"] = r["activation_peak_mb"] / base["activation_peak_mb"]
        r["speedup_vs_p1"] = base["step_s"] / r["step_s"]
        r["cpu_speedup_vs_p1"] = base["cpu_s"] / r["cpu_s"]
    check_finite("MeshGraphNet training losses", [r["losses"] for row in rows for r in row["ranks"]])
    ref = base["ranks"][0]["losses"]
    for r in rows:  # the same trajectory on every P (exactness, not just speed)
        r["losses_match_p1"] = all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(r["ranks"][0]["losses"], ref))
    sim = _simulate(nx, ny, 8)
    # the 1M-point mesh of the goal, simulated even when it is too big to train here
    sim_1m = sim if n >= 1_000_000 else _simulate(1000, 1000, 8)
    print(f"\nMeshGraphNet {MODEL}, {n:,} points ({nx} x {ny} grid, {base['ranks'][0]['num_edges']:,} edges); "
          "AdamW step, fp32, gloo, 1 thread/rank")
    print(f"{'config':<6} {'act. peak MiB':>14} {'vs P=1':>7} {'step s':>8} {'speedup':>8} {'CPU s':>7} "
          f"{'CPU spd':>8} {'halo B/layer':>13} {'ring B/layer':>13} {'load':>5}")
    for r in rows:
        print(f"{r['label']:<6} {r['activation_peak_mb']:>14.0f} {r['memory_vs_p1']:>7.2f} {r['step_s']:>8.2f} "
              f"{r['speedup_vs_p1']:>8.2f} {r['cpu_s']:>7.2f} {r['cpu_speedup_vs_p1']:>8.2f} "
              f"{r['halo_bytes_per_layer']:>13,} {r['ring_bytes_per_layer']:>13,} {r['load_avg_1min']:>5.1f}")
    for name, s in sim_1m.items():
        print(f"P=8 simulated, 1,000,000 points ({name}): halo {s['halo_bytes_per_layer']:,} B/layer vs ring "
              f"{s['ring_bytes_per_layer']:,} B/layer = {s['ratio']:.4f}x")
    for name, s in sim.items():
        print(f"P=8 simulated, {n:,} points ({name}): halo {s['halo_bytes_per_layer']:,} B/layer vs ring "
              f"{s['ring_bytes_per_layer']:,} B/layer = {s['ratio']:.4f}x")
    losses = [r["ranks"][0]["losses"] for r in rows]
    print("losses per step (P = 1, 2, 4):", losses, "match:", [r["losses_match_p1"] for r in rows])
    p2, p4 = rows[1], rows[2]
    targets = {
        "p4_memory_ratio": p4["memory_vs_p1"],
        "p4_memory_met": p4["memory_vs_p1"] <= 0.30,
        "p2_speedup": p2["speedup_vs_p1"],
        "p2_cpu_speedup": p2["cpu_speedup_vs_p1"],
        "p2_speedup_met": p2["speedup_vs_p1"] >= 1.6,
        "p8_halo_ratio_rcb": sim["rcb"]["ratio"],
        "p8_halo_ratio_rcb_1m_points": sim_1m["rcb"]["ratio"],
        "p8_halo_met": sim_1m["rcb"]["ratio"] <= 0.1,
        "load_avg_1min_max": max(r["load_avg_1min"] for r in rows),
    }
    print(f"targets: P=4 memory {targets['p4_memory_ratio']:.2f}x (<= 0.30: {targets['p4_memory_met']}); "
          f"P=2 speedup {targets['p2_speedup']:.2f}x wall, {targets['p2_cpu_speedup']:.2f}x CPU; "
          f"P=8 halo/ring {targets['p8_halo_ratio_rcb']:.4f} (<= 0.1: {targets['p8_halo_met']}); "
          f"load average up to {targets['load_avg_1min_max']:.1f} on {os.cpu_count()} cores")
    result = {
        "benchmark": "meshgraphnet",
        "num_points": n,
        "grid": [nx, ny],
        "model": MODEL,
        "timed_steps": steps,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "training": rows,
        "simulated_p8": sim,
        "simulated_p8_1m_points": sim_1m,
        "targets": targets,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "bench_meshgraphnet" if points is None and not quick else f"bench_meshgraphnet_{n}"
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2))
    _plot(rows, sim, RESULTS / f"{stem}.png", n)
    print(f"saved {RESULTS / (stem + '.json')} and {RESULTS / (stem + '.png')}")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="40k points instead of 1M")
    parser.add_argument("--points", type=int, default=None, help="points (rounded down to a square grid)")
    args = parser.parse_args()
    main(args.quick, args.points)
