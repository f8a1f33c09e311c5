"""Sharded Transolver and Transolver++ training: per-rank memory, points per rank, step time vs P; 8.8M-point inference.

Side by side in one run, on the same model and the same number of points, for the published
Transolver (``plain``) and Transolver++ (``plus``: adaptive temperature, Gumbel-softmax slices keyed by
global point id):

* ``P = 1``: the single-process model on a plain tensor (the baseline, one thread);
* ``P = 2`` and ``P = 4``: the same module on a ``ShardTensor`` (gloo, one thread per rank);
* ``P = 1`` with gradient checkpointing (the single-device alternative for memory);
* **points per rank at a fixed memory budget**: the per-rank activation peak is linear in the
  rank's points (the only replicated activations are the ``H x M`` slice tokens), so
  ``budget / (activation peak / N_local)`` points fit on a rank and ``P`` times as many on ``P``
  ranks; derived from the measured peaks (a linear model, stated as such), also for a
  DrivaerML-scale width (``C=256, L=8, H=8, M=32``) measured on a small cloud;
* inference on one process: the full forward under ``no_grad`` vs exact ``chunked_forward`` (same
  output: checksums), and exact chunked inference of an **8.8M-point** surface (the DrivaerML
  surface size) with its peak memory.

How memory is measured: every configuration runs in fresh worker processes. Each rank builds its
model, optimizer and **only its own shard** of the input (no rank ever holds the whole cloud),
runs ``gc.collect()``, and reads its resident set size (``psutil``) as the baseline. After the
training steps it reads the peak RSS of the process (``resource.getrusage().ru_maxrss``). The
*activation peak* is ``peak RSS - baseline``: what the forward/backward/optimizer step added on
top of the model and the input shard (autograd activations, gradients, optimizer state,
temporaries, communication buffers). glibc's ``MALLOC_MMAP_THRESHOLD_`` is pinned to 64 KiB in
the workers so that every tensor buffer is its own mapping, unmapped when freed: otherwise glibc
raises the threshold after the first frees, serves later tensors from the heap and keeps freed
pages resident, and RSS overstates live memory (here it hid most of checkpointing's saving).
Step time is the wall time of a full training step (forward, MSE loss, backward,
``sync_gradients``, AdamW) framed by barriers, so it is the slowest rank's; the mean over the
timed steps after one warm-up step is reported, with each rank's process CPU time beside it (the
CPU time is immune to other jobs on the machine, the wall time is not; the 1-minute load average
is recorded).

Run: ``.venv/bin/python benchmarks/bench_transolver.py [--quick] [--points N] [--surface-points N]``
(default: 250k training points, 8.8M inference points; quick: 50k and 880k).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import resource
import sys
import time
from pathlib import Path

import torch
from _finite import check_finite

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = dict(n_hidden=32, n_layers=2, n_head=2, slice_num=16, mlp_ratio=2)
LARGE = dict(n_hidden=256, n_layers=8, n_head=8, slice_num=32, mlp_ratio=2)  # DrivaerML-scale width
IN_DIM, OUT_DIM = 6, 4
BUDGET_MB = 1024  # per-rank activation budget for the small model's points-per-rank figure
LARGE_BUDGET_MB = 80 * 1024  # an 80 GB accelerator, for the DrivaerML-scale configuration


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _even_sizes(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if r < n % parts else 0) for r in range(parts)]


def _local_cloud(n_local: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's points: features (position and a Fourier feature) and a smooth target field."""
    gen = torch.Generator().manual_seed(1000 + rank)
    pos = torch.rand(1, n_local, 3, generator=gen)
    x = torch.cat([pos, torch.sin(6.28 * pos)], dim=-1)
    s = pos.sum(-1, keepdim=True)
    target = torch.cat([torch.sin(3 * s), torch.cos(2 * s), pos[..., :1] * pos[..., 1:2], s * s], dim=-1)
    return x, target


