"""Eager vs ``torch.compile`` (inductor, ``fullgraph=True``) step time of the sharded Transolver; compile time apart.

For each ``P`` (default 1 and 2; gloo, one thread per rank) every rank builds the same Transolver
(float32, ``variant="plain"``) and its own shard of ``N`` points (uneven: rank ``r`` holds about
``(r + 1) / sum`` of them), then times a training step (forward, MSE loss, backward) eagerly and
compiled. At ``P = 1`` the plain (unsharded) model on a plain tensor is timed too, eager and compiled:
the floor the sharded step is measured against. Reported per configuration: the mean step time over
the timed steps after warm-up (framed by barriers: the slowest rank's), the first compiled call (the
compile time, measured separately), the speed-up eager/compiled, and the difference between the
compiled and the eager loss (must be float32 round-off).

Run: ``PYTHONPATH=. python benchmarks/bench_compile.py [--points N] [--hidden C] [--layers L]
[--ranks 1 2] [--steps K] [--out NAME] [--profile]``; ``--profile`` prints, per rank, the CPU time
per step next to the wall time and the top ops of one profiled step, eager and compiled (nothing saved).
Results: ``benchmarks/results/bench_compile.json`` (or NAME).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def _sizes(n: int, p: int) -> list[int]:
    weights = list(range(1, p + 1))
    sizes = [n * w // sum(weights) for w in weights]
    sizes[-1] += n - sum(sizes)
    return sizes


def _time_steps(step, x, steps: int, barrier) -> tuple[float, float, float]:
    """(first call seconds, mean seconds of ``steps`` later calls after one warm-up, first loss)."""
    barrier()
    t0 = time.perf_counter()
    loss = step(x)
    barrier()
    first = time.perf_counter() - t0
    step(x)
    barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        step(x)
    barrier()
    return first, (time.perf_counter() - t0) / steps, float(loss)


def _cpu_and_profile(step, x, steps: int, barrier) -> tuple[float, str]:
    """(this process's CPU seconds per step, the top ops of one profiled step by self CPU time)."""
    from torch.profiler import ProfilerActivity, profile

    c0 = time.process_time()
    for _ in range(steps):
        step(x)
    cpu = (time.process_time() - c0) / steps
    barrier()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(x)
        barrier()
    return cpu, prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60)


def _worker(cfg: dict) -> dict:
    import torch.distributed as dist

    import meshshard as ms

    torch.set_num_threads(1)
    mesh = ms.init_mesh()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = ms.nn.Transolver(6, 4, n_hidden=cfg["hidden"], n_layers=cfg["layers"], n_head=cfg["heads"],
                             slice_num=cfg["slices"])
    sizes = _sizes(cfg["points"], world)
    lo = sum(sizes[:rank])
    gen = torch.Generator().manual_seed(1)
    pts = torch.randn(cfg["points"], 6, generator=gen)[lo:lo + sizes[rank]]
    x = ms.ShardTensor.from_local(pts, mesh, sizes=sizes)

    def step(inp):
        model.zero_grad(set_to_none=True)
        loss = model(inp).square().mean()
        loss.backward()
        return loss.detach()

    barrier = dist.barrier
    out = {"P": world, "sizes": sizes}
    _, out["eager_s"], eager_loss = _time_steps(step, x, cfg["steps"], barrier)
    if cfg["profile"]:
        out["eager_cpu_s"], out["eager_profile"] = _cpu_and_profile(step, x, cfg["steps"], barrier)
    torch._dynamo.reset()
    compiled_model = torch.compile(model, fullgraph=True)

    def cstep(inp):
        model.zero_grad(set_to_none=True)
        loss = compiled_model(inp).square().mean()
        loss.backward()
        return loss.detach()

    out["compile_s"], out["compiled_s"], compiled_loss = _time_steps(cstep, x, cfg["steps"], barrier)
    if cfg["profile"]:
        out["compiled_cpu_s"], out["compiled_profile"] = _cpu_and_profile(cstep, x, cfg["steps"], barrier)
    out["loss_diff"] = abs(compiled_loss - eager_loss)
    if world == 1 and not cfg["profile"]:  # the floor: the plain model on a plain tensor
        plain = pts.clone()
        _, out["plain_eager_s"], _ = _time_steps(step, plain, cfg["steps"], barrier)
        torch._dynamo.reset()
        compiled_model = torch.compile(model, fullgraph=True)
        out["plain_compile_s"], out["plain_compiled_s"], _ = _time_steps(cstep, plain, cfg["steps"], barrier)
    return out


def _print_profiles(ranks: list[dict]) -> None:
    for r, o in enumerate(ranks):
        print(f"=== P={o['P']} rank {r} of sizes {o['sizes']}: eager {1e3 * o['eager_s']:.1f} ms/step wall, "
              f"{1e3 * o['eager_cpu_s']:.1f} ms CPU; compiled {1e3 * o['compiled_s']:.1f} ms/step wall, "
              f"{1e3 * o['compiled_cpu_s']:.1f} ms CPU (compile {o['compile_s']:.1f} s)")
        for kind in ("eager", "compiled"):
            print(f"--- {kind}, rank {r}, one step by self CPU time\n{o[kind + '_profile']}", flush=True)


def main() -> None:
    from meshshard.testing import run_distributed

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=20000)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--slices", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--out", default="bench_compile.json", help="file name under benchmarks/results/")
    ap.add_argument("--profile", action="store_true",
                    help="also print each rank's CPU seconds per step and the top ops of one step (no JSON)")
    args = ap.parse_args()
    cfg = {k: getattr(args, k) for k in ("points", "hidden", "layers", "heads", "slices", "steps", "profile")}
    rows = []
    for p in args.ranks:
        ranks = run_distributed(_worker, p, cfg, timeout=1200)
        if args.profile:
            _print_profiles(ranks)
            continue
        res = ranks[0]
        res["speedup"] = res["eager_s"] / res["compiled_s"]
        rows.append(res)
        line = (f"P={p} sizes={res['sizes']}: eager {1e3 * res['eager_s']:.1f} ms/step, compiled "
                f"{1e3 * res['compiled_s']:.1f} ms/step ({res['speedup']:.2f}x), compile {res['compile_s']:.1f} s, "
                f"|loss diff| {res['loss_diff']:.2e}")
        if "plain_eager_s" in res:
            line += (f"; plain torch: eager {1e3 * res['plain_eager_s']:.1f}, compiled "
                     f"{1e3 * res['plain_compiled_s']:.1f} ms/step (sharded/plain compiled "
                     f"{res['compiled_s'] / res['plain_compiled_s']:.2f}x)")
        print(line, flush=True)
    if args.profile:
        return
    RESULTS.mkdir(exist_ok=True)
    record = {"config": cfg, "threads_per_rank": 1, "backend": "inductor", "torch": torch.__version__,
              "load_avg_1min": os.getloadavg()[0], "rows": rows}
    (RESULTS / args.out).write_text(json.dumps(record, indent=1))
    print(f"saved {RESULTS / args.out}")


if __name__ == "__main__":
    main()
