"""The CUDA path, checked in one command: correctness, several ranks, figures; a JSON report and a table.

    python -m tools.gpu_check [--dry] [--out PATH] [--budget SECONDS] [--only NAME ...]
    make gpu-check [GPU_CHECK_ARGS="--dry" | GPU_CHECK_ARGS="--out /some/dir/gpu_check.json"]

Accelerator time comes in short slots, so the whole CUDA path is prepared in advance and checked in one
run that stays within a budget (default 420 s, about 7 minutes, so that set-up fits in 8):

``correctness``
    the partition of CUDA points equals the CPU partition (every method, weights, fractions); ``ball_query``
    and ``knn`` on CUDA equal the CPU result row for row, for every kernel backend importable there;
    every model in :mod:`meshshard.nn` (forward and every gradient) on CUDA in float32 is within rounding of
    float64 on the CPU, and in float64 agrees to 1e-9; ``chunked_forward`` equals the full forward;
    ShardTensor rules, sharded neighbour search, Transolver and PointConv at world size 1 under NCCL.
``multirank``
    which of meshshard's collectives gloo runs on CUDA tensors; the sharded-equals-serial suite on
    2 and 4 ranks sharing one GPU: **gloo with CUDA tensors** (NCCL refuses two ranks on one device;
    gloo stages CUDA buffers through host memory itself, so compute stays on the GPU and no code path
    is special-cased); with several GPUs the same suite under NCCL, one rank per GPU.
``figures``
    neighbour search on 1M and 10M points (every backend, torch_cluster and warp raw queries as peers
    when importable, scipy's ``cKDTree`` on the CPU as the reference peer); a Transolver training step at
    1M points (C = 256, L = 8) with ``torch.cuda.max_memory_allocated``; exact chunked inference of an
    8.8M-point cloud against the full forward, with peak memory; the partitioner on 10M CUDA points.

Isolation: every check runs in a child process of its own session (started from a fork server that
has imported torch and meshshard but never touched CUDA) under a time limit. A check that fails,
hangs, runs out of memory or corrupts its CUDA context is recorded with what it measured so far (checks
save their measurements as they go), its process group is killed, and the next check starts clean. On
a GPU a quarter of every later check's limit is held in reserve, so slow early checks cannot starve the
figures. Figures skip a size whose time, predicted from the smaller one, would not fit what is left of
their limit (recorded, with why).

Dry mode (``--dry``, automatic without CUDA) runs the same checks end to end on the CPU with tiny
sizes (gloo in place of NCCL); the test suite runs it so that the script never rots.

Nothing heavy is imported at module level (torch only): optional packages (scipy, torch_cluster,
warp, triton, numba, cupy) are looked up inside the checks, so this runs on a bare CUDA machine with
the project on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib
import json
import math
import multiprocessing as mp
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["CHECKS", "Check", "Context", "Skip", "main", "run_checks"]

#: Modules that must not be imported by ``import meshshard`` and its core layers (absent on GPU machines).
HEAVY_MODULES = ("pyvista", "vtk", "vtkmodules", "trimesh", "igl", "warp", "matplotlib")
#: Optional packages whose versions the report records (import name -> distribution name).
OPTIONAL = {
    "numpy": "numpy",
    "scipy": "scipy",
    "triton": "triton",
    "numba": "numba",
    "numba_cuda": "numba-cuda",
    "cupy": "cupy",
    "torch_geometric": "torch-geometric",
    "torch_cluster": "torch-cluster",
    "warp": "warp-lang",
}
_DEFAULT_BUDGET_S = 420.0
_RESERVE = 0.25  # share of each later check's limit kept in reserve on a GPU


class Skip(Exception):
    """Raised by a check that cannot run here (e.g. NCCL across GPUs on a one-GPU machine)."""


@dataclass
class Context:
    """What a check gets: the mode, the device, its deadline and a dict to fill with its findings."""

    dry: bool
    device: str
    num_gpus: int
    deadline: float  # time.monotonic() by which the check must be done
    details: dict = field(default_factory=dict)
    details_path: str | None = None  # where save() leaves a snapshot of the details
    name: str = ""

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        """Snapshot the details, so that what was measured survives a timeout or a crash."""
        if self.details_path is not None:
            tmp = self.details_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(_json_safe(self.details), f)
            os.replace(tmp, self.details_path)
            _injected_fault(self.name, after_save=True)

    def size(self, real: int, dry: int) -> int:
        return dry if self.dry else real


@dataclass(frozen=True)
class Check:
    name: str
    group: str
    budget_s: float  # time limit on CUDA (times the time scale; 5x in dry mode)
    fn: Callable[[Context], str]  # fills ctx.details, returns a one-line summary; raises to fail


# -- small helpers ------------------------------------------------------------------------------------
def _sync(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _timed(device: str | torch.device, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """``fn(*args, **kwargs)`` and its wall time, the device synchronised before and after."""
    _sync(device)
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    _sync(device)
    return out, time.perf_counter() - t0


def _reset_peak(device: str | torch.device) -> int:
    """Reset the CUDA peak counter; return the bytes allocated now (0 on the CPU)."""
    if torch.device(device).type != "cuda":
        return 0
    _sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def _peak_mib(device: str | torch.device, base: int = 0) -> float | None:
    """CUDA ``max_memory_allocated`` since the last reset, minus ``base``, in MiB (None on the CPU)."""
    if torch.device(device).type != "cuda":
        return None
    _sync(device)
    return round((torch.cuda.max_memory_allocated(device) - base) / 2**20, 1)


def _free(device: str | torch.device) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _rel(a: torch.Tensor, b: torch.Tensor, floor: float = 0.0) -> float:
    """``||a - b|| / max(||b||, floor)`` in float64 on the CPU (``||a - b||`` when that is zero)."""
    a = a.detach().to("cpu", torch.float64)
    b = b.detach().to("cpu", torch.float64)
    if a.shape != b.shape:
        return math.inf
    den = max(float(b.norm()), floor)
    num = float((a - b).norm())
    return num / den if den > 0 else num


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor with the whole value of ``t`` (a ShardTensor is gathered)."""
    import meshshard as ms

    if isinstance(t, ms.ShardTensor):
        t = t.full_tensor()
    with torch._C.DisableTorchFunctionSubclass():
        return t.as_subclass(torch.Tensor).detach()


