r"""Capacity planning in one process: what P ranks would hold, exchange and need.

The partitioner and the halo planner are pure functions of the coordinates, so a run on P ranks
can be planned on one machine for any P: per-rank points, ghost points within the neighbour
radius, halo bytes per feature exchange, Transolver all-reduce bytes per layer and an estimate of
per-rank activation memory.

Exact and estimated plans
-------------------------
Up to ``sample`` points (default 1M) the plan is exact: the cloud is partitioned and every
rank's halo plan is built (:func:`meshshard.halo.simulate_halo`). Above it, no process holds the
cloud: the planner draws two nested random subsamples of ``n1 = sample / 4`` and ``n2 = sample``
points from the same distribution, partitions each into the same ``P`` parts, and counts every
rank's ghosts exactly at the radius that holds ``k`` neighbours *at that density*. Ghosts are
then scaled to ``N`` by the model

.. math:: g(n) = a\,n^{\alpha} + b\,n^{\alpha - 1/d},\qquad n = N / P,

with ``d`` the dimension of the cloud (2 for a surface, 3 for a volume) and ``alpha = 1 - 1/d``
(surface ghosts grow as ``(N/P)^(1/2)``, volume ghosts as ``(N/P)^(2/3)``): a part holding
``n`` points has a boundary of measure ``~ n^alpha`` in units of the point spacing and its ghost
layer is ``~ k^(1/d)`` spacings thick; the second term is the first correction (edges and
corners of the layer, ``n^(alpha - 1/d)``). ``a`` and ``b`` are fitted to the two exact counts.
Each rank's ghosts are its exact count on the larger sample times ``g(N/P) / mean(g_n2)``. The
error bound is the relative distance between the fitted model and the leading term alone
(``g_n2 * (N / n2)^alpha``) at ``N / P`` (the part of the estimate the correction carries,
which bounds what higher corrections can add) plus :data:`SAMPLING_ALLOWANCE` (3%) for the
difference between the sample's cut tree and the full cloud's. Points per rank are exact: the partitioners place
part ``r``'s boundary at the integer nearest ``N * (r + 1) / P``. ``tests/test_planning.py`` checks the
estimate against the exact simulation (within 10%).

Activation estimate (training, fp32): per point and Transolver block the tensors autograd keeps
are about ``(9 + 2 * mlp_ratio) * C + 2 * H * M`` floats (two layer norms, the x/f projections,
slice logits and weights, de-sliced output, output projection, residuals, the MLP's hidden layer
before and after GELU), plus ``4 C`` per point for the preprocessing MLP and head. It is an
estimate: ``benchmarks/bench_transolver.py`` measures the real peak.
"""

from __future__ import annotations

import math
import resource
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._checks import check_positive_int
from ._config import TransolverConfig
from .errors import UsageError

__all__ = ["plan", "print_plan", "car_cloud", "car_surface_points", "activation_bytes_per_point", "part_sizes"]

#: Part of the error bound for the sampling itself: a sample's cut tree is not the full cloud's
#: (cuts and, with ``axis_rule="density"``, axes may differ). Estimates were within 2% of the exact
#: ghosts in every validation run (surface and volume, 98 to 25k sample points per rank).
SAMPLING_ALLOWANCE = 0.03

#: A mid-size saloon (the parameters of ``CarParameters``, fixed so plans are reproducible).
_CAR = (4.6, 1.8, 1.42, 0.14, 0.57, 0.33, 0.68, 0.7, 0.47, 4.0)
_DIMENSION = {"surface": 2, "volume": 3}


def _car():
    from .datasets.synthetic import CarParameters

    return CarParameters(*_CAR)


