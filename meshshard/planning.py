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

import dataclasses
import math
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ._checks import check_choice, check_positive_int, check_radius
from ._config import TransolverConfig
from ._records import Record
from ._sizes import ring_bytes

__all__ = [
    "Plan",
    "RankPlan",
    "GhostEstimate",
    "plan",
    "format_plan",
    "car_cloud",
    "car_surface_points",
    "activation_bytes_per_point",
    "part_sizes",
]

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
    check_choice(kind, "kind", tuple(_DIMENSION))
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
    it (see :func:`meshshard.partition._rcb.nearest_boundaries`), with the same float64 targets
    (:func:`meshshard.partition._rcb.cum_fractions`).
    """
    from .partition import cum_fractions, monotone_cuts

    parts = check_positive_int(parts, "parts")
    if isinstance(num_points, bool) or not isinstance(num_points, int) or num_points < 0:
        raise ValueError(f"num_points must be a non-negative int (got {num_points!r})")
    t = float(num_points) * cum_fractions(parts)
    k = t.floor()
    k = torch.where(t - k > 0.5, k + 1, k).to(torch.long)  # nearest_boundaries of the unit prefix 0, 1, ..., N
    return monotone_cuts(k, num_points).diff().tolist()


@dataclass(frozen=True)
class RankPlan(Record):
    """One rank of a :class:`Plan`."""

    rank: int
    points: int
    ghosts: int
    halo_bytes_per_exchange: int
    #: Estimated fp32 activations kept for backward, MiB.
    activation_mb: float


@dataclass(frozen=True)
class GhostEstimate(Record):
    """How a :class:`Plan` above ``sample`` points scaled the ghosts of two samples to ``N`` (module docstring)."""

    model: str
    dimension: float
    alpha: float
    a: float
    b: float
    samples: list[int]
    sample_radius: list[float]
    sample_mean_ghosts: list[float]
    mean_ghosts: float
    leading_term_only: float
    error_bound: float


@dataclass(frozen=True)
class Plan(Record):
    """What :func:`plan` reports. Reads like a dict too (``report["ranks"][0]["ghosts"]``); ``to_dict()`` for JSON."""

    num_points: int
    parts: int
    method: str
    #: ``"surface"``/``"volume"`` (synthetic cloud) or ``"data"``.
    kind: str
    exact: bool
    radius: float
    #: The Transolver's hyper-parameters (``TransolverConfig`` fields).
    model: dict[str, int]
    activation_bytes_per_point: int
    transolver_allreduce_bytes_per_layer: int
    ranks: list[RankPlan]
    imbalance: float
    ghost_fraction: float
    total_halo_bytes_per_exchange: int
    total_ring_bytes_per_exchange: int
    single_rank_activation_mb: float
    #: ``None`` for an exact plan.
    estimate: GhostEstimate | None
    #: ``partition``, ``halo`` and ``total`` seconds.
    seconds: dict[str, float]
    peak_rss_mb: float


def _load(data: str) -> torch.Tensor:
    path = Path(data)
    if path.is_dir():
        raise ValueError(f"data must be a file, but {path} is a folder")
    if not path.is_file():
        raise FileNotFoundError(f"file not found: {path}")
    from .io import read_mesh, read_points

    if path.suffix.lower() == ".npy":
        return torch.from_numpy(np.ascontiguousarray(read_points(path), dtype=np.float32))
    mesh = read_mesh(path)
    if mesh.n_cells == 0:
        raise ValueError(f"{path} holds {mesh.n_points} points but no cells")
    return torch.from_numpy(np.asarray(mesh.cell_centers().points, dtype=np.float32))


class _Progress:
    """Times the steps of a plan and hands each message (with its time) to the caller's ``progress``."""

    def __init__(self, progress: Callable[[str], None] | None) -> None:
        self.progress = progress
        self.start = time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.progress is not None:
            self.progress(f"plan [{time.perf_counter() - self.start:6.1f} s] {message}")


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
    from .partition import ghost_counts, partition

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


@dataclass(frozen=True)
class _Counts:
    """The ghost figures of a plan before the report: exact, or scaled from two samples."""

    radius: float
    sizes: list[int]
    ghosts: list[float]
    sent: list[float]
    seconds: tuple[float, float]
    estimate: GhostEstimate | None = None