def _cloud(n: int, seed: int, kind: str = "uniform", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(n, 3)`` CPU points: ``uniform`` in the unit cube, or ``ties`` on a coarse lattice (duplicates and
    equal distances everywhere, the hard case for ordering and the closed-ball boundary)."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "ties":
        return (torch.randint(0, 12, (n, 3), generator=gen).to(torch.float64) / 12).to(dtype)
    return torch.rand(n, 3, generator=gen, dtype=torch.float64).to(dtype)


def _radius_for(n: int, neighbors: float) -> float:
    """Radius holding about ``neighbors`` points of ``n`` uniform points in the unit cube."""
    return (neighbors / (n * 4.0 / 3.0 * math.pi)) ** (1.0 / 3.0)


def transolver_variants() -> list[dict]:
    """Constructor keywords of every Transolver variant this meshshard offers (e.g. Transolver++).

    ``[{}]`` when :class:`~meshshard.nn.Transolver` has no ``variant`` argument.
    """
    import inspect

    import meshshard as ms

    if "variant" not in inspect.signature(ms.nn.Transolver).parameters:
        return [{}]
    attention = importlib.import_module("meshshard.nn.physics_attention")
    return [{"variant": v} for v in getattr(attention, "VARIANTS", ("plain",))]


def _variant_tag(kw: dict) -> str:
    return f"[{kw['variant']}]" if kw.get("variant", "plain") != "plain" else ""


def backends() -> tuple[str, ...]:
    """The neighbour-search kernel backends this meshshard offers (discovered, not assumed)."""
    from meshshard import kernels

    return tuple(getattr(kernels, "BACKENDS", ("scipy", "grid", "torch_cluster")))


def _unavailable(exc: BaseException) -> bool:
    """Whether a backend failed only because an optional package is missing."""
    text = str(exc).lower()
    return isinstance(exc, ImportError) or "pip install" in text or "not installed" in text


def _fail_if(problems: list[str], what: str) -> None:
    if problems:
        more = f" (and {len(problems) - 8} more)" if len(problems) > 8 else ""
        raise AssertionError(f"{len(problems)} {what}: " + "; ".join(problems[:8]) + more)


# -- environment --------------------------------------------------------------------------------------
def check_environment(ctx: Context) -> str:
    """Versions, the device, and that the core layers import nothing heavy."""
    import importlib.util
    from importlib import metadata

    import meshshard
    import meshshard.nn
    import meshshard.ops
    import meshshard.partition
    import meshshard.testing  # noqa: F401

    d = ctx.details
    d["python"] = platform.python_version()
    d["torch"] = torch.__version__
    d["torch_cuda"] = torch.version.cuda
    d["meshshard_path"] = str(Path(meshshard.__file__).parent)
    versions = {}
    for module, dist in OPTIONAL.items():
        try:
            versions[module] = metadata.version(dist)
        except metadata.PackageNotFoundError:  # e.g. cupy ships as cupy-cuda13x
            found = importlib.util.find_spec(module) is not None
            versions[module] = "installed (version not found)" if found else None
    d["packages"] = versions
    d["backends"] = list(backends())
    d["cpus"] = os.cpu_count()
    if ctx.device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        d["gpu"] = props.name
        d["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        d["gpu_count"] = torch.cuda.device_count()
        d["capability"] = list(torch.cuda.get_device_capability(0))
        d["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
    heavy = sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY_MODULES))
    d["heavy_modules_loaded"] = heavy
    if heavy:
        raise AssertionError(f"importing meshshard's core loaded optional heavy modules {heavy}: make them lazy")
    gpu = f"{d['gpu']} x{d['gpu_count']}, " if "gpu" in d else ""
    return f"{gpu}torch {d['torch']}, backends {','.join(d['backends'])}"


# -- correctness: CUDA against the CPU ----------------------------------------------------------------
def check_partition(ctx: Context) -> str:
    """Partitions of device points equal the CPU partitions, bit for bit."""
    from meshshard.partition import partition

    n = ctx.size(200_000, 3_000)
    cases = []
    for kind in ("uniform", "ties"):
        for dtype in (torch.float32, torch.float64):
            pts = _cloud(n, 1, kind, dtype)
            for method in ("rcb", "morton", "hilbert"):
                for parts in (1, 7, 64):
                    cases.append((f"{kind}/{dtype}/{method}/P={parts}", pts, method, parts, {}))
    pts = _cloud(n, 2)
    weights = torch.rand(n, generator=torch.Generator().manual_seed(3)) * 4
    cases.append(("weights/rcb/P=8", pts, "rcb", 8, {"weights": weights}))
    cases.append(("fractions/rcb/P=4", pts, "rcb", 4, {"fractions": [0.3, 0.0, 0.5, 0.2]}))
    cases.append(("fractions/hilbert/P=4", pts, "hilbert", 4, {"fractions": [0.3, 0.0, 0.5, 0.2]}))
    problems, times = [], {}
    for name, pts, method, parts, kw in cases:
        ref = partition(pts, parts, method, **kw)
        dev_kw = {k: (v.to(ctx.device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        got, seconds = _timed(ctx.device, partition, pts.to(ctx.device), parts, method, **dev_kw)
        times[name] = round(seconds, 4)
        if got.perm.device.type != torch.device(ctx.device).type:
            problems.append(f"{name}: perm on {got.perm.device}")
        if not torch.equal(got.perm.cpu(), ref.perm) or not torch.equal(got.sizes.cpu(), ref.sizes):
            problems.append(f"{name}: device partition differs from the CPU partition")
    ctx.details.update(points=n, cases=len(cases), seconds=times)
    _fail_if(problems, "partitions differ")
    return f"{len(cases)} partitions of {n} points equal the CPU ones"


def _neighbor_cases(n: int) -> list[tuple[str, torch.Tensor, torch.Tensor | None, float, int]]:
    cases = []
    for kind in ("uniform", "ties"):
        for dtype in (torch.float32, torch.float64):
            pts = _cloud(n, 4, kind, dtype)
            queries = _cloud(n // 2, 5, kind, dtype)
            radius = 1.0 / 12 if kind == "ties" else _radius_for(n, 24)
            cases.append((f"{kind}/{dtype}/self", pts, None, radius, 16))
            cases.append((f"{kind}/{dtype}/queries", pts, queries, radius, 16))
    return cases


def check_neighbors(ctx: Context) -> str:
    """ball_query and knn on the device equal the CPU result row for row, on every backend."""
    import meshshard as ms

    n = ctx.size(20_000, 1_500)
    cases = _neighbor_cases(n)
    status, problems = {}, []
    refs = {}  # the CPU result (default CPU backend) of every case
    for name, pts, queries, radius, k in cases:
        refs[name, "ball_query"] = ms.ops.ball_query(pts, queries, radius, k, return_distances=True)
        refs[name, "knn"] = ms.ops.knn(pts, queries, k, return_distances=True)
    for backend in backends():
        rows = 0
        try:
            for name, pts, queries, radius, k in cases:
                dev_q = None if queries is None else queries.to(ctx.device)
                for op in ("ball_query", "knn"):
                    ref = refs[name, op]
                    if op == "ball_query":
                        got = ms.ops.ball_query(
                            pts.to(ctx.device), dev_q, radius, k, return_distances=True, backend=backend
                        )
                    else:
                        got = ms.ops.knn(pts.to(ctx.device), dev_q, k, return_distances=True, backend=backend)
                    where = f"{backend}/{op}/{name}"
                    if got.index.device.type != torch.device(ctx.device).type:
                        problems.append(f"{where}: result on {got.index.device}")
                    if not torch.equal(got.index.cpu(), ref.index) or not torch.equal(got.count.cpu(), ref.count):
                        bad = (got.index.cpu() != ref.index).any(1).nonzero().flatten()
                        problems.append(f"{where}: {bad.numel()} rows differ (first {bad[:5].tolist()})")
                    elif not torch.equal(got.distances.cpu(), ref.distances):
                        problems.append(f"{where}: distances differ by {_rel(got.distances, ref.distances):.2e}")
                    rows += ref.index.shape[0]
        except Exception as exc:
            if _unavailable(exc):
                status[backend] = f"unavailable: {str(exc).splitlines()[0]}"
                continue
            raise
        status[backend] = f"{rows} rows compared"
    ctx.details.update(points=n, backends=status)
    compared = [b for b, s in status.items() if not s.startswith("unavailable")]
    if not compared:
        raise AssertionError("no neighbour backend ran on the device")
    _fail_if(problems, "neighbour mismatches")
    return f"rows equal on {','.join(compared)} ({len(cases) * 2} cases each)"


_ModelCase = tuple[str, Callable[[], torch.nn.Module], tuple[torch.Tensor, ...], Callable[..., torch.Tensor]]


def _model_cases(ctx: Context) -> list[_ModelCase]:
    """``(name, build, inputs, run)`` for every model of :mod:`meshshard.nn`; ``run(model, *inputs)`` -> output."""
    import meshshard as ms

    small = ctx.dry
    width, layers, heads, slices = (16, 2, 2, 4) if small else (64, 3, 4, 16)
    n = 300 if small else 4096
    gen = torch.Generator().manual_seed(7)
    x6 = torch.randn(n, 6, generator=gen, dtype=torch.float64)
    xb = torch.randn(2, n // 2, 6, generator=gen, dtype=torch.float64)
    xw = torch.randn(n, width, generator=gen, dtype=torch.float64)
    pos = _cloud(n, 8).to(torch.float64)  # float32 values: the same neighbours in both dtypes
    feat = torch.randn(n, 5, generator=gen, dtype=torch.float64)
    cases: list[_ModelCase] = []
    nn_ = ms.nn
    if hasattr(nn_, "Transolver"):
        for variant in transolver_variants():
            def build(kw=variant):
                return nn_.Transolver(6, 4, n_hidden=width, n_layers=layers, n_head=heads, slice_num=slices, **kw)

            tag = f"Transolver{_variant_tag(variant)}"
            cases.append((tag, build, (x6,), lambda m, x: m(x)))
            cases.append((f"{tag}/batched", build, (xb,), lambda m, x: m(x)))
    if hasattr(nn_, "PhysicsAttention"):
        cases.append((
            "PhysicsAttention",
            lambda: nn_.PhysicsAttention(width, heads=heads, dim_head=width // heads, slice_num=slices),
            (xw,),
            lambda m, x: m(x),
        ))
    if hasattr(nn_, "PointConv"):
        radius = _radius_for(n, 12)

        def conv(m, x, p):
            nbr = ms.ops.ball_query(p, None, radius, 16)
            return m(x, p, nbr)

        for aggr in ("max", "mean"):
            cases.append((
                f"PointConv/{aggr}",
                lambda aggr=aggr: nn_.PointConv(5, 8, hidden_channels=(16,), aggr=aggr),
                (feat, pos),
                conv,
            ))
    return cases


def _fwd_bwd(model: torch.nn.Module, run: Callable, inputs: tuple[torch.Tensor, ...], device: str, dtype):
    """Output, parameter gradients and input gradients of ``sum(y * w)`` with a fixed ``w``."""
    m = copy.deepcopy(model).to(device=device, dtype=dtype)
    leaves = [x.detach().to(device=device, dtype=dtype).clone().requires_grad_() for x in inputs]
    y = run(m, *leaves)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    (y * w.to(device=device, dtype=dtype)).sum().backward()
    grads = {k: p.grad for k, p in m.named_parameters() if p.grad is not None}
    for i, leaf in enumerate(leaves):
        if leaf.grad is not None:
            grads[f"input{i}"] = leaf.grad
    return y.detach(), grads


def check_models(ctx: Context) -> str:
    """Every model of meshshard.nn, forward and backward on the device, against float64 on the CPU."""
    import meshshard as ms

    tol32, tol64 = 1e-4, 1e-9
    results, problems, covered = {}, [], set()
    for name, build, inputs, run in _model_cases(ctx):
        torch.manual_seed(0)
        model = build().to(torch.float64)
        covered |= {type(m) for m in model.modules()}
        ref_y, ref_g = _fwd_bwd(model, run, inputs, "cpu", torch.float64)
        floor = _grad_floor(ref_g)
        row = {}
        for dtype, tol in ((torch.float32, tol32), (torch.float64, tol64)):
            y, g = _fwd_bwd(model, run, inputs, ctx.device, dtype)
            if y.device.type != torch.device(ctx.device).type:
                problems.append(f"{name}: output on {y.device}")
            errs = {"output": _rel(y, ref_y)}
            if set(g) != set(ref_g):
                problems.append(f"{name}/{dtype}: gradients of {sorted(set(ref_g) ^ set(g))} missing on one side")
            errs.update({k: _rel(g[k], ref_g[k], floor) for k in ref_g if k in g})
            worst = max(errs, key=errs.get)
            row[str(dtype).replace("torch.", "")] = {"max_rel_err": errs[worst], "worst": worst}
            if not errs[worst] <= tol:
                problems.append(f"{name}/{dtype}: {worst} rel. error {errs[worst]:.2e} > {tol:.0e}")
        results[name] = row
    public = [getattr(ms.nn, k) for k in getattr(ms.nn, "__all__", dir(ms.nn))]
    modules = [c for c in public if isinstance(c, type) and issubclass(c, torch.nn.Module)]
    unchecked = [c.__name__ for c in modules if c not in covered]
    ctx.details.update(models=results, tolerances={"float32": tol32, "float64": tol64}, unchecked=unchecked)
    _fail_if(problems, "model mismatches")
    note = f"; no check for {','.join(unchecked)}" if unchecked else ""
    worst32 = max(r["float32"]["max_rel_err"] for r in results.values())
    return f"{len(results)} models: fp32 rel. err <= {worst32:.1e} vs fp64 CPU{note}"


def check_chunked(ctx: Context) -> str:
    """chunked_forward equals the full forward on the device (float32 and float64, batched too)."""
    import meshshard as ms

    width, layers = (16, 2) if ctx.dry else (128, 4)
    n = ctx.size(200_000, 700)
    problems, rows = [], {}
    for dtype, tol in ((torch.float32, 2e-5), (torch.float64, 1e-12)):
        torch.manual_seed(0)
        model = ms.nn.Transolver(6, 4, n_hidden=width, n_layers=layers, n_head=8 if width >= 64 else 2,
                                 slice_num=32 if not ctx.dry else 4)
        model = model.to(ctx.device, dtype).eval()
        gen = torch.Generator().manual_seed(1)
        for shape in ((n, 6), (2, n // 2, 6)):
            x = torch.randn(shape, generator=gen, dtype=torch.float64).to(ctx.device, dtype)
            with torch.no_grad():
                full = model(x)
            for chunk in (n // 7 + 1, 4096 if not ctx.dry else 64):
                got = ms.nn.chunked_forward(model, x, chunk)
                err = _rel(got, full)
                rows[f"{dtype}/{list(shape)}/chunk={chunk}"] = err
                if not err <= tol:
                    problems.append(f"{dtype} {list(shape)} chunk {chunk}: rel. error {err:.2e} > {tol:.0e}")
    ctx.details.update(points=n, rel_err=rows)
    _fail_if(problems, "chunked mismatches")
    return f"chunked == full (max rel. err {max(rows.values()):.1e}, {len(rows)} cases)"


# -- the sharded-equals-serial suite, run on every rank --------------------------------------------------
def _rank_device(kind: str) -> str:
    import torch.distributed as dist

    if kind == "cuda-per-rank":
        return f"cuda:{dist.get_rank()}"
    return "cuda:0" if kind == "cuda-shared" else "cpu"


def _rank_collectives(kind: str) -> dict:
    """Each meshshard collective on device tensors under the current backend: 'ok' or the error."""
    import torch.distributed as dist

    from meshshard import comm

    device = _rank_device(kind)
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    sizes = [r + 1 for r in range(world)]

    def probe(name, fn, expect):
        try:
            got = fn()
            if got.device.type != torch.device(device).type:
                out[name] = f"result on {got.device}"
            elif not torch.equal(got.cpu(), expect):
                out[name] = "wrong values"
            else:
                out[name] = "ok"
        except Exception as exc:  # record and probe the next collective
            out[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"

    base = torch.arange(3, dtype=torch.float32)
    probe("all_reduce(sum)", lambda: comm.all_reduce((base + rank).to(device)),
          sum(base + r for r in range(world)))
    probe("all_reduce(max)", lambda: comm.all_reduce_max((base + rank).to(device)), base + world - 1)
    probe("all_gather", lambda: comm.all_gather((base + rank).to(device)),
          torch.stack([base + r for r in range(world)]))
    send = [1 + (rank + s) % 3 for s in range(world)]
    recv = [1 + (r + rank) % 3 for r in range(world)]
    payload = torch.cat([torch.full((send[s], 2), float(10 * rank + s)) for s in range(world)])
    expect = torch.cat([torch.full((recv[r], 2), float(10 * r + rank)) for r in range(world)])
    probe("all_to_all(uneven)", lambda: comm.all_to_all(payload.to(device), send, recv), expect)
    local = torch.full((sizes[rank], 2), float(rank))
    full = torch.cat([torch.full((sizes[r], 2), float(r)) for r in range(world)])
    probe("gather_uneven", lambda: comm.gather_uneven(local.to(device), sizes), full)
    probe("all_reduce(int64)", lambda: comm.all_reduce(torch.tensor([rank], device=device)),
          torch.tensor([sum(range(world))]))
    return out


def _compare(
    problems: list[str], errs: dict, name: str, got: torch.Tensor, ref: torch.Tensor, tol: float, floor: float = 0.0
) -> None:
    err = _rel(got, ref, floor)
    errs[name] = err
    if not err <= tol:
        problems.append(f"{name}: rel. error {err:.2e} > {tol:.0e}")


def _grad_floor(grads: dict[str, torch.Tensor]) -> float:
    """1e-3 of the norm of all gradients together: the scale below which a gradient's own relative error
    measures only cancellation (e.g. the query/key weights of near-uniform token attention at init)."""
    return 1e-3 * math.sqrt(sum(float(g.detach().double().norm()) ** 2 for g in grads.values()))


@dataclass
class _RankCase:
    """One rank's view of the sharded-equals-serial suite: its shard of the cloud, and what it found."""

    mesh: Any
    device: str
    rank: int
    world: int
    sizes: list[int]
    mine: slice  # this rank's rows in partition order
    problems: list[str] = field(default_factory=list)
    errs: dict[str, float] = field(default_factory=dict)
    counts: dict[str, dict] = field(default_factory=dict)

    def shard(self, global_tensor: torch.Tensor, grad: bool = False) -> tuple[Any, torch.Tensor]:
        import meshshard as ms

        leaf = global_tensor[self.mine].detach().clone().requires_grad_(grad)
        return ms.ShardTensor.from_local(leaf, self.mesh, sizes=self.sizes), leaf

    def compare(self, name: str, got: torch.Tensor, ref: torch.Tensor, tol: float, floor: float = 0.0) -> None:
        _compare(self.problems, self.errs, name, got, ref, tol, floor)


def _rank_suite(kind: str, n: int, fractions: list[float] | None, small: bool) -> dict:
    """On every rank: sharded ops, neighbour search, Transolver, PointConv and chunked inference on this
    rank's shard equal the serial computation on the gathered data (same device), with their collective
    counts. Returns this rank's errors and problems (the caller fails if any rank reports one).

    Mismatches are collected; an exception propagates at once (catching it on one rank would let the
    ranks' collectives fall out of step), and the pool reports every failing rank's traceback.
    """
    import torch.distributed as dist

    import meshshard as ms
    from meshshard.partition import partition

    device = _rank_device(kind)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = ms.init_mesh()
    pts_all = _cloud(n, 11).to(device)
    part = partition(pts_all, world, "rcb", fractions=fractions)
    sizes = [int(s) for s in part.sizes.tolist()]
    off = sum(sizes[:rank])
    pts = pts_all[part.perm]  # partition order: rank r owns rows [off, off + sizes[r])
    gen = torch.Generator().manual_seed(12)
    feats64 = torch.randn(n, 6, generator=gen, dtype=torch.float64).to(device)
    case = _RankCase(mesh, device, rank, world, sizes, slice(off, off + sizes[rank]))
    _suite_rules(case, feats64)
    radius, k = _radius_for(n, 16), 12
    nbr_status = _suite_neighbours(case, pts, radius, k)
    _suite_transolver(case, feats64, n, small)
    _suite_pointconv(case, pts, feats64, radius, k)
    return {"rank": rank, "device": device, "sizes": sizes, "problems": case.problems, "max_rel_err": case.errs,
            "neighbour_backends": nbr_status, "collectives": case.counts}


def _suite_rules(case: _RankCase, feats64: torch.Tensor) -> None:
    """ShardTensor rules (float64: exact up to summation order), and backward through a sharded reduction."""
    import meshshard as ms

    x, leaf = case.shard(feats64, grad=True)
    ref = feats64.detach().clone().requires_grad_()
    torch.manual_seed(0)  # the same replicated weights on every rank
    lin = torch.nn.Linear(6, 5).to(case.device, torch.float64)
    norm = torch.nn.LayerNorm(6).to(case.device, torch.float64)
    ops = {
        "pointwise": lambda t: torch.sin(t) * 2 + t.relu(),
        "sum(0)": lambda t: t.sum(0),
        "sum()": lambda t: t.sum(),
        "mean(0)": lambda t: t.mean(0),
        "var(0)": lambda t: t.var(0),
        "std(0)": lambda t: t.std(0),
        "amax(0)": lambda t: t.amax(0),
        "norm(dim=0)": lambda t: t.norm(dim=0),
        "logsumexp(0)": lambda t: torch.logsumexp(t, 0),
        "softmax(0)": lambda t: torch.softmax(t, 0),
        "einsum(contract N)": lambda t: torch.einsum("nc,nd->cd", t, t),
        "centre": lambda t: t - t.mean(0),
        "Linear": lin,
        "LayerNorm": norm,
    }
    for name, op in ops.items():
        with ms.CommCounter() as cc:
            got = op(x)
        case.counts[name] = dict(cc.counts)
        case.compare(name, _plain(got), op(ref), 1e-10)
    # backward through a sharded reduction and a sharded softmax
    ((torch.softmax(x, 0) * x).sum() + x.pow(2).mean()).backward()
    ((torch.softmax(ref, 0) * ref).sum() + ref.pow(2).mean()).backward()
    case.compare("backward(softmax, mean)", leaf.grad, ref.grad[case.mine], 1e-10)


def _suite_neighbours(case: _RankCase, pts: torch.Tensor, radius: float, k: int) -> dict[str, str]:
    """Global indices of the sharded ``ball_query``/``knn`` equal the serial rows, every backend; returns which
    backends ran."""
    import meshshard as ms

    p_shard, _ = case.shard(pts)
    nbr_status = {}
    for backend in backends():
        try:  # decided identically on every rank: the package is there or not
            ms.ops.ball_query(pts[:2], None, radius, 1, backend=backend)
        except Exception as exc:
            if not _unavailable(exc):
                raise
            nbr_status[backend] = "unavailable"
            continue
        for op in ("ball_query", "knn"):
            with ms.CommCounter() as cc:
                if op == "ball_query":
                    got = ms.ops.ball_query(p_shard, None, radius, k, backend=backend)
                else:
                    got = ms.ops.knn(p_shard, None, k, backend=backend)
            if op == "ball_query":
                want = ms.ops.ball_query(pts, None, radius, k, backend=backend)
            else:
                want = ms.ops.knn(pts, None, k, backend=backend)
            case.counts[f"{op}/{backend}"] = dict(cc.counts)
            mine = case.mine
            if not torch.equal(got.global_index(), want.index[mine]) or not torch.equal(got.count, want.count[mine]):
                case.problems.append(f"{op}/{backend}: sharded rows differ from the serial rows")
        nbr_status[backend] = "ok"
    return nbr_status


def _suite_transolver(case: _RankCase, feats64: torch.Tensor, n: int, small: bool) -> None:
    """Transolver forward/backward + sync_gradients, float64 and float32; chunked inference on shards."""
    import meshshard as ms

    width, layers, heads, slices = (16, 2, 2, 4) if small else (64, 3, 4, 16)
    runs = [(torch.float64, 1e-9, {}), (torch.float32, 1e-4, {})]
    runs += [(torch.float64, 1e-9, v) for v in transolver_variants() if v and v != {"variant": "plain"}]
    for dtype, tol, variant in runs:
        tag = str(dtype).replace("torch.", "") + _variant_tag(variant)
        torch.manual_seed(0)
        model = ms.nn.Transolver(6, 4, n_hidden=width, n_layers=layers, n_head=heads, slice_num=slices, **variant)
        model = model.to(case.device, dtype)
        sharded_model = copy.deepcopy(model)  # the same state (e.g. the seed of Transolver++'s noise)
        g = feats64.to(dtype)
        ref_x = g.clone().requires_grad_()
        ref_y = model(ref_x)
        ref_y.pow(2).mean().backward()
        ref_grads = {k2: p.grad.clone() for k2, p in model.named_parameters()}
        floor = _grad_floor(ref_grads)
        xs, xleaf = case.shard(g, grad=True)
        with ms.CommCounter() as fwd:
            y = sharded_model(xs)
        loss = y.pow(2).mean()
        with ms.CommCounter() as bwd:
            loss.backward()
        ms.nn.sync_gradients(sharded_model, case.mesh)
        case.counts[f"Transolver/{tag}"] = {"forward": dict(fwd.counts), "backward": dict(bwd.counts)}
        case.compare(f"Transolver/{tag}/output", _plain(y), ref_y, tol)
        case.compare(f"Transolver/{tag}/input grad", xleaf.grad, ref_x.grad[case.mine], tol)
        for k2, p in sharded_model.named_parameters():
            case.compare(f"Transolver/{tag}/grad {k2}", p.grad, ref_grads[k2], tol, floor)
        if case.world > 1 and not variant and fwd.counts.get("all_reduce", 0) != layers:
            case.problems.append(
                f"Transolver/{tag}: {fwd.counts.get('all_reduce', 0)} forward all_reduces, expected one per "
                f"layer ({layers})"
            )
        model.eval()
        with torch.no_grad():
            full = model(g)
            chunked = ms.nn.chunked_forward(model, case.shard(g)[0], max(1, n // (3 * case.world)))
        case.compare(f"chunked_forward/{tag}", _plain(chunked), full, tol)


def _suite_pointconv(case: _RankCase, pts: torch.Tensor, feats64: torch.Tensor, radius: float, k: int) -> None:
    """PointConv: halo exchange of features and positions, forward and backward."""
    import meshshard as ms

    torch.manual_seed(0)
    conv = ms.nn.PointConv(6, 8, hidden_channels=(16,)).to(case.device, torch.float64)
    pos64 = pts.to(torch.float64)
    ref_f = feats64.clone().requires_grad_()
    ref_out = conv(ref_f, pos64, ms.ops.ball_query(pos64, None, radius, k))
    ref_out.pow(2).sum().backward()
    ref_grads = {k2: p.grad.clone() for k2, p in conv.named_parameters()}
    conv.zero_grad(set_to_none=True)
    f_shard, f_leaf = case.shard(feats64, grad=True)
    pos_shard, _ = case.shard(pos64)
    with ms.CommCounter() as cc:
        out = conv(f_shard, pos_shard, ms.ops.ball_query(pos_shard, None, radius, k))
        out.pow(2).sum().backward()
    ms.nn.sync_gradients(conv, case.mesh)
    case.counts["PointConv"] = dict(cc.counts)
    case.compare("PointConv/output", _plain(out), ref_out, 1e-10)
    case.compare("PointConv/input grad", f_leaf.grad, ref_f.grad[case.mine], 1e-10)
    for k2, p in conv.named_parameters():
        case.compare(f"PointConv/grad {k2}", p.grad, ref_grads[k2], 1e-10)


def _run_pool(world: int, backend: str, ctx: Context, fn: Callable, *args: Any) -> list:
    from meshshard.testing import WorkerPool

    limit = max(10.0, ctx.left() - 5.0)
    pool = WorkerPool(world, backend=backend, timeout=min(120.0, limit), num_threads=1 if ctx.dry else 2)
    try:
        return pool.run(fn, *args, deadline=limit)
    finally:
        pool.close()


def _suite_summary(ctx: Context, key: str, results: list[dict]) -> list[str]:
    ctx.details[key] = {
        "sizes": results[0]["sizes"],
        "devices": [r["device"] for r in results],
        "max_rel_err": {k: max(r["max_rel_err"].get(k, 0.0) for r in results) for k in results[0]["max_rel_err"]},
        "neighbour_backends": results[0]["neighbour_backends"],
        "collectives_rank0": results[0]["collectives"],
    }
    return [f"{key} rank {r['rank']}: {p}" for r in results for p in r["problems"]]


def check_world1_nccl(ctx: Context) -> str:
    """The whole sharded suite at world size 1 with NCCL on CUDA tensors (gloo on the CPU in dry mode)."""
    backend = "gloo" if ctx.dry else "nccl"
    kind = "cpu" if ctx.dry else "cuda-per-rank"
    results = _run_pool(1, backend, ctx, _suite_fn(), kind, ctx.size(20_000, 400), None, ctx.dry)
    problems = _suite_summary(ctx, f"world1/{backend}", results)
    _fail_if(problems, "sharded mismatches")
    return f"world 1 {backend}: {len(results[0]['max_rel_err'])} comparisons exact"


def check_gloo_collectives(ctx: Context) -> str:
    """Which meshshard collectives gloo runs on CUDA tensors (2 ranks sharing one GPU)."""
    kind = "cpu" if ctx.dry else "cuda-shared"
    results = _run_pool(2, "gloo", ctx, _module_fn("_rank_collectives"), kind)
    table = {name: sorted({r[name] for r in results}) for name in results[0]}
    ctx.details["gloo_on_" + ("cpu" if ctx.dry else "cuda")] = table
    bad = [f"{name}: {'; '.join(v)}" for name, v in table.items() if v != ["ok"]]
    _fail_if(bad, "collectives fail on gloo with device tensors")
    return f"gloo runs all {len(table)} collectives on {'CPU' if ctx.dry else 'CUDA'} tensors"


def check_multirank_gloo(ctx: Context) -> str:
    """Sharded equals serial on 2 and 4 ranks sharing one GPU: gloo with CUDA tensors."""
    kind = "cpu" if ctx.dry else "cuda-shared"
    n = ctx.size(20_000, 400)
    problems = []
    # dry mode (CPU): 3 uneven ranks with an empty one, the code paths of both CUDA runs (world 1 runs
    # fractions=None); the regular test suite checks 2-4 ranks on the CPU many times over. Every rank computes
    # the serial reference, so 4 ranks on a 2-core machine cost twice as much for no new branch.
    worlds = ((3, [0.6, 0.0, 0.4]),) if ctx.dry else ((2, None), (4, [0.3, 0.0, 0.5, 0.2]))
    for world, fractions in worlds:
        results = _run_pool(world, "gloo", ctx, _suite_fn(), kind, n, fractions, ctx.dry)
        problems += _suite_summary(ctx, f"world{world}/gloo", results)
    _fail_if(problems, "sharded mismatches")
    ranks = " and ".join(str(w) for w, _ in worlds)
    return f"{ranks} ranks (one empty) on one device, gloo + device tensors: sharded == serial"


def check_multigpu_nccl(ctx: Context) -> str:
    """Sharded equals serial under NCCL with one rank per GPU (needs at least 2 GPUs)."""
    if ctx.dry or ctx.num_gpus < 2:
        raise Skip(f"needs >= 2 CUDA devices (found {ctx.num_gpus})")
    world = min(ctx.num_gpus, 4)
    fractions = None if world < 3 else [0.3, 0.0] + [0.7 / (world - 2)] * (world - 2)
    results = _run_pool(world, "nccl", ctx, _suite_fn(), "cuda-per-rank", 20_000, fractions, False)
    problems = _suite_summary(ctx, f"world{world}/nccl", results)
    _fail_if(problems, "sharded mismatches")
    return f"{world} GPUs under NCCL: sharded == serial"


def _module_fn(name: str) -> Callable:
    """A function of this module by its importable name (pickled by reference for worker ranks)."""
    return getattr(importlib.import_module("tools.gpu_check"), name)


def _suite_fn() -> Callable:
    return _module_fn("_rank_suite")


# -- figures -------------------------------------------------------------------------------------------
def _predict_skip(ctx: Context, seconds_small: float | None, factor: float) -> str | None:
    """Why a bigger size would not fit (its time predicted as ``factor`` x the smaller one), or None."""
    if seconds_small is None:
        return None
    need = seconds_small * factor * 1.3
    if need > ctx.left() - 10:
        return f"skipped: predicted {need:.0f} s > {max(0.0, ctx.left() - 10):.0f} s left"
    return None


def _peer_torch_cluster(pts: torch.Tensor, radius: float, k: int) -> Callable[[], Any] | None:
    try:
        import torch_cluster
    except ImportError:
        return None
    return lambda: torch_cluster.radius(pts, pts, radius, max_num_neighbors=k)


def _peer_warp(pts: torch.Tensor, radius: float) -> Callable[[], Any] | None:
    """Warp's raw HashGrid query: count the neighbours within ``radius`` (no order, no truncation)."""
    try:
        import warp as wp
    except ImportError:
        return None
    wp.init()
    device = "cuda:0" if pts.is_cuda else "cpu"

    @wp.kernel
    def count(grid: wp.uint64, p: wp.array(dtype=wp.vec3), r: float, out: wp.array(dtype=int)):
        tid = wp.tid()
        i = wp.hash_grid_point_id(grid, tid)
        q = p[i]
        c = int(0)  # noqa: UP018 (warp: a mutable loop counter)
        for j in wp.hash_grid_query(grid, q, r):
            if wp.length(p[j] - q) <= r:
                c += 1
        out[i] = c

    p = wp.from_torch(pts.contiguous(), dtype=wp.vec3)
    dims = max(1, min(256, int(1.0 / radius)))

    def run():
        grid = wp.HashGrid(dims, dims, dims, device=device)
        grid.build(p, radius)
        out = wp.zeros(pts.shape[0], dtype=int, device=device)
        wp.launch(count, dim=pts.shape[0], inputs=[grid.id, p, radius, out], device=device)
        wp.synchronize_device(device)
        return out

    return run


def check_fig_neighbors(ctx: Context) -> str:
    """Ball query (K = 32, ~30 neighbours) and kNN (k = 16) on 1M and 10M device points, every backend."""
    sizes = (2_000, 6_000) if ctx.dry else (1_000_000, 10_000_000)
    k_ball, k_nn = 32, 16
    rows: dict[str, dict] = {}
    ctx.details.update(k_ball=k_ball, k_nn=k_nn, neighbours_per_ball="about 30", figures=rows)
    last: dict[str, float] = {}
    warm = _cloud(2000, 0).to(ctx.device)
    for n in sizes:
        gen = torch.Generator(device="cpu").manual_seed(n)
        pts = torch.rand(n, 3, generator=gen).to(ctx.device)
        radius = _radius_for(n, 30)
        entries: dict[str, Any] = {}
        rows[f"{n}"] = entries
        growth = n / sizes[0] if n != sizes[0] else None
        _fig_neighbors_backends(ctx, entries, last, growth, pts, warm, radius, k_ball, k_nn)
        _fig_neighbors_peers(ctx, entries, last, growth, pts, radius, k_ball)
        ctx.save()
        pts = None
        _free(ctx.device)
    done = [f"{key} {v['s']:.2f}s" for n, e in rows.items() for key, v in e.items()
            if isinstance(v, dict) and key.startswith("ball_query") and n == str(sizes[-1])]
    return f"{sizes[-1]} pts: " + (", ".join(done) if done else "no backend finished")


def _fig_neighbors_backends(
    ctx: Context, entries: dict, last: dict, growth: float | None, pts: torch.Tensor, warm: torch.Tensor,
    radius: float, k_ball: int, k_nn: int,
) -> None:
    """Time ``ball_query`` and ``knn`` of every kernel backend on ``pts`` (``growth``: the size's ratio to the
    first size, ``None`` for the first; a size predicted not to fit what is left is skipped)."""
    import meshshard as ms

    for backend in backends():
        for op in ("ball_query", "knn"):
            key = f"{op}/{backend}"
            skip = _predict_skip(ctx, last.get(key), growth) if growth is not None else None
            if skip:
                entries[key] = skip
                continue
            try:
                if op == "ball_query":
                    ms.ops.ball_query(warm, None, _radius_for(2000, 30), k_ball, backend=backend)
                    base = _reset_peak(ctx.device)
                    nbr, sec = _timed(ctx.device, ms.ops.ball_query, pts, None, radius, k_ball, backend=backend)
                else:
                    ms.ops.knn(warm, None, k_nn, backend=backend)
                    base = _reset_peak(ctx.device)
                    nbr, sec = _timed(ctx.device, ms.ops.knn, pts, None, k_nn, backend=backend)
                entries[key] = {"s": round(sec, 3), "peak_mib": _peak_mib(ctx.device, base),
                                "mean_count": round(float(nbr.count.double().mean()), 2)}
                last[key] = sec
                del nbr
            except Exception as exc:
                if _unavailable(exc):
                    entries[key] = "unavailable"
                elif _is_oom(exc):
                    entries[key] = f"out of memory: {str(exc).splitlines()[0][:160]}"
                else:
                    raise
            _free(ctx.device)
            ctx.save()


def _fig_neighbors_peers(
    ctx: Context, entries: dict, last: dict, growth: float | None, pts: torch.Tensor, radius: float, k_ball: int
) -> None:
    """Time the peers on the same points: torch_cluster, warp's raw ``HashGrid``, scipy's ``cKDTree`` (CPU)."""
    peers = {
        "torch_cluster.radius": _peer_torch_cluster(pts, radius, k_ball),
        # warp compiles its kernel on first use (seconds on the CPU): a GPU peer only
        "warp.HashGrid count": None if ctx.dry else _peer_warp(pts, radius),
    }
    for name, run in peers.items():
        if run is None:
            entries[name] = "unavailable"
            continue
        skip = _predict_skip(ctx, last.get(name), growth) if growth is not None else None
        if skip:
            entries[name] = skip
            continue
        try:
            run()  # warm-up (compilation, allocator)
            base = _reset_peak(ctx.device)
            _, sec = _timed(ctx.device, run)
            entries[name] = {"s": round(sec, 3), "peak_mib": _peak_mib(ctx.device, base)}
            last[name] = sec
        except Exception as exc:
            entries[name] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        _free(ctx.device)
        ctx.save()
    skip = _predict_skip(ctx, last.get("scipy.cKDTree"), growth * 1.2) if growth is not None else None
    if skip:
        entries["scipy.cKDTree query (CPU)"] = skip
        return
    try:
        from scipy.spatial import cKDTree

        host = pts.cpu().numpy()
        t0 = time.perf_counter()
        cKDTree(host).query(host, k=k_ball, distance_upper_bound=radius, workers=-1)
        last["scipy.cKDTree"] = time.perf_counter() - t0
        entries["scipy.cKDTree query (CPU)"] = {"s": round(last["scipy.cKDTree"], 3)}
    except ImportError:
        entries["scipy.cKDTree query (CPU)"] = "unavailable"


def _transolver_config(ctx: Context) -> dict:
    if ctx.dry:
        return dict(n_hidden=16, n_layers=2, n_head=2, slice_num=4)
    return dict(n_hidden=256, n_layers=8, n_head=8, slice_num=32)


def _features(n: int, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Point features (position and a Fourier feature) and a smooth 4-channel target, made on the device."""
    gen = torch.Generator(device=device).manual_seed(seed)
    pos = torch.rand(n, 3, generator=gen, device=device)
    x = torch.cat([pos, torch.sin(6.28 * pos)], -1)
    s = pos.sum(-1, keepdim=True)
    return x, torch.cat([torch.sin(3 * s), torch.cos(2 * s), pos[:, :1] * pos[:, 1:2], s * s], -1)


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, target: torch.Tensor):
    opt.zero_grad(set_to_none=True)
    loss = (model(x) - target).pow(2).mean()
    loss.backward()
    opt.step()
    return loss.detach()


def check_fig_transolver(ctx: Context) -> str:
    """A Transolver training step (AdamW) at 1M points, C = 256, L = 8: time and peak CUDA memory."""
    import meshshard as ms

    n = ctx.size(1_000_000, 2_000)
    config = _transolver_config(ctx)
    rows: dict[str, Any] = {}
    ctx.details.update(points=n, config=config, dtype="float32", runs=rows)
    for checkpoint in (False, True):
        tag = "checkpointed blocks" if checkpoint else "plain"
        if ctx.left() < 20 and rows:
            rows[tag] = f"skipped: {ctx.left():.0f} s left"
            continue
        try:
            torch.manual_seed(0)
            model = ms.nn.Transolver(6, 4, **config, checkpoint=checkpoint).to(ctx.device)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            x, target = _features(n, ctx.device, 0)
            base = _reset_peak(ctx.device)
            times, losses = [], []
            for _ in range(3):  # one warm-up step, two timed
                loss, sec = _timed(ctx.device, _train_step, model, opt, x, target)
                times.append(sec)
                losses.append(float(loss))
            rows[tag] = {"step_s": round(sum(times[1:]) / 2, 3), "first_step_s": round(times[0], 3),
                         "peak_mib_above_model_and_input": _peak_mib(ctx.device, base),
                         "losses": [round(v, 6) for v in losses]}
        except Exception as exc:
            if not _is_oom(exc):
                raise
            rows[tag] = f"out of memory: {str(exc).splitlines()[0][:160]}"
        finally:
            model = opt = x = target = None
            _free(ctx.device)
            ctx.save()
    ok = {k: v for k, v in rows.items() if isinstance(v, dict)}
    if not ok:
        raise AssertionError(f"no training step finished: {rows}")
    return "; ".join(
        f"{k}: {v['step_s']:.2f} s/step" + (f", peak {v['peak_mib_above_model_and_input'] / 1024:.1f} GiB"
                                             if v["peak_mib_above_model_and_input"] is not None else "")
        for k, v in ok.items()
    )


def check_fig_chunked(ctx: Context) -> str:
    """Exact chunked inference of an 8.8M-point cloud (C = 256, L = 8) against the full forward: peak memory."""
    import meshshard as ms

    n = ctx.size(8_800_000, 3_000)
    chunk = ctx.size(1_000_000, 500)
    torch.manual_seed(0)
    model = ms.nn.Transolver(6, 4, **_transolver_config(ctx)).to(ctx.device).eval()
    x, _ = _features(n, ctx.device, 1)
    rows: dict[str, Any] = {}
    base = _reset_peak(ctx.device)
    chunked, sec = _timed(ctx.device, ms.nn.chunked_forward, model, x, chunk)
    rows["chunked"] = {"s": round(sec, 3), "peak_mib": _peak_mib(ctx.device, base), "chunk": chunk}
    ctx.details.update(points=n, runs=rows)
    ctx.save()
    if ctx.left() > 30:
        try:
            base = _reset_peak(ctx.device)
            with torch.no_grad():
                full, sec = _timed(ctx.device, model, x)
            rows["full (no_grad)"] = {"s": round(sec, 3), "peak_mib": _peak_mib(ctx.device, base)}
            rows["rel_err"] = _rel(chunked, full)
            if not rows["rel_err"] <= 1e-4:  # float32 slice sums over 8.8M points, summed in another order
                raise AssertionError(f"chunked differs from the full forward: rel. error {rows['rel_err']:.2e}")
        except Exception as exc:
            if not _is_oom(exc):
                raise
            rows["full (no_grad)"] = f"out of memory: {str(exc).splitlines()[0][:160]}"
    else:
        rows["full (no_grad)"] = f"skipped: {ctx.left():.0f} s left"
    ctx.details.update(runs=rows)
    c = rows["chunked"]
    text = f"chunked {c['s']:.2f} s" + (f", peak {c['peak_mib'] / 1024:.2f} GiB" if c["peak_mib"] is not None else "")
    f = rows["full (no_grad)"]
    if isinstance(f, dict):
        text += f"; full {f['s']:.2f} s" + (f", peak {f['peak_mib'] / 1024:.2f} GiB" if f["peak_mib"] else "")
        text += f"; rel. diff {rows['rel_err']:.1e}"
    return text


def check_fig_partition(ctx: Context) -> str:
    """The partitioner on 10M device points into 64 parts (and the CPU on the same points)."""
    from meshshard.partition import partition

    n = ctx.size(10_000_000, 5_000)
    pts = torch.rand(n, 3, generator=torch.Generator().manual_seed(2))
    dev = pts.to(ctx.device)
    rows: dict[str, Any] = {}
    ctx.details.update(points=n, parts=64, runs=rows, cpu_threads=torch.get_num_threads())
    partition(dev[:1000], 8)  # warm-up
    for method in ("rcb", "morton", "hilbert"):
        base = _reset_peak(ctx.device)
        part, sec = _timed(ctx.device, partition, dev, 64, method)
        rows[method] = {"device_s": round(sec, 3), "peak_mib": _peak_mib(ctx.device, base)}
        if ctx.dry or ctx.left() > 3 * sec + 20:
            ref, cpu_sec = _timed("cpu", partition, pts, 64, method)
            rows[method]["cpu_s"] = round(cpu_sec, 3)
            rows[method]["equal_to_cpu"] = bool(torch.equal(part.perm.cpu(), ref.perm))
            if not rows[method]["equal_to_cpu"]:
                raise AssertionError(f"{method}: the device partition of {n} points differs from the CPU one")
        del part
        _free(ctx.device)
        ctx.save()
    return ", ".join(f"{m} {r['device_s']:.2f} s" + (f" (CPU {r['cpu_s']:.2f} s)" if "cpu_s" in r else "")
                     for m, r in rows.items())


CHECKS: tuple[Check, ...] = (
    Check("environment", "env", 40, check_environment),
    Check("partition_cuda_equals_cpu", "correctness", 30, check_partition),
    Check("neighbors_cuda_equals_cpu", "correctness", 45, check_neighbors),
    Check("models_cuda_vs_float64_cpu", "correctness", 40, check_models),
    Check("chunked_equals_full", "correctness", 30, check_chunked),
    Check("sharded_world1_nccl", "correctness", 50, check_world1_nccl),
    Check("gloo_collectives_cuda_tensors", "multirank", 30, check_gloo_collectives),
    Check("sharded_multirank_one_gpu_gloo", "multirank", 80, check_multirank_gloo),
    Check("sharded_multigpu_nccl", "multirank", 60, check_multigpu_nccl),
    Check("fig_neighbors_1M_10M", "figures", 120, check_fig_neighbors),
    Check("fig_transolver_train_1M", "figures", 60, check_fig_transolver),
    Check("fig_chunked_inference_8_8M", "figures", 60, check_fig_chunked),
    Check("fig_partition_10M", "figures", 40, check_fig_partition),
)
_BY_NAME = {c.name: c for c in CHECKS}


# -- the runner ------------------------------------------------------------------------------------------
def _injected_fault(name: str, after_save: bool = False) -> None:
    """``MESHSHARD_GPU_CHECK_FAULT="check=raise|hang|exit|hang-after-save,..."``: make a check fail on
    purpose (at its start, or after its first saved measurement), to test that the runner records it,
    keeps what it had measured, and runs the others."""
    for item in os.environ.get("MESHSHARD_GPU_CHECK_FAULT", "").split(","):
        check, _, kind = item.partition("=")
        if check != name or after_save != (kind == "hang-after-save"):
            continue
        if kind == "hang-after-save":
            time.sleep(1e6)
        if kind == "raise":
            raise RuntimeError(f"fault injected into {name}")
        if kind == "hang":
            time.sleep(1e6)
        if kind == "exit":
            os._exit(3)


def _child(name: str, ctx_fields: dict, conn: Any) -> None:
    """Run one check in this (child) process and send ``(status, summary, details)`` to the parent."""
    os.setsid()  # its own process group: the parent can kill it together with its worker ranks
    ctx = Context(**ctx_fields)
    try:
        _injected_fault(name)
        summary = _BY_NAME[name].fn(ctx)
        if ctx.device.startswith("cuda"):
            ctx.details.setdefault("cuda_peak_mib", _peak_mib(ctx.device))
        conn.send(("passed", summary, ctx.details))
    except Skip as exc:
        conn.send(("skipped", str(exc), ctx.details))
    except BaseException as exc:
        ctx.details["traceback"] = traceback.format_exc()
        conn.send(("failed", f"{type(exc).__name__}: {exc}", ctx.details))
    finally:
        conn.close()


def _probe(conn: Any) -> None:
    os.setsid()
    try:
        ok = torch.cuda.is_available()
        conn.send((ok, torch.cuda.device_count() if ok else 0, None))
    except Exception as exc:
        conn.send((False, 0, f"{type(exc).__name__}: {exc}"))


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _isolated(mpctx: Any, target: Callable, args: tuple, limit: float) -> tuple[str, Any]:
    """Run ``target(*args, conn)`` in a child; ``("ok", message)``, ``("timeout", None)`` or ``("died", code)``."""
    parent, child = mpctx.Pipe(duplex=False)
    proc = mpctx.Process(target=target, args=(*args, child))
    proc.start()
    child.close()
    try:
        try:
            ready = parent.poll(max(0.1, limit))
        except BaseException:  # e.g. Ctrl-C: the child is in its own session and would run on
            _kill_group(proc.pid)
            raise
        if ready:
            try:
                return "ok", parent.recv()
            except (EOFError, OSError):
                proc.join(5)
                return "died", proc.exitcode
        _kill_group(proc.pid)
        return "timeout", None
    finally:
        proc.join(10)
        _kill_group(proc.pid)  # whatever it left behind (worker ranks of a failed pool)
        proc.join(5)
        parent.close()


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def _load_snapshot(path: str) -> dict:
    """What a check that timed out or died had measured (its last :meth:`Context.save`), if anything."""
    try:
        with open(path) as f:
            return {**json.load(f), "partial": True}
    except (OSError, ValueError):
        return {}


def run_checks(
    dry: bool = False,
    only: list[str] | None = None,
    budget: float = _DEFAULT_BUDGET_S,
    start_method: str = "forkserver",
    time_scale: float | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Run the checks (each isolated, within ``budget`` seconds in all) and return the report.

    Each check's own limit is its ``budget_s`` times ``time_scale`` (default 1 on CUDA, 5 in dry mode,
    where a loaded CPU runs the tiny sizes), capped by what is left of ``budget``.
    """
    if log is None:
        def log(line: str) -> None:
            print(line, flush=True)
    t_start = time.monotonic()
    wall_start = time.strftime("%Y-%m-%d %H:%M:%S")
    mpctx = mp.get_context(start_method)
    if start_method == "forkserver":
        mpctx.set_forkserver_preload(["torch", "meshshard"])
    how, probe = _isolated(mpctx, _probe, (), 120)
    cuda, num_gpus, probe_error = probe if how == "ok" else (False, 0, f"CUDA probe {how}")
    mode = "dry" if dry or not cuda else "cuda"
    if mode == "dry" and not dry:
        log(f"no CUDA device ({probe_error or 'torch.cuda.is_available() is False'}): running the dry mode on the CPU")
    device = "cuda:0" if mode == "cuda" else "cpu"
    scale = time_scale if time_scale is not None else (5.0 if mode == "dry" else 1.0)
    selected = [c for c in CHECKS if not only or c.name in only]
    results = []
    scratch = tempfile.mkdtemp(prefix="meshshard-gpu-check-")
    try:
        _run_all(selected, results, mpctx, scratch, mode, device, num_gpus, scale, budget, t_start, log)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "mode": mode,
        "device": device,
        "num_gpus": num_gpus,
        "started": wall_start,
        "budget_s": budget,
        "time_scale": scale,
        "wall_s": round(time.monotonic() - t_start, 2),
        "host": platform.node(),
        "passed": all(r["status"] != "failed" for r in results),
        "checks": results,
    }


def _run_all(selected, results, mpctx, scratch, mode, device, num_gpus, scale, budget, t_start, log) -> None:
    for i, check in enumerate(selected):
        left = budget - (time.monotonic() - t_start)
        # on a GPU, keep a quarter of each later check's limit in reserve, so that slow early checks
        # cannot starve the figures
        reserve = sum(_RESERVE * c.budget_s * scale for c in selected[i + 1 :]) if mode == "cuda" else 0.0
        limit = min(check.budget_s * scale, left - reserve)
        entry = {"name": check.name, "group": check.group, "budget_s": check.budget_s}
        if limit < 5:
            entry.update(status="skipped", summary=f"out of time ({left:.0f} s left of {budget:.0f})", seconds=0.0)
            results.append(entry)
            log(f"  {check.name:<32} skipped (out of time)")
            continue
        snapshot = os.path.join(scratch, f"{check.name}.json")
        fields = dict(dry=mode == "dry", device=device, num_gpus=num_gpus, deadline=time.monotonic() + limit,
                      details_path=snapshot, name=check.name)
        t0 = time.monotonic()
        how, msg = _isolated(mpctx, _child, (check.name, fields), limit)
        seconds = round(time.monotonic() - t0, 2)
        if how == "ok":
            status, summary, details = msg
        else:
            status = "failed"
            if how == "timeout":
                summary = f"timed out after {limit:.0f} s (its time budget)"
            else:
                summary = f"the check's process died (exit code {msg})"
            details = _load_snapshot(snapshot)
        entry.update(status=status, summary=summary, seconds=seconds, details=_json_safe(details))
        results.append(entry)
        log(f"  {check.name:<32} {status:<7} {seconds:7.1f} s  {summary.splitlines()[0][:150]}")


def _flatten(details: dict, skip: tuple[str, ...] = (), prefix: str = "") -> list[str]:
    """One line per leaf group of a figure's details: ``path: key=value key=value``."""
    leaves = {k: v for k, v in details.items() if k not in skip and not isinstance(v, dict)}
    lines = []
    if leaves:
        text = " ".join(f"{k}={v}" for k, v in leaves.items())
        lines.append(f"{prefix}: {text}" if prefix else text)
    for k, v in details.items():
        if k not in skip and isinstance(v, dict):
            lines += _flatten(v, skip, f"{prefix} {k}".strip())
    return lines


def format_table(report: dict) -> str:
    """The short table printed at the end: one line per check."""
    lines = [
        f"meshshard GPU check: mode {report['mode']} ({report['device']}, {report['num_gpus']} GPU), "
        f"{report['wall_s']:.0f} s of {report['budget_s']:.0f}",
        f"{'check':<32} {'status':<8} {'s':>6}  summary",
        "-" * 110,
    ]
    for r in report["checks"]:
        lines.append(f"{r['name']:<32} {r['status']:<8} {r['seconds']:6.1f}  {r['summary'].splitlines()[0][:160]}")
    failed = [r["name"] for r in report["checks"] if r["status"] == "failed"]
    lines.append("-" * 110)
    for r in report["checks"]:
        if r["group"] == "figures" and r.get("details"):
            lines.append(f"{r['name']}:")
            lines += [f"  {line}" for line in _flatten(r["details"], skip=("traceback", "cuda_peak_mib"))]
    if any(r["group"] == "figures" and r.get("details") for r in report["checks"]):
        lines.append("-" * 110)
    lines.append("all checks passed" if not failed else f"FAILED: {', '.join(failed)}")
    return "\n".join(lines)


def _default_out(dry: bool) -> Path:
    root = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    base = root if root.is_dir() else Path.cwd()
    return base / ("gpu_check_dry.json" if dry else "gpu_check.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.gpu_check",
        description="Check meshshard's CUDA path in one run (dry mode on the CPU without CUDA).",
    )
    parser.add_argument("--dry", action="store_true", help="tiny sizes on the CPU (automatic without CUDA)")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON report (default benchmarks/results/gpu_check[_dry].json)")
    parser.add_argument("--budget", type=float, default=_DEFAULT_BUDGET_S, help="seconds for all checks together")
    parser.add_argument("--time-scale", type=float, default=None,
                        help="multiply every check's time limit (default 1 on CUDA, 5 in dry mode)")
    parser.add_argument("--only", nargs="+", choices=[c.name for c in CHECKS], help="run only these checks")
    parser.add_argument("--start-method", choices=("forkserver", "spawn"), default="forkserver",
                        help="how check processes start (forkserver: torch imported once)")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    args = parser.parse_args(argv)
    if args.list:
        for c in CHECKS:
            print(f"{c.name:<32} {c.group:<12} {c.budget_s:5.0f} s  {(c.fn.__doc__ or '').splitlines()[0]}")
        return 0
    if args.budget <= 0:
        parser.error(f"--budget must be positive (got {args.budget})")
    if args.time_scale is not None and args.time_scale <= 0:
        parser.error(f"--time-scale must be positive (got {args.time_scale})")
    report = run_checks(dry=args.dry, only=args.only, budget=args.budget, start_method=args.start_method,
                        time_scale=args.time_scale)
    out = args.out or _default_out(report["mode"] == "dry")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=1))
    os.replace(tmp, out)
    print(format_table(report))
    print(f"report: {out}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    # Run the copy imported under the module's real name, so worker ranks can unpickle its functions.
    sys.exit(importlib.import_module("tools.gpu_check").main())