def car_cloud(n: int, kind: str = "surface", seed: int = 0) -> torch.Tensor:
    """``n`` i.i.d. points of a realistic synthetic car cloud, float32 ``(n, 3)``.

    ``"surface"``: uniform by area on the body of :mod:`meshshard.datasets.synthetic` (a 4.6 m
    saloon, triangulated with 200k faces), as the cell centres of a uniform surface mesh would be.
    ``"volume"``: the graded density of the synthetic volume mesh (about 4x finer near the body,
    smoothly coarser away from it, a product of per-axis densities) in the box around the car
    above the ground, outside the body. Either density is smooth: no empty planes or gaps, so
    cut placement does not find artificial low-density slabs. Points are i.i.d., so the first
    ``m`` points of a cloud are a random subsample of it.
    """
    if kind not in _DIMENSION:
        raise ValueError(f"kind must be 'surface' or 'volume' (got {kind!r})")
    check_positive_int(n, "n")
    rng = np.random.default_rng(seed)
    car = _car()
    if kind == "surface":
        from .datasets.synthetic import car_surface

        vertices, faces = car_surface(car, 200_000)
        tri = vertices[faces]
        area = 0.5 * np.linalg.norm(np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), axis=1)
        cdf = np.cumsum(area)
        cdf /= cdf[-1]
        out = np.empty((n, 3), dtype=np.float32)
        for a in range(0, n, 1 << 22):  # blocks bound the float64 temporaries
            m = min(n - a, 1 << 22)
            face = np.minimum(np.searchsorted(cdf, rng.random(m)), len(faces) - 1)
            u = rng.random((m, 2))
            s = np.sqrt(u[:, 0])
            bary = np.stack([1.0 - s, s * (1.0 - u[:, 1]), s * u[:, 1]], axis=1)
            out[a : a + m] = np.einsum("nk,nkd->nd", bary, tri[face])
        return torch.from_numpy(out)
    from .datasets.synthetic import axis_density

    length, width, height = car.length, car.width, car.height
    boxes = [
        (-0.5 * length, 2.0 * length, 0.0, 1.3 * length),
        (-1.2 * width, 1.2 * width, -0.5 * width, 0.5 * width),
        (0.0, 2.2 * height, 0.0, height),
    ]
    grids = []
    for lo, hi, fine_lo, fine_hi in boxes:
        s = np.linspace(lo, hi, 4097)
        dens = axis_density(s, fine_lo, fine_hi)
        cum = np.concatenate([[0.0], np.cumsum(0.5 * (dens[1:] + dens[:-1]) * np.diff(s))])
        grids.append((s, cum / cum[-1]))
    out = np.empty((0, 3), dtype=np.float32)
    blocks = []
    have = 0
    while have < n:
        m = min(int((n - have) * 1.1) + 64, 1 << 22)
        pts = np.stack([np.interp(rng.random(m), cum, s) for s, cum in grids], axis=1)
        pts = pts[~car.inside(pts)][: n - have].astype(np.float32)
        blocks.append(pts)
        have += pts.shape[0]
    out = np.concatenate(blocks) if blocks else out
    return torch.from_numpy(out)


def car_surface_points(n: int, seed: int = 0) -> torch.Tensor:
    """``n`` points uniform by area on the synthetic car body (``car_cloud(n, "surface", seed)``)."""
    return car_cloud(n, "surface", seed)


def activation_bytes_per_point(n_hidden: int, n_layers: int, n_head: int, slice_num: int, mlp_ratio: int) -> int:
    """Bytes of fp32 activations a Transolver keeps per point for backward (the planner's memory model)."""
    TransolverConfig(n_hidden, n_layers, n_head, slice_num, mlp_ratio)  # validates
    per_block = (9 + 2 * mlp_ratio) * n_hidden + 2 * n_head * slice_num
    return 4 * (n_layers * per_block + 4 * n_hidden)


