"""Sharded Transolver training on one point cloud: per-rank activation memory and step time vs P.

Side by side in one run, on the same model and the same number of points:

* ``P = 1``: the plain single-process model on a plain tensor (the baseline, one thread);
* ``P = 2`` and ``P = 4``: the same module on a ``ShardTensor`` (gloo, one thread per rank);
* ``P = 1`` with gradient checkpointing (the single-device alternative for memory);
* inference on one process: the full forward under ``no_grad`` vs exact ``chunked_forward``.

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

Run: ``.venv/bin/python benchmarks/bench_transolver.py [--quick]`` (quick: 100k points).
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

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = dict(n_hidden=32, n_layers=2, n_head=2, slice_num=16, mlp_ratio=2)
IN_DIM, OUT_DIM = 6, 4


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


def _train_rank(n_global: int, steps: int, checkpoint: bool) -> dict:
    """One rank of a training run: returns its memory and timing figures."""
    import torch.distributed as dist

    import meshshard as ms

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = ms.nn.Transolver(IN_DIM, OUT_DIM, **MODEL, checkpoint=checkpoint)
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


def _infer_rank(n_global: int, chunk_size: int | None) -> dict:
    """Single-process inference, full (``chunk_size=None``) or chunked; memory and time."""
    import meshshard as ms

    torch.manual_seed(0)
    model = ms.nn.Transolver(IN_DIM, OUT_DIM, **MODEL).eval()
    x, _ = _local_cloud(n_global, 0)
    gc.collect()
    baseline = _rss()
    t0 = time.perf_counter()
    with torch.no_grad():
        y = model(x) if chunk_size is None else ms.nn.chunked_forward(model, x, chunk_size)
    wall = time.perf_counter() - t0
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

    fig, (ax_m, ax_t, ax_i) = plt.subplots(1, 3, figsize=(14, 4.2))
    labels = [r["label"] for r in rows]
    mem = [r["activation_peak_mb"] for r in rows]
    wall = [r["step_s"] for r in rows]
    cpu = [r["cpu_s"] for r in rows]
    colors = ["#4c72b0" if "ckpt" not in lab else "#999999" for lab in labels]
    ax_m.bar(labels, mem, color=colors)
    ax_m.set_ylabel("per-rank activation peak (MiB, max over ranks)")
    ax_m.set_title(f"memory, Transolver on {n:,} points")
    for i, m in enumerate(mem):
        ax_m.annotate(f"{m / mem[0]:.2f}x", (i, m), ha="center", va="bottom")
    xs = range(len(labels))
    ax_t.bar([i - 0.2 for i in xs], wall, width=0.4, label="wall (slowest rank)", color=colors)
    ax_t.bar([i + 0.2 for i in xs], cpu, width=0.4, label="process CPU (max rank)", color="#dd8452")
    ax_t.set_xticks(list(xs), labels)
    ax_t.set_ylabel("seconds per training step")
    ax_t.set_title("step time (1 thread per rank, 2 cores)")
    ax_t.legend()
    ax_i.bar([r["label"] for r in infer], [r["activation_peak_mb"] for r in infer], color="#55a868")
    ax_i.set_ylabel("inference activation peak (MiB)")
    ax_i.set_title("one process: full vs exact chunked")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(quick: bool = False) -> dict:
    n = 100_000 if quick else 1_000_000
    steps = 2 if quick else 3
    chunk = n // 16
    configs = [("P=1", 1, False), ("P=2", 2, False), ("P=4", 4, False), ("P=1 ckpt", 1, True)]
    rows = []
    for label, world, ckpt in configs:
        load_before = os.getloadavg()[0]
        ranks = _run(world, "_train_rank", n, steps, ckpt)
        rows.append({
            "label": label,
            "world_size": world,
            "checkpoint": ckpt,
            "activation_peak_mb": max(r["activation_peak_mb"] for r in ranks),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in ranks),
            "step_s": max(r["step_s"] for r in ranks),
            "cpu_s": max(r["cpu_s"] for r in ranks),
            "load_avg_1min": max(load_before, os.getloadavg()[0]),  # other jobs on the machine
            "ranks": ranks,
        })
    base = rows[0]
    for r in rows:
        r["memory_vs_p1"] = r["activation_peak_mb"] / base["activation_peak_mb"]
        r["speedup_vs_p1"] = base["step_s"] / r["step_s"]
        r["cpu_speedup_vs_p1"] = base["cpu_s"] / r["cpu_s"]
    infer = []
    for label, cs in (("full no_grad", None), (f"chunked ({chunk:,})", chunk)):
        (res,) = _run(1, "_infer_rank", n, cs)
        infer.append({"label": label, "chunk_size": cs, **res})

    print(f"\nTransolver {MODEL}, {n:,} points, in={IN_DIM}, out={OUT_DIM}; AdamW step, fp32, gloo, 1 thread/rank")
    print(f"{'config':<10} {'act. peak MiB':>14} {'vs P=1':>7} {'peak RSS MiB':>13} {'step s':>8} "
          f"{'speedup':>8} {'CPU s':>7} {'CPU speedup':>12} {'load':>5}")
    for r in rows:
        print(f"{r['label']:<10} {r['activation_peak_mb']:>14.0f} {r['memory_vs_p1']:>7.2f} {r['peak_rss_mb']:>13.0f} "
              f"{r['step_s']:>8.2f} {r['speedup_vs_p1']:>8.2f} {r['cpu_s']:>7.2f} {r['cpu_speedup_vs_p1']:>12.2f} "
              f"{r['load_avg_1min']:>5.1f}")
    print("\ninference on one process")
    for r in infer:
        print(f"{r['label']:<22} act. peak {r['activation_peak_mb']:>8.0f} MiB  {r['time_s']:.2f} s  "
              f"checksum {r['checksum']:.6f}")
    p2 = next(r for r in rows if r["label"] == "P=2")
    p4 = next(r for r in rows if r["label"] == "P=4")
    targets = {
        "p4_memory_ratio": p4["memory_vs_p1"],
        "p4_memory_target": 0.30,
        "p4_memory_met": p4["memory_vs_p1"] <= 0.30,
        "p2_speedup": p2["speedup_vs_p1"],
        "p2_speedup_target": 1.6,
        "p2_speedup_met": p2["speedup_vs_p1"] >= 1.6,
        # per-rank CPU time: what the wall-time speedup would be on two otherwise idle cores
        "p2_cpu_speedup": p2["cpu_speedup_vs_p1"],
        "load_avg_1min_max": max(r["load_avg_1min"] for r in rows),
    }
    print(f"\ntargets: P=4 memory {targets['p4_memory_ratio']:.2f}x of P=1 (<= 0.30: {targets['p4_memory_met']}); "
          f"P=2 speedup {targets['p2_speedup']:.2f}x wall, {targets['p2_cpu_speedup']:.2f}x CPU "
          f"(>= 1.6: {targets['p2_speedup_met']}; load average up to {targets['load_avg_1min_max']:.1f} "
          f"on {os.cpu_count()} cores)")
    result = {
        "benchmark": "transolver",
        "num_points": n,
        "model": MODEL,
        "in_dim": IN_DIM,
        "out_dim": OUT_DIM,
        "timed_steps": steps,
        "memory_method": "peak RSS (getrusage ru_maxrss) minus RSS after model, optimizer and local input "
        "shard are built (psutil), per rank, fresh processes per configuration, MALLOC_MMAP_THRESHOLD_=65536",
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "training": rows,
        "inference": infer,
        "targets": targets,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "bench_transolver_quick" if quick else "bench_transolver"
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2))
    _plot(rows, infer, RESULTS / f"{stem}.png", n)
    print(f"saved {RESULTS / (stem + '.json')} and {RESULTS / (stem + '.png')}")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k points instead of 1M")
    main(parser.parse_args().quick)
