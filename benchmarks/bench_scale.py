"""How partitioning time and halo size grow with N and P; the planner at 150M points / 1024 parts.

Clouds: the planner's realistic car clouds (:func:`meshshard.planning.car_cloud`): ``surface``
(uniform by area on the body) and ``volume`` (graded density around it), float32, seed 0.

1. **Serial partition time vs N** (``P = 64``; RCB and Hilbert), one thread, CPU seconds. Fitted
   exponent of ``t ~ N^e`` beside the ideal 1 (``O(N log P)`` at fixed P).
2. **Serial partition time vs P** (``N`` fixed, ``P = 2 ... 1024``). Fitted ``t = c0 + c1 log2 P``
   (ideal: linear in ``log P``) and the exponent of ``t ~ P^e`` (ideal: close to 0).
3. **repartition on 4 ranks vs N** (gloo, one thread per rank, a fresh process group per run;
   each rank draws its own chunk, so no process ever holds the cloud): CPU seconds of the busiest
   rank, wall time, and the largest rank's peak resident memory during ``repartition`` above
   its resident memory before (peak reset through ``/proc/self/clear_refs``), beside the size of
   its input chunk.
4. **Ghosts per rank vs N/P** (exact: the radius holding 32 neighbours, every part's ghosts
   counted with a k-d tree), over N at fixed P and over P at fixed N, surface and volume. Fitted
   exponent of ``ghosts ~ (N/P)^e`` beside the model's 1/2 (surface) and 2/3 (volume).
5. **The planner**: ``meshshard plan --points 150000000 --parts 1024`` in a subprocess: wall
   time, its own peak memory, the estimate and its error bound.

The machine these ran on is shared by several agents at once (2 cores): absolute times are loaded
times; exponents are fitted on CPU seconds of one thread, which load disturbs less. ``--quick``
uses sizes that finish in a few minutes; the full run goes to 8M points for the serial partition
and 16M over 4 ranks.

Run: ``.venv/bin/python benchmarks/bench_scale.py [--quick]``; writes
``benchmarks/results/bench_scale[_quick].json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

RESULTS = Path(__file__).resolve().parent / "results"
NEIGHBOURS = 32


def _cloud(n: int, kind: str = "surface", seed: int = 0) -> torch.Tensor:
    from meshshard.planning import car_cloud

    return car_cloud(n, kind, seed)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def _timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w0, time.process_time() - c0, out


def _slope(x, y) -> float:
    """Least-squares slope of log y against log x."""
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


def time_vs_n(sizes: list[int], parts: int = 64) -> list[dict]:
    from meshshard.partition import partition

    rows = []
    for n in sizes:
        pts = _cloud(n)
        for method in ("rcb", "hilbert"):
            wall, cpu, _ = _timed(lambda: partition(pts, parts, method=method))  # noqa: B023
            rows.append({"n": n, "parts": parts, "method": method, "wall_s": wall, "cpu_s": cpu})
            print(f"  partition N={n:>10,} P={parts:>5} {method:<8} {cpu:7.2f} s cpu {wall:7.2f} s wall", flush=True)
    return rows


def time_vs_p(n: int, parts_list: list[int]) -> list[dict]:
    from meshshard.partition import partition

    pts = _cloud(n)
    rows = []
    for parts in parts_list:
        for method in ("rcb", "hilbert"):
            wall, cpu, _ = _timed(lambda: partition(pts, parts, method=method))  # noqa: B023
            rows.append({"n": n, "parts": parts, "method": method, "wall_s": wall, "cpu_s": cpu})
            print(f"  partition N={n:>10,} P={parts:>5} {method:<8} {cpu:7.2f} s cpu {wall:7.2f} s wall", flush=True)
    return rows


def _rank_repartition(n: int, method: str) -> dict:
    """One rank: draw this rank's chunk, repartition, report time and peak memory."""
    import torch.distributed as dist

    import meshshard as ms

    torch.set_num_threads(1)
    mesh = ms.init_mesh()
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = [n // world + (r < n % world) for r in range(world)]
    local = _cloud(sizes[rank], "surface", seed=100 + rank)  # i.i.d. chunks: the cloud is never in one place
    x = ms.ShardTensor.from_local(local, mesh, sizes=sizes)
    from meshshard.planning import _peak_rss_mb  # VmHWM: this process's own peak

    before = _rss_mb()
    try:  # reset this process's peak RSS (VmHWM), so the peak below is repartition's own
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    comm_t = torch.zeros(1)
    ms.comm.all_reduce_(comm_t)  # start together
    wall, cpu, (points, _) = _timed(lambda: ms.partition.repartition(x, method))
    peak = _peak_rss_mb()
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": peak, "rss_before_mb": before, "sizes": points.sharding_sizes}


def _worker_fn():
    # Workers import this module by name (sys.path is forwarded), also when it runs as a script.
    mod = sys.modules[__name__] if __name__ != "__main__" else importlib.import_module("bench_scale")
    return mod._rank_repartition


def repartition_vs_n(sizes: list[int], world: int = 4) -> list[dict]:
    from meshshard.testing import WorkerPool

    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # freed buffers go back to the OS (inherited by workers)
    rows = []
    for n in sizes:
        for method in ("rcb", "hilbert"):
            pool = WorkerPool(world, backend="gloo", timeout=1800.0, num_threads=1)  # fresh: a clean peak RSS
            try:
                out = pool.run(_worker_fn(), n, method, deadline=3600.0)
            finally:
                pool.close()
            row = {
                "n": n,
                "ranks": world,
                "method": method,
                "wall_s": max(o["wall_s"] for o in out),
                "cpu_s_max_rank": max(o["cpu_s"] for o in out),
                "peak_rss_mb_max_rank": max(o["peak_rss_mb"] for o in out),
                "repartition_rss_increase_mb_max_rank": max(o["peak_rss_mb"] - o["rss_before_mb"] for o in out),
                "input_chunk_mb": n / world * 12 / 2**20,
                "imbalance": max(out[0]["sizes"]) / (n / world),
            }
            rows.append(row)
            print(
                f"  repartition N={n:>10,} on {world} ranks {method:<8} {row['cpu_s_max_rank']:7.2f} s cpu "
                f"{row['wall_s']:7.2f} s wall, "
                f"peak rank {row['peak_rss_mb_max_rank']:.0f} MB "
                f"(+{row['repartition_rss_increase_mb_max_rank']:.0f} MB "
                f"in repartition; input chunk {row['input_chunk_mb']:.0f} MB)",
                flush=True,
            )
    return rows


def _ghosts(points: torch.Tensor, parts: int) -> float:
    from meshshard.partition import neighbor_radius, partition
    from meshshard.partition._quality import ghost_counts

    radius = neighbor_radius(points, NEIGHBOURS)
    part = partition(points, parts)
    ghosts, _, _ = ghost_counts(points, part, radius)
    return float(ghosts.double().mean())


def ghosts_scaling(sizes: list[int], parts_fixed: int, n_fixed: int, parts_list: list[int]) -> list[dict]:
    rows = []
    for kind in ("surface", "volume"):
        for n in sizes:
            g = _ghosts(_cloud(n, kind), parts_fixed)
            rows.append({"kind": kind, "sweep": "N", "n": n, "parts": parts_fixed, "ghosts_per_rank": g})
            print(f"  ghosts {kind:<8} N={n:>10,} P={parts_fixed:>5}: {g:10,.1f} per rank", flush=True)
        pts = _cloud(n_fixed, kind)
        for parts in parts_list:
            g = _ghosts(pts, parts)
            rows.append({"kind": kind, "sweep": "P", "n": n_fixed, "parts": parts, "ghosts_per_rank": g})
            print(f"  ghosts {kind:<8} N={n_fixed:>10,} P={parts:>5}: {g:10,.1f} per rank", flush=True)
    return rows


def planner(points: int = 150_000_000, parts: int = 1024) -> dict:
    out = RESULTS / "bench_scale_plan.json"
    cmd = [sys.executable, "-m", "meshshard.cli", "plan", "--points", str(points), "--parts", str(parts)]
    t0 = time.perf_counter()
    subprocess.run([*cmd, "--quiet", "--json", str(out)], check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    report = json.loads(out.read_text())
    out.unlink()
    est = report["estimate"]
    row = {
        "command": " ".join(["meshshard", *cmd[3:]]),
        "wall_s_with_startup": wall,
        "plan_s": report["seconds"]["total"],
        "peak_rss_mb": report["peak_rss_mb"],
        "ghosts_per_rank": est["mean_ghosts"],
        "error_bound": est["error_bound"],
        "radius": report["radius"],
    }
    print(
        f"  plan {points:,} points / {parts} parts: {wall:.1f} s (with start-up), peak {row['peak_rss_mb']:.0f} MB, "
        f"{row['ghosts_per_rank']:,.0f} ghosts per rank +- {row['error_bound']:.1%}",
        flush=True,
    )
    return row


def fits(result: dict) -> dict:
    out: dict = {}
    for method in ("rcb", "hilbert"):
        rows = [r for r in result["time_vs_n"] if r["method"] == method]
        out[f"time_vs_N_{method}"] = {
            "exponent": _slope([r["n"] for r in rows], [r["cpu_s"] for r in rows]),
            "ideal": 1.0,
        }
        rows = [r for r in result["time_vs_p"] if r["method"] == method]
        logp = np.log2([r["parts"] for r in rows])
        c1, c0 = np.polyfit(logp, [r["cpu_s"] for r in rows], 1)
        out[f"time_vs_P_{method}"] = {
            "exponent": _slope([r["parts"] for r in rows], [r["cpu_s"] for r in rows]),
            "seconds_per_doubling": float(c1),
            "seconds_at_P1": float(c0),
            "ideal": "linear in log P",
        }
        rows = [r for r in result["repartition"] if r["method"] == method]
        if len(rows) > 1:
            out[f"repartition_vs_N_{method}"] = {
                "exponent": _slope([r["n"] for r in rows], [r["cpu_s_max_rank"] for r in rows]),
                "wall_exponent": _slope([r["n"] for r in rows], [r["wall_s"] for r in rows]),
                "memory_increase_exponent": _slope(
                    [r["n"] for r in rows], [max(r["repartition_rss_increase_mb_max_rank"], 1.0) for r in rows]
                ),
                "ideal": 1.0,
            }
    for kind, ideal in (("surface", 0.5), ("volume", 2 / 3)):
        for sweep in ("N", "P"):
            rows = [r for r in result["ghosts"] if r["kind"] == kind and r["sweep"] == sweep]
            x = [r["n"] / r["parts"] for r in rows]
            out[f"ghosts_{kind}_vs_{sweep}"] = {"exponent_in_N_over_P": _slope(x, [r["ghosts_per_rank"] for r in rows]),
                                               "ideal": ideal}  # fmt: skip
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(16, 4.6))
    f = result["fits"]
    for method, marker in (("rcb", "o"), ("hilbert", "s")):
        rows = [r for r in result["time_vs_n"] if r["method"] == method]
        ax[0].loglog([r["n"] for r in rows], [r["cpu_s"] for r in rows], marker + "-",
                     label=f"{method} serial, P=64 (e={f[f'time_vs_N_{method}']['exponent']:.2f})")  # fmt: skip
        rows = [r for r in result["repartition"] if r["method"] == method]
        if rows:
            ax[0].loglog([r["n"] for r in rows], [r["cpu_s_max_rank"] for r in rows], marker + "--",
                         label=f"{method} repartition, 4 ranks (CPU s of the busiest rank)")  # fmt: skip
        rows = [r for r in result["time_vs_p"] if r["method"] == method]
        per_doubling = f[f"time_vs_P_{method}"]["seconds_per_doubling"]
        ax[1].semilogx([r["parts"] for r in rows], [r["cpu_s"] for r in rows], marker + "-", base=2,
                       label=f"{method}: {per_doubling:.3f} s per doubling")  # fmt: skip
    n_ref = np.array([min(r["n"] for r in result["time_vs_n"]), max(r["n"] for r in result["time_vs_n"])])
    base = [r for r in result["time_vs_n"] if r["method"] == "rcb"][0]
    ax[0].loglog(n_ref, base["cpu_s"] * n_ref / n_ref[0], "k:", label="ideal O(N)")
    ax[0].set(xlabel="points N", ylabel="seconds", title="partition time vs N")
    ax[1].set(xlabel="parts P", ylabel="CPU seconds", title=f"partition time vs P (N={result['time_vs_p'][0]['n']:,})")
    for kind, marker in (("surface", "o"), ("volume", "s")):
        for sweep, style in (("N", "-"), ("P", "--")):
            rows = [r for r in result["ghosts"] if r["kind"] == kind and r["sweep"] == sweep]
            e = f[f"ghosts_{kind}_vs_{sweep}"]["exponent_in_N_over_P"]
            ax[2].loglog([r["n"] / r["parts"] for r in rows], [r["ghosts_per_rank"] for r in rows], marker + style,
                         label=f"{kind}, vary {sweep} (e={e:.2f})")  # fmt: skip
    ax[2].set(xlabel="points per rank N/P", ylabel="ghosts per rank", title="ghosts per rank (ideal e = 1/2, 2/3)")
    for a in ax:
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=7)
    fig.suptitle("meshshard scaling (shared, loaded 2-core machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(quick: bool = False) -> dict:
    torch.set_num_threads(1)
    if quick:
        sizes, n_p, parts_list = [100_000, 300_000, 1_000_000], 300_000, [2, 8, 32, 128, 512, 1024]
        rep_sizes, g_sizes, g_parts, g_n = [1_000_000, 4_000_000], [50_000, 200_000, 800_000], 16, 400_000
    else:
        sizes, n_p, parts_list = [100_000, 1_000_000, 4_000_000, 8_000_000], 1_000_000, [2, 4, 16, 64, 256, 1024]
        rep_sizes, g_sizes, g_parts, g_n = (
            [1_000_000, 4_000_000, 16_000_000],
            [100_000, 400_000, 1_600_000],
            16,
            1_600_000,
        )
    result: dict = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "note": "shared by several agents"},
        "quick": quick,
    }
    print("serial partition time vs N", flush=True)
    result["time_vs_n"] = time_vs_n(sizes)
    print("serial partition time vs P", flush=True)
    result["time_vs_p"] = time_vs_p(n_p, parts_list)
    print("repartition on 4 ranks vs N", flush=True)
    result["repartition"] = repartition_vs_n(rep_sizes)
    print("ghosts per rank", flush=True)
    result["ghosts"] = ghosts_scaling(g_sizes, g_parts, g_n, [4, 16, 64, 256])
    print("planner", flush=True)
    result["planner"] = planner()
    result["fits"] = fits(result)
    print("\nfitted exponents")
    for name, fit in result["fits"].items():
        shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in fit.items()}
        print(f"  {name:<28} {shown}")
    RESULTS.mkdir(exist_ok=True)
    stem = "bench_scale_quick" if quick else "bench_scale"
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=1))
    plot(result, RESULTS / f"{stem}.png")
    print(f"\nwrote {RESULTS / (stem + '.json')} and {stem}.png")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="sizes that finish in a few minutes")
    main(quick=parser.parse_args().quick)