def part_sizes(num_points: int, parts: int) -> list[int]:
    """Points per part of an unweighted partition of ``num_points`` into ``parts`` (any method).

    Boundary ``b`` is the integer nearest ``N * b / P`` (lower on ties), as the partitioners place
    it (see :func:`meshshard.partition._rcb.nearest_boundaries`), with the same float64 targets.
    """
    parts = check_positive_int(parts, "parts")
    if isinstance(num_points, bool) or not isinstance(num_points, int) or num_points < 0:
        raise ValueError(f"num_points must be a non-negative int (got {num_points!r})")
    f = torch.full((parts,), 1.0 / parts, dtype=torch.float64)
    cum = torch.zeros(parts + 1, dtype=torch.float64)
    torch.cumsum(f, 0, out=cum[1:])
    cum[-1] = 1.0
    t = float(num_points) * cum
    k = t.floor()
    k = torch.where(t - k > 0.5, k + 1, k).to(torch.long)
    k[0], k[-1] = 0, num_points
    k = torch.cummax(k, 0).values
    return k.diff().tolist()


def _fail(message: str) -> UsageError:
    return UsageError(f"meshshard plan: {message}")


def _load(data: str) -> torch.Tensor:
    path = Path(data)
    if path.is_dir():
        raise _fail(f"--data must be a file, but {path} is a folder")
    if not path.is_file():
        raise _fail(f"file not found: {path}")
    from .io._read import MeshReadError, read_mesh, read_points

    try:
        if path.suffix.lower() == ".npy":
            return torch.from_numpy(np.ascontiguousarray(read_points(path), dtype=np.float32))
        mesh = read_mesh(path)
    except MeshReadError as exc:
        raise _fail(str(exc)) from None
    if mesh.n_cells == 0:
        raise _fail(f"{path} holds {mesh.n_points} points but no cells")
    return torch.from_numpy(np.asarray(mesh.cell_centers().points, dtype=np.float32))


class _Progress:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.start = time.perf_counter()
        self.last = self.start

    def __call__(self, message: str) -> None:
        now = time.perf_counter()
        if self.enabled:
            print(f"plan [{now - self.start:6.1f} s] {message}", file=sys.stderr, flush=True)
        self.last = now


def _peak_rss_mb() -> float:
    """Peak resident memory of this process (``VmHWM``; ``ru_maxrss`` is inherited across fork and exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _exact_ghosts(
    points: torch.Tensor, parts: int, method: str, radius: float
) -> tuple[np.ndarray, np.ndarray, tuple[float, float]]:
    """Every part's exact ghost count and points sent, and the seconds (partition, ghosts)."""
    from .partition import partition
    from .partition._quality import ghost_counts

    t0 = time.perf_counter()
    part = partition(points, parts, method=method)
    t1 = time.perf_counter()
    ghosts, _, sent = ghost_counts(points, part, radius)
    seconds = (t1 - t0, time.perf_counter() - t1)
    return ghosts.numpy().astype(np.float64), sent.numpy().astype(np.float64), seconds


def fit_ghost_model(n1: float, g1: float, n2: float, g2: float, dimension: float) -> tuple[float, float, float]:
    """Fit ``g(n) = a n^alpha + b n^(alpha - 1/d)`` through two points; returns ``(a, b, alpha)``."""
    alpha = 1.0 - 1.0 / dimension
    beta = alpha - 1.0 / dimension
    m = np.array([[n1**alpha, n1**beta], [n2**alpha, n2**beta]])
    a, b = np.linalg.solve(m, np.array([g1, g2]))
    return float(a), float(b), alpha


