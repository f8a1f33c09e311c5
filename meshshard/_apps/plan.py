"""Capacity planning in one process: what P ranks would hold, exchange and need.

The partitioner and the halo planner are pure functions of the coordinates, so a run on P ranks
can be planned on one machine for any P: per-rank points, ghost points within the neighbour
radius, halo bytes per feature exchange, Transolver all-reduce bytes per layer and an estimate of
per-rank activation memory.

Activation estimate (training, fp32): per point and Transolver block the tensors autograd keeps
are about ``(9 + 2 * mlp_ratio) * C + 2 * H * M`` floats (two layer norms, the x/f projections,
slice logits and weights, de-sliced output, output projection, residuals, the MLP's hidden layer
before and after GELU), plus ``4 C`` per point for the preprocessing MLP and head. It is an
estimate: ``benchmarks/bench_transolver.py`` measures the real peak.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import UsageError

__all__ = ["plan", "print_plan", "car_surface_points", "activation_bytes_per_point"]


def car_surface_points(n: int, seed: int = 0) -> torch.Tensor:
    """``n`` points on a car-like closed surface (a superellipsoid 4.6 x 1.8 x 1.4 m), float32."""
    g = torch.Generator().manual_seed(seed)
    d = torch.randn(n, 3, generator=g, dtype=torch.float64)
    d = d / d.norm(dim=1, keepdim=True)
    e = 0.35  # squareness: < 1 gives flat sides and rounded edges
    p = torch.sign(d) * d.abs().pow(e)
    r = p.abs().pow(2 / e).sum(1, keepdim=True).pow(e / 2)
    p = p / r
    return (p * torch.tensor([2.3, 0.9, 0.7], dtype=torch.float64) + torch.tensor([2.3, 0.0, 0.7])).float()


def activation_bytes_per_point(n_hidden: int, n_layers: int, n_head: int, slice_num: int, mlp_ratio: int) -> int:
    per_block = (9 + 2 * mlp_ratio) * n_hidden + 2 * n_head * slice_num
    return 4 * (n_layers * per_block + 4 * n_hidden)


def _fail(message: str) -> UsageError:
    return UsageError(f"meshshard plan: {message}")


def _load(data: str) -> torch.Tensor:
    path = Path(data)
    if path.is_dir():
        raise _fail(f"--data must be a file, but {path} is a folder")
    if not path.is_file():
        raise _fail(f"file not found: {path}")
    if path.suffix.lower() == ".npy":
        try:
            pts = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise _fail(f"cannot read {path} as a .npy array ({exc})") from None
        if pts.ndim != 2 or pts.shape[1] not in (2, 3) or pts.dtype.kind not in "fiu":
            raise _fail(f"{path} must hold an (N, 3) numeric array (got {pts.dtype} {pts.shape})")
        if not np.isfinite(pts).all():
            raise _fail(f"{path} holds NaN or infinite coordinates")
        return torch.from_numpy(np.ascontiguousarray(pts, dtype=np.float32))
    from ..io._read import MeshReadError, read_mesh

    try:
        mesh = read_mesh(path)
    except MeshReadError as exc:
        raise _fail(str(exc)) from None
    if mesh.n_cells == 0:
        raise _fail(f"{path} holds {mesh.n_points} points but no cells")
    return torch.from_numpy(np.asarray(mesh.cell_centers().points, dtype=np.float32))


def _say(progress: bool, message: str) -> None:
    if progress:
        print(f"[plan] {message}", file=sys.stderr, flush=True)


def plan(
    *,
    num_points: int | None = None,
    data: str | None = None,
    parts: int,
    method: str = "rcb",
    neighbors: int = 32,
    radius: float | None = None,
    n_hidden: int = 256,
    n_layers: int = 8,
    n_head: int = 8,
    slice_num: int = 32,
    mlp_ratio: int = 2,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    """Plan a ``parts``-rank run; returns per-rank and summary figures (see module docstring).

    ``progress`` prints one line per stage (with its time) on stderr: partitioning and halo
    planning take minutes for 10^8 points.
    """
    from ..halo import simulate_halo
    from ..partition import neighbor_radius, partition

    if parts < 1:
        raise _fail(f"--parts must be positive (got {parts})")
    if radius is not None and not (0 < radius < math.inf):
        raise _fail(f"--radius must be a positive number (got {radius})")
    if n_hidden % n_head:
        raise _fail(f"--n-hidden ({n_hidden}) must be divisible by --n-head ({n_head})")
    t0 = time.perf_counter()
    if data is None:
        _say(progress, f"synthesising a car-like surface cloud of {num_points:,} points")
        points = car_surface_points(num_points, seed)
    else:
        _say(progress, f"reading {data}")
        points = _load(data)
    n = points.shape[0]
    if parts > n:
        raise _fail(f"--parts {parts} is more than the {n:,} points: {parts - n:,} ranks would hold nothing; "
                    f"use --parts {n} or fewer")
    _say(progress, f"partitioning {n:,} points into {parts:,} parts ({method})")
    t0 = time.perf_counter()
    part = partition(points, parts, method=method)
    t_part = time.perf_counter() - t0
    if radius is None:
        k = min(neighbors, max(n - 1, 1))
        _say(progress, f"partitioned in {t_part:.1f} s; sizing the ball radius for about {k} neighbours")
        radius = neighbor_radius(points, k)
    _say(progress, f"halo plans of {parts:,} ranks at radius {radius:.4g}")
    t0 = time.perf_counter()
    per_rank = [points.index_select(0, part.shard_indices(r)) for r in range(parts)]
    halo = simulate_halo(per_rank, radius, row_bytes=4 * n_hidden)
    t_halo = time.perf_counter() - t0
    _say(progress, f"halo plans built in {t_halo:.1f} s")
    act = activation_bytes_per_point(n_hidden, n_layers, n_head, slice_num, mlp_ratio)
    sizes = part.sizes.tolist()
    ranks = [
        {
            "rank": r,
            "points": sizes[r],
            "ghosts": halo["num_ghosts"][r],
            "halo_bytes_per_exchange": halo["num_sent"][r] * 4 * n_hidden,
            "activation_mb": sizes[r] * act / 2**20,
        }
        for r in range(parts)
    ]
    allreduce_bytes = 4 * n_head * slice_num * (n_hidden // n_head + 1)
    return {
        "num_points": n,
        "parts": parts,
        "method": method,
        "radius": radius,
        "model": {"n_hidden": n_hidden, "n_layers": n_layers, "n_head": n_head, "slice_num": slice_num,
                  "mlp_ratio": mlp_ratio},
        "activation_bytes_per_point": act,
        "transolver_allreduce_bytes_per_layer": allreduce_bytes,
        "ranks": ranks,
        "imbalance": max(sizes) / (n / parts),
        "ghost_fraction": halo["ghost_fraction"],
        "total_halo_bytes_per_exchange": halo["total_ghost_bytes"],
        "total_ring_bytes_per_exchange": halo["total_ring_bytes"],
        "single_rank_activation_mb": n * act / 2**20,
        "seconds": {"partition": t_part, "halo": t_halo},
    }


def _row(label: str, values: list[float], fmt: str) -> str:
    if not values:
        return f"{label:<28}-"
    mean = sum(values) / len(values)
    return f"{label:<28}{format(min(values), fmt):>14}{format(mean, fmt):>14}{format(max(values), fmt):>14}"


def print_plan(report: dict[str, Any]) -> None:
    """Print a plan as a min/mean/max table (and each rank for up to 16 ranks)."""
    m = report["model"]
    print(
        f"plan: {report['num_points']:,} points into {report['parts']} parts ({report['method']}), "
        f"radius {report['radius']:.4g}; Transolver C={m['n_hidden']} L={m['n_layers']} H={m['n_head']} "
        f"M={m['slice_num']}"
    )
    ranks = report["ranks"]
    if len(ranks) <= 16:
        print(f"{'rank':>4} {'points':>12} {'ghosts':>10} {'halo MB/exch':>13} {'activ. MB':>10}")
        for r in ranks:
            print(
                f"{r['rank']:>4} {r['points']:>12,} {r['ghosts']:>10,} {r['halo_bytes_per_exchange'] / 2**20:>13.2f} "
                f"{r['activation_mb']:>10.1f}"
            )
    print(f"{'':<28}{'min':>14}{'mean':>14}{'max':>14}")
    print(_row("points per rank", [r["points"] for r in ranks], ",.0f"))
    print(_row("ghosts per rank", [r["ghosts"] for r in ranks], ",.0f"))
    print(_row("halo MB per exchange", [r["halo_bytes_per_exchange"] / 2**20 for r in ranks], ".2f"))
    print(_row("activation MB (estimate)", [r["activation_mb"] for r in ranks], ".1f"))
    ring = report["total_ring_bytes_per_exchange"]
    ratio = report["total_halo_bytes_per_exchange"] / ring if ring else math.nan
    print(
        f"imbalance {report['imbalance']:.4f}; ghost fraction {report['ghost_fraction']:.4f}; halo traffic "
        f"{ratio:.2%} of a ring that moves every point; Transolver all-reduce "
        f"{report['transolver_allreduce_bytes_per_layer'] / 1024:.1f} KiB per layer; single-rank activations "
        f"{report['single_rank_activation_mb']:.0f} MB"
    )
    s = report["seconds"]
    print(f"planned in {s['partition']:.2f} s (partition) + {s['halo']:.2f} s (halo)")