def _check_plan_args(parts: object, kind: str, radius: float | None, sample: int) -> int:
    parts = check_positive_int(parts, "parts")
    check_choice(kind, "kind", tuple(_DIMENSION))
    if radius is not None:
        check_radius(radius)
    check_positive_int(sample, "sample")
    return parts


def _exact_counts(points: torch.Tensor, parts: int, method: str, neighbors: int, radius: float | None,
                  row_bytes: int, say: _Progress) -> _Counts:
    """Partition the whole cloud and build every rank's halo plan."""
    from .halo import simulate_halo
    from .partition import neighbor_radius, partition

    n = int(points.shape[0])
    t0 = time.perf_counter()
    part = partition(points, parts, method=method)
    t_part = time.perf_counter() - t0
    say(f"partitioned ({method}) in {t_part:.1f} s")
    if radius is None:
        radius = neighbor_radius(points, min(neighbors, max(n - 1, 1)))
    t0 = time.perf_counter()
    per_rank = [points.index_select(0, part.shard_indices(r)) for r in range(parts)]
    halo = simulate_halo(per_rank, radius, row_bytes=row_bytes)
    t_halo = time.perf_counter() - t0
    say(f"built {parts} halo plans in {t_halo:.1f} s")
    return _Counts(radius, part.sizes.tolist(), [float(g) for g in halo.num_ghosts],
                   [float(v) for v in halo.num_sent], (t_part, t_halo))


def _sample_radii(points: torch.Tensor, n: int, n1: int, neighbors: int, radius: float | None,
                  dimension: float | None) -> tuple[float, float, float, float]:
    """``(radius at N, r1, r2, dimension)``: the radius holding ``k`` neighbours at each density."""
    from .partition import neighbor_radius

    n2 = int(points.shape[0])
    k = min(neighbors, n1 - 1)
    r1 = neighbor_radius(points[:n1], k)
    if dimension is not None:  # known dimension: the k-neighbour radius scales as density^(-1/d)
        r2 = r1 * (n1 / n2) ** (1.0 / dimension)
    else:  # measure the dimension from how the radius shrinks
        r2 = neighbor_radius(points, k)
        dimension = math.log(n2 / n1) / math.log(r1 / r2)
    if radius is None:
        radius = r2 * (n2 / n) ** (1.0 / dimension)
    else:  # the user's radius at N: the samples use the radius holding as many neighbours
        r2 = radius * (n / n2) ** (1.0 / dimension)
        r1 = radius * (n / n1) ** (1.0 / dimension)
    return radius, r1, r2, dimension


def _scale_ghosts(g_small: np.ndarray, g_big: np.ndarray, n1: int, n2: int, n: int, parts: int,
                  dimension: float) -> tuple[float, GhostEstimate]:
    """Fit the ghost model to the two samples' means; ``(scale of the big sample's counts, estimate)``."""
    x1, x2, x = n1 / parts, n2 / parts, n / parts
    if parts == 1 or g_big.mean() == 0:
        a = b = mean_n = lead = scale = 0.0
        alpha = 1.0 - 1.0 / dimension
    else:
        a, b, alpha = fit_ghost_model(x1, float(g_small.mean()), x2, float(g_big.mean()), dimension)
        mean_n = a * x**alpha + b * x ** (alpha - 1.0 / dimension)
        lead = float(g_big.mean()) * (x / x2) ** alpha
        scale = mean_n / float(g_big.mean())
    bound = (abs(mean_n - lead) / mean_n if mean_n > 0 else 0.0) + SAMPLING_ALLOWANCE
    return scale, GhostEstimate(
        model="g(n) = a n^alpha + b n^(alpha - 1/d), n = N/P points per rank",
        dimension=dimension, alpha=alpha, a=a, b=b, samples=[n1, n2], sample_radius=[],
        sample_mean_ghosts=[float(g_small.mean()), float(g_big.mean())], mean_ghosts=mean_n,
        leading_term_only=lead, error_bound=bound,
    )