def _train_rank(
    n_global: int, steps: int, checkpoint: bool, variant: str = "plain", config: dict | None = None
) -> dict:
    """One rank of a training run: returns its memory and timing figures."""
    import torch.distributed as dist

    import meshshard as ms

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = ms.nn.Transolver(IN_DIM, OUT_DIM, **(config or MODEL), checkpoint=checkpoint, variant=variant)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sizes = _even_sizes(n_global, world)
    x, target = _local_cloud(sizes[rank], rank)
    mesh = None
    if world > 1:
        mesh = ms.init_mesh()
        x = ms.ShardTensor.from_local(x, mesh, sizes, dim=1)
        target = ms.ShardTensor.from_local(target, mesh, sizes, dim=1)
    gc.collect()
    dist.barrier()
    baseline = _rss()
    walls, cpus, losses = [], [], []
    for _ in range(steps + 1):
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        loss = (model(x) - target).pow(2).mean()
        loss.backward()
        if mesh is not None:
            ms.nn.sync_gradients(model, mesh)
        opt.step()
        dist.barrier()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        losses.append(float(loss.detach()))
    check_finite(f"{variant} training losses at P={world} (rank {rank})", losses)
    peak = _peak_rss()
    return {
        "rank": rank,
        "n_local": sizes[rank],
        "baseline_rss_mb": baseline / 2**20,
        "peak_rss_mb": peak / 2**20,
        "activation_peak_mb": (peak - baseline) / 2**20,
        "step_s": sum(walls[1:]) / steps,
        "cpu_s": sum(cpus[1:]) / steps,
        "losses": losses,
    }


def _infer_rank(n_global: int, chunk_size: int | None, variant: str = "plain") -> dict:
    """Single-process inference, full (``chunk_size=None``) or chunked; memory and time."""
    import meshshard as ms

    torch.manual_seed(0)
    model = ms.nn.Transolver(IN_DIM, OUT_DIM, **MODEL, variant=variant).eval()
    x, _ = _local_cloud(n_global, 0)
    gc.collect()
    baseline = _rss()
    t0 = time.perf_counter()
    with torch.no_grad():
        y = model(x) if chunk_size is None else ms.nn.chunked_forward(model, x, chunk_size)
    wall = time.perf_counter() - t0
    check_finite(f"{variant} inference output ({n_global:,} points)", y)
    peak = _peak_rss()
    return {
        "activation_peak_mb": (peak - baseline) / 2**20,
        "peak_rss_mb": peak / 2**20,
        "time_s": wall,
        "checksum": float(y.double().sum()),
    }


def _worker(name: str):
    # Workers import this module by name (sys.path is forwarded), also when it runs as a script.
    mod = sys.modules[__name__] if __name__ != "__main__" else importlib.import_module("bench_transolver")
    return getattr(mod, name)


def _run(world: int, name: str, *args) -> list[dict]:
    from meshshard.testing import WorkerPool

    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # inherited by the spawned workers (see above)
    pool = WorkerPool(world, backend="gloo", timeout=1800.0, num_threads=1)
    try:
        return pool.run(_worker(name), *args, deadline=3600.0)
    finally:
        pool.close()