def plan(
    *,
    num_points: int | None = None,
    data: str | None = None,
    parts: int,
    method: str = "rcb",
    neighbors: int = 32,
    radius: float | None = None,
    model: TransolverConfig | None = None,
    seed: int = 0,
    kind: str = "surface",
    sample: int = 1_000_000,
    progress: bool = False,
) -> dict[str, Any]:
    """Plan a ``parts``-rank run; returns per-rank and summary figures (see module docstring).

    ``kind`` (``"surface"`` or ``"volume"``) picks the synthetic cloud of ``num_points``; with
    ``data`` the dimension for scaling is measured from the two samples' radii. Above ``sample``
    points the ghost figures are estimates with ``report["estimate"]["error_bound"]``. ``model``
    sizes the activations, halo rows and all-reduces (default: ``TransolverConfig()``, the
    Transolver's own defaults, as ``meshshard plan`` without model options).
    ``progress`` prints each step with its time to stderr.
    """
    from .halo import simulate_halo
    from .partition import neighbor_radius, partition

    try:
        check_positive_int(parts, "--parts")
    except (TypeError, ValueError) as exc:
        raise _fail(str(exc)) from None
    if kind not in _DIMENSION:
        raise _fail(f"--kind must be surface or volume (got {kind!r})")
    if radius is not None and not (0 < radius < math.inf):
        raise _fail(f"--radius must be a positive number (got {radius})")
    model = TransolverConfig() if model is None else model
    n_hidden, n_head, slice_num = model.n_hidden, model.n_head, model.slice_num
    say = _Progress(progress)
    loaded = None if data is None else _load(data)
    n = int(num_points) if loaded is None else int(loaded.shape[0])
    if n < 2:
        raise _fail(f"need at least 2 points (got {n})")
    if parts > n:
        raise _fail(f"--parts {parts} is more than the {n:,} points: {parts - n:,} ranks would hold nothing; "
                    f"use --parts {n} or fewer")
    act = activation_bytes_per_point(**asdict(model))
    t_part = t_halo = 0.0
    estimate = None
    what = f"{kind} car cloud" if loaded is None else f"points of {data}"
    if n <= sample:
        say(f"exact plan: {n:,} {what} into {parts} parts")
        points = car_cloud(n, kind, seed) if loaded is None else loaded
        t0 = time.perf_counter()
        part = partition(points, parts, method=method)
        t_part = time.perf_counter() - t0
        say(f"partitioned ({method}) in {t_part:.1f} s")
        if radius is None:
            radius = neighbor_radius(points, min(neighbors, max(n - 1, 1)))
        t0 = time.perf_counter()
        per_rank = [points.index_select(0, part.shard_indices(r)) for r in range(parts)]
        halo = simulate_halo(per_rank, radius, row_bytes=4 * n_hidden)
        t_halo = time.perf_counter() - t0
        say(f"built {parts} halo plans in {t_halo:.1f} s")
        sizes = part.sizes.tolist()
        ghosts = [float(g) for g in halo["num_ghosts"]]
        sent = [float(v) for v in halo["num_sent"]]
    else:
        n2 = sample
        n1 = sample // 4
        if n1 < 64 * parts:
            raise _fail(
                f"an estimate needs --sample >= 256 * parts = {256 * parts:,} (64 points per part "
                f"in the smaller sample; got --sample {sample:,})"
            )
        say(f"estimated plan: {n:,} {what} into {parts} parts; exact on samples of {n1:,} and {n2:,}")
        if loaded is None:
            points = car_cloud(n2, kind, seed)
        else:
            pick = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:n2]
            points = loaded.index_select(0, pick)
            loaded = None
        say(f"drew {n2:,} sample points")
        k = min(neighbors, n1 - 1)
        r1 = neighbor_radius(points[:n1], k)
        if data is None:  # known dimension: the k-neighbour radius scales as density^(-1/d)
            dimension = float(_DIMENSION[kind])
            r2 = r1 * (n1 / n2) ** (1.0 / dimension)
        else:  # measure the dimension from how the radius shrinks
            r2 = neighbor_radius(points, k)
            dimension = math.log(n2 / n1) / math.log(r1 / r2)
        if radius is None:
            radius = r2 * (n2 / n) ** (1.0 / dimension)
        else:  # the user's radius at N: the samples use the radius holding as many neighbours
            r2 = radius * (n / n2) ** (1.0 / dimension)
            r1 = radius * (n / n1) ** (1.0 / dimension)
        say(f"radius {radius:.4g} at N ({r1:.4g} and {r2:.4g} on the samples; dimension {dimension:.2f})")
        g_small, _, sec1 = _exact_ghosts(points[:n1], parts, method, r1)
        say(f"exact ghosts on {n1:,} points: mean {g_small.mean():,.1f} per rank")
        g_big, s_big, sec2 = _exact_ghosts(points, parts, method, r2)
        say(f"exact ghosts on {n2:,} points: mean {g_big.mean():,.1f} per rank")
        t_part, t_halo = sec1[0] + sec2[0], sec1[1] + sec2[1]
        x1, x2, x = n1 / parts, n2 / parts, n / parts
        if parts == 1 or g_big.mean() == 0:
            a = b = 0.0
            alpha = 1.0 - 1.0 / dimension
            mean_n = lead = 0.0
            scale = 0.0
        else:
            a, b, alpha = fit_ghost_model(x1, float(g_small.mean()), x2, float(g_big.mean()), dimension)
            mean_n = a * x**alpha + b * x ** (alpha - 1.0 / dimension)
            lead = float(g_big.mean()) * (x / x2) ** alpha
            scale = mean_n / float(g_big.mean())
        bound = (abs(mean_n - lead) / mean_n if mean_n > 0 else 0.0) + SAMPLING_ALLOWANCE
        sizes = part_sizes(n, parts)
        ghosts = (g_big * scale).tolist()
        sent = (s_big * scale).tolist()
        estimate = {
            "model": "g(n) = a n^alpha + b n^(alpha - 1/d), n = N/P points per rank",
            "dimension": dimension,
            "alpha": alpha,
            "a": a,
            "b": b,
            "samples": [n1, n2],
            "sample_radius": [r1, r2],
            "sample_mean_ghosts": [float(g_small.mean()), float(g_big.mean())],
            "mean_ghosts": mean_n,
            "leading_term_only": lead,
            "error_bound": bound,
        }
        say(f"scaled to {x:,.0f} points per rank: {mean_n:,.0f} ghosts per rank (error bound {bound:.1%})")
    ranks = [
        {
            "rank": r,
            "points": sizes[r],
            "ghosts": int(round(ghosts[r])),
            "halo_bytes_per_exchange": int(round(sent[r])) * 4 * n_hidden,
            "activation_mb": sizes[r] * act / 2**20,
        }
        for r in range(parts)
    ]
    allreduce_bytes = 4 * n_head * slice_num * (n_hidden // n_head + 1)
    total_ghosts = sum(r["ghosts"] for r in ranks)
    total_sent = sum(int(round(v)) for v in sent)
    ring = sum((parts - 1) * sz * 4 * n_hidden for sz in sizes)
    report = {
        "num_points": n,
        "parts": parts,
        "method": method,
        "kind": kind if data is None else "data",
        "exact": estimate is None,
        "radius": radius,
        "model": asdict(model),
        "activation_bytes_per_point": act,
        "transolver_allreduce_bytes_per_layer": allreduce_bytes,
        "ranks": ranks,
        "imbalance": max(sizes) / (n / parts),
        "ghost_fraction": total_ghosts / n,
        "total_halo_bytes_per_exchange": total_sent * 4 * n_hidden,
        "total_ring_bytes_per_exchange": ring,
        "single_rank_activation_mb": n * act / 2**20,
        "estimate": estimate,
        "seconds": {"partition": t_part, "halo": t_halo, "total": time.perf_counter() - say.start},
        "peak_rss_mb": _peak_rss_mb(),
    }
    say(f"done; peak memory {report['peak_rss_mb']:.0f} MB")
    return report


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
    est = report.get("estimate")
    if est:
        print(
            f"ghosts ESTIMATED from exact plans of {est['samples'][0]:,} and {est['samples'][1]:,} sample points, "
            f"scaled by g(n) = a n^{est['alpha']:.3g} + b n^{est['alpha'] - 1 / est['dimension']:.3g} "
            f"(d = {est['dimension']:.2f}): error bound {est['error_bound']:.1%}"
        )
    s = report["seconds"]
    print(
        f"planned in {s['total']:.1f} s ({s['partition']:.2f} s partition, {s['halo']:.2f} s halo), "
        f"peak memory {report['peak_rss_mb']:.0f} MB"
    )