def _estimated_counts(loaded: torch.Tensor | None, n: int, parts: int, method: str, neighbors: int,
                      radius: float | None, kind: str, seed: int, sample: int, say: _Progress) -> _Counts:
    """Exact ghosts on two nested samples, scaled to ``N`` by the fitted model (module docstring)."""
    n2, n1 = sample, sample // 4
    if n1 < 64 * parts:
        raise ValueError(f"an estimate needs sample >= 256 * parts = {256 * parts:,} (64 points per part "
                         f"in the smaller sample; got sample={sample:,})")
    what = f"{kind} car cloud" if loaded is None else "points of the data"
    say(f"estimated plan: {n:,} {what} into {parts} parts; exact on samples of {n1:,} and {n2:,}")
    if loaded is None:
        points = car_cloud(n2, kind, seed)
    else:
        pick = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:n2]
        points = loaded.index_select(0, pick)
    say(f"drew {n2:,} sample points")
    known = float(_DIMENSION[kind]) if loaded is None else None
    radius, r1, r2, dimension = _sample_radii(points, n, n1, neighbors, radius, known)
    say(f"radius {radius:.4g} at N ({r1:.4g} and {r2:.4g} on the samples; dimension {dimension:.2f})")
    g_small, _, sec1 = _exact_ghosts(points[:n1], parts, method, r1)
    say(f"exact ghosts on {n1:,} points: mean {g_small.mean():,.1f} per rank")
    g_big, s_big, sec2 = _exact_ghosts(points, parts, method, r2)
    say(f"exact ghosts on {n2:,} points: mean {g_big.mean():,.1f} per rank")
    scale, estimate = _scale_ghosts(g_small, g_big, n1, n2, n, parts, dimension)
    estimate = dataclasses.replace(estimate, sample_radius=[r1, r2])
    say(f"scaled to {n / parts:,.0f} points per rank: {estimate.mean_ghosts:,.0f} ghosts per rank "
        f"(error bound {estimate.error_bound:.1%})")
    return _Counts(radius, part_sizes(n, parts), (g_big * scale).tolist(), (s_big * scale).tolist(),
                   (sec1[0] + sec2[0], sec1[1] + sec2[1]), estimate)


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
    progress: Callable[[str], None] | None = None,
) -> Plan:
    """Plan a ``parts``-rank run; returns per-rank and summary figures (see module docstring).

    ``kind`` (``"surface"`` or ``"volume"``) picks the synthetic cloud of ``num_points``; with
    ``data`` (a ``.npy`` file or a mesh) the dimension for scaling is measured from the two
    samples' radii. Above ``sample`` points the ghost figures are estimates with
    ``report.estimate.error_bound``. ``model`` sizes the activations, halo rows and all-reduces
    (default: ``TransolverConfig()``, the Transolver's own defaults, as ``meshshard plan`` without
    model options). ``progress``, if given, is called with a line for each step and its time
    (``meshshard plan`` prints them to stderr). Bad arguments raise ``ValueError``/``TypeError``
    (``FileNotFoundError`` for a missing ``data`` file).
    """
    parts = _check_plan_args(parts, kind, radius, sample)
    model = TransolverConfig() if model is None else model
    say = _Progress(progress)
    loaded = None if data is None else _load(data)
    if loaded is None and num_points is None:
        raise ValueError("give num_points or data")
    n = int(num_points) if loaded is None else int(loaded.shape[0])
    if n < 2:
        raise ValueError(f"need at least 2 points (got {n})")
    if parts > n:
        raise ValueError(f"parts ({parts}) is more than the {n:,} points: {parts - n:,} ranks would hold "
                         f"nothing; use {n} parts or fewer")
    if n <= sample:
        say(f"exact plan: {n:,} {kind + ' car cloud' if loaded is None else 'points of ' + str(data)} "
            f"into {parts} parts")
        points = car_cloud(n, kind, seed) if loaded is None else loaded
        counts = _exact_counts(points, parts, method, neighbors, radius, 4 * model.n_hidden, say)
    else:
        counts = _estimated_counts(loaded, n, parts, method, neighbors, radius, kind, seed, sample, say)
    report = _report(counts, n, parts, method, kind if data is None else "data", model, say)
    say(f"done; peak memory {report.peak_rss_mb:.0f} MB")
    return report