def _plot(rows: list[dict], infer: list[dict], path: Path, n: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(19, 4.4))
    ax_m, ax_t, ax_p, ax_i = axes
    labels = [f"{r['variant']}\n{r['label']}" for r in rows]
    colors = ["#4c72b0" if r["variant"] == "plain" else "#c44e52" for r in rows]
    colors = [c if not r["checkpoint"] else "#999999" for c, r in zip(colors, rows)]
    xs = list(range(len(rows)))
    ax_m.bar(xs, [r["activation_peak_mb"] for r in rows], color=colors)
    ax_m.set_xticks(xs, labels, fontsize=7)
    ax_m.set_ylabel("per-rank activation peak (MiB, max over ranks)")
    ax_m.set_title(f"memory, {n:,} points")
    ax_t.bar([i - 0.2 for i in xs], [r["step_s"] for r in rows], width=0.4, color=colors, label="wall (slowest rank)")
    ax_t.bar([i + 0.2 for i in xs], [r["cpu_s"] for r in rows], width=0.4, color="#dd8452", label="CPU (max rank)")
    ax_t.set_xticks(xs, labels, fontsize=7)
    ax_t.set_ylabel("seconds per training step")
    ax_t.set_title("step time (1 thread per rank, loaded 2-core machine)")
    ax_t.legend(fontsize=7)
    ax_p.bar(xs, [r["points_at_budget_total"] / 1e6 for r in rows], color=colors)
    ax_p.set_xticks(xs, labels, fontsize=7)
    ax_p.set_ylabel(f"million points trainable at {BUDGET_MB} MiB per rank")
    ax_p.set_title("points at a fixed per-rank budget (P x per rank)")
    ax_i.bar([f"{r['variant']}\n{r['label']}" for r in infer], [r["peak_rss_mb"] for r in infer], color="#55a868")
    ax_i.tick_params(axis="x", labelsize=7)
    ax_i.set_ylabel("inference peak RSS (MiB)")
    ax_i.set_title("one process: full vs exact chunked")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _train_row(label: str, world: int, variant: str, ckpt: bool, n: int, steps: int, config: dict | None,
               budget_mb: float) -> dict:
    load_before = os.getloadavg()[0]
    ranks = _run(world, "_train_rank", n, steps, ckpt, variant, config)
    worst = max(ranks, key=lambda r: r["activation_peak_mb"] / max(r["n_local"], 1))
    mb_per_point = worst["activation_peak_mb"] / worst["n_local"]
    per_rank = int(budget_mb / mb_per_point)
    return {
        "label": label,
        "variant": variant,
        "world_size": world,
        "checkpoint": ckpt,
        "num_points": n,
        "activation_peak_mb": max(r["activation_peak_mb"] for r in ranks),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in ranks),
        "step_s": max(r["step_s"] for r in ranks),
        "cpu_s": max(r["cpu_s"] for r in ranks),
        "activation_bytes_per_point": mb_per_point * 2**20,
        "budget_mb": budget_mb,
        "points_at_budget_per_rank": per_rank,
        "points_at_budget_total": per_rank * world,
        "load_avg_1min": max(load_before, os.getloadavg()[0]),  # other jobs on the machine
        "ranks": ranks,
    }


def main(quick: bool = False, points: int | None = None, surface_points: int | None = None) -> dict:
    n = points or (50_000 if quick else 250_000)
    n_surface = surface_points or (880_000 if quick else 8_800_000)
    steps = 2
    rows = []
    for variant in ("plain", "plus"):
        for label, world, ckpt in (("P=1", 1, False), ("P=2", 2, False), ("P=4", 4, False), ("P=1 ckpt", 1, True)):
            rows.append(_train_row(label, world, variant, ckpt, n, steps, None, BUDGET_MB))
    for variant in ("plain", "plus"):
        base = next(r for r in rows if r["variant"] == variant and r["label"] == "P=1")
        for r in rows:
            if r["variant"] == variant:
                r["memory_vs_p1"] = r["activation_peak_mb"] / base["activation_peak_mb"]
                r["speedup_vs_p1"] = base["step_s"] / r["step_s"]
                r["cpu_speedup_vs_p1"] = base["cpu_s"] / r["cpu_s"]
    n_large = 2_000 if quick else 10_000
    large = [
        _train_row("C=256 P=1", 1, "plain", False, n_large, 1, LARGE, LARGE_BUDGET_MB),
        _train_row("C=256 P=1 ckpt", 1, "plus", True, n_large, 1, LARGE, LARGE_BUDGET_MB),
    ]
    infer = []
    chunk = max(1, n // 8)
    for variant in ("plain", "plus"):
        for label, size, cs in (("full no_grad", n, None), (f"chunked {chunk:,}", n, chunk)):
            (res,) = _run(1, "_infer_rank", size, cs, variant)
            infer.append({"label": label, "variant": variant, "num_points": size, "chunk_size": cs, **res})
    surface_chunk = 250_000
    for variant in ("plain", "plus"):
        (res,) = _run(1, "_infer_rank", n_surface, surface_chunk, variant)
        infer.append({"label": f"{n_surface / 1e6:.1f}M chunked", "variant": variant, "num_points": n_surface,
                      "chunk_size": surface_chunk, **res})

    print(f"\nTransolver {MODEL}, {n:,} points, in={IN_DIM}, out={OUT_DIM}; AdamW step, fp32, gloo, 1 thread/rank; "
          f"load average up to {max(r['load_avg_1min'] for r in rows):.1f} on {os.cpu_count()} cores")
    print(f"{'variant':<6} {'config':<9} {'act. MiB':>9} {'vs P=1':>7} {'step s':>7} {'speedup':>8} {'CPU s':>7} "
          f"{'CPU spd':>8} {'B/point':>8} {'pts/rank @1GiB':>15} {'total pts':>11} {'load':>5}")
    for r in rows:
        print(f"{r['variant']:<6} {r['label']:<9} {r['activation_peak_mb']:>9.0f} {r['memory_vs_p1']:>7.2f} "
              f"{r['step_s']:>7.2f} {r['speedup_vs_p1']:>8.2f} {r['cpu_s']:>7.2f} {r['cpu_speedup_vs_p1']:>8.2f} "
              f"{r['activation_bytes_per_point']:>8.0f} {r['points_at_budget_per_rank']:>15,} "
              f"{r['points_at_budget_total']:>11,} {r['load_avg_1min']:>5.1f}")
    print(f"\nDrivaerML-scale width {LARGE}, {n_large:,} points, one step:")
    for r in large:
        print(f"{r['variant']:<6} {r['label']:<15} {r['activation_bytes_per_point'] / 1024:>8.1f} KiB/point -> "
              f"{r['points_at_budget_per_rank']:>11,} points per 80 GB rank; step {r['step_s']:.1f} s "
              f"(CPU {r['cpu_s']:.1f} s)")
    print("\ninference on one process")
    for r in infer:
        print(f"{r['variant']:<6} {r['label']:<18} {r['num_points']:>10,} pts  peak RSS {r['peak_rss_mb']:>7.0f} MiB  "
              f"act. {r['activation_peak_mb']:>7.0f} MiB  {r['time_s']:>7.1f} s  checksum {r['checksum']:.4f}")
    result = {
        "benchmark": "transolver",
        "num_points": n,
        "surface_points": n_surface,
        "model": MODEL,
        "large_model": LARGE,
        "in_dim": IN_DIM,
        "out_dim": OUT_DIM,
        "timed_steps": steps,
        "budget_mb": BUDGET_MB,
        "memory_method": "peak RSS (getrusage ru_maxrss) minus RSS after model, optimizer and local input "
        "shard are built (psutil), per rank, fresh processes per configuration, MALLOC_MMAP_THRESHOLD_=65536; "
        "points at a budget = budget / (activation peak / N_local), a linear extrapolation",
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "training": rows,
        "large": large,
        "inference": infer,
    }
    check_finite("training losses", [r["losses"] for row in rows + large for r in row["ranks"]])
    check_finite("inference checksums", [r["checksum"] for r in infer])
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "bench_transolver_quick" if quick else "bench_transolver"
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2))
    _plot(rows, infer, RESULTS / f"{stem}.png", n)
    print(f"saved {RESULTS / (stem + '.json')} and {RESULTS / (stem + '.png')}")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50k training and 880k inference points")
    parser.add_argument("--points", type=int, default=None, help="training points (default 250k)")
    parser.add_argument("--surface-points", type=int, default=None, help="chunked-inference points (default 8.8M)")
    args = parser.parse_args()
    main(args.quick, args.points, args.surface_points)