def _report(counts: _Counts, n: int, parts: int, method: str, kind: str, model: TransolverConfig,
            say: _Progress) -> Plan:
    act = activation_bytes_per_point(**asdict(model))
    row = 4 * model.n_hidden
    sizes = counts.sizes
    ranks = [
        RankPlan(r, sizes[r], int(round(counts.ghosts[r])), int(round(counts.sent[r])) * row, sizes[r] * act / 2**20)
        for r in range(parts)
    ]
    total_ghosts = sum(r.ghosts for r in ranks)
    total_sent = sum(int(round(v)) for v in counts.sent)
    t_part, t_halo = counts.seconds
    return Plan(
        num_points=n,
        parts=parts,
        method=method,
        kind=kind,
        exact=counts.estimate is None,
        radius=counts.radius,
        model=asdict(model),
        activation_bytes_per_point=act,
        transolver_allreduce_bytes_per_layer=4 * model.n_head * model.slice_num * (model.n_hidden // model.n_head + 1),
        ranks=ranks,
        imbalance=max(sizes) / (n / parts),
        ghost_fraction=total_ghosts / n,
        total_halo_bytes_per_exchange=total_sent * row,
        total_ring_bytes_per_exchange=sum(ring_bytes(sizes, row)),
        single_rank_activation_mb=n * act / 2**20,
        estimate=counts.estimate,
        seconds={"partition": t_part, "halo": t_halo, "total": time.perf_counter() - say.start},
        peak_rss_mb=_peak_rss_mb(),
    )


def _row(label: str, values: list[float], fmt: str) -> str:
    if not values:
        return f"{label:<28}-"
    mean = sum(values) / len(values)
    return f"{label:<28}{format(min(values), fmt):>14}{format(mean, fmt):>14}{format(max(values), fmt):>14}"


def format_plan(report: Plan) -> str:
    """A plan as text: a min/mean/max table (and each rank for up to 16 ranks); ``meshshard plan`` prints it."""
    m = report.model
    lines = [
        f"plan: {report.num_points:,} points into {report.parts} parts ({report.method}), "
        f"radius {report.radius:.4g}; Transolver C={m['n_hidden']} L={m['n_layers']} H={m['n_head']} "
        f"M={m['slice_num']}"
    ]
    ranks = report.ranks
    if len(ranks) <= 16:
        lines.append(f"{'rank':>4} {'points':>12} {'ghosts':>10} {'halo MB/exch':>13} {'activ. MB':>10}")
        lines += [
            f"{r.rank:>4} {r.points:>12,} {r.ghosts:>10,} {r.halo_bytes_per_exchange / 2**20:>13.2f} "
            f"{r.activation_mb:>10.1f}"
            for r in ranks
        ]
    lines += [
        f"{'':<28}{'min':>14}{'mean':>14}{'max':>14}",
        _row("points per rank", [r.points for r in ranks], ",.0f"),
        _row("ghosts per rank", [r.ghosts for r in ranks], ",.0f"),
        _row("halo MB per exchange", [r.halo_bytes_per_exchange / 2**20 for r in ranks], ".2f"),
        _row("activation MB (estimate)", [r.activation_mb for r in ranks], ".1f"),
    ]
    ring = report.total_ring_bytes_per_exchange
    ratio = report.total_halo_bytes_per_exchange / ring if ring else math.nan
    lines.append(
        f"imbalance {report.imbalance:.4f}; ghost fraction {report.ghost_fraction:.4f}; halo traffic "
        f"{ratio:.2%} of a ring that moves every point; Transolver all-reduce "
        f"{report.transolver_allreduce_bytes_per_layer / 1024:.1f} KiB per layer; single-rank activations "
        f"{report.single_rank_activation_mb:.0f} MB"
    )
    est = report.estimate
    if est:
        lines.append(
            f"ghosts ESTIMATED from exact plans of {est.samples[0]:,} and {est.samples[1]:,} sample points, "
            f"scaled by g(n) = a n^{est.alpha:.3g} + b n^{est.alpha - 1 / est.dimension:.3g} "
            f"(d = {est.dimension:.2f}): error bound {est.error_bound:.1%}"
        )
    s = report.seconds
    lines.append(
        f"planned in {s['total']:.1f} s ({s['partition']:.2f} s partition, {s['halo']:.2f} s halo), "
        f"peak memory {report.peak_rss_mb:.0f} MB"
    )
    return "\n".join(lines)
