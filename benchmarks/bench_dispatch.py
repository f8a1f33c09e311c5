"""Per-op dispatch overhead on small tensors: plain torch vs ShardTensor vs DTensor, 2 gloo ranks.

Each op runs on a small local shard (64 x 32 per rank) so the time is dominated by dispatch, not
arithmetic. DTensor gets *even* shards (its uneven path is wrong here), weights as replicated
DTensors; ShardTensor gets the same even sizes. Overhead = time - plain time, median of repeats.
Target (issue 4): ShardTensor's overhead at most half of DTensor's on the local ops. The ``floor``
column is an empty ``__torch_function__`` subclass: the least any Python-level dispatch can cost.

Compiled columns (issue 28): a chain of ``DEPTH`` applications of the op, ``y = step(y)``, under
``torch.compile(fullgraph=True, dynamic=False)`` (inductor), on the plain tensor and on the ShardTensor;
time per op = time per compiled call / ``DEPTH``, after warm-up; the first call (the compile) is
reported apart. A chain, not one op per call, because a compiled call costs its guards and wrapper
once, whatever it holds (reported as ``call_us``, the 1-op chain); and not ``DEPTH`` copies of
``op(x)``, which the compiler would merge into one. Ops whose result has another shape than ``x``
are chained with a restoring op (``CHAIN``), the same in both compiled columns, so their
difference is still ShardTensor's compiled overhead (the goal: about 0).

    .venv/bin/python benchmarks/bench_dispatch.py [--quick] [--no-compile]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _ops():
    import torch
    import torch.nn.functional as F

    return {
        "add": lambda x, w, b: x + x,
        "mul_scalar": lambda x, w, b: x * 2.0,
        "gelu": lambda x, w, b: F.gelu(x),
        "linear": lambda x, w, b: F.linear(x, w, b),
        "layer_norm": lambda x, w, b: F.layer_norm(x, (x.shape[-1],)),
        "softmax_channels": lambda x, w, b: torch.softmax(x, dim=-1),
        "view_transpose": lambda x, w, b: x.view(x.shape[0], 4, -1).transpose(1, 2),
        "sum_channels": lambda x, w, b: x.sum(dim=-1),
        "mean_points (all-reduce)": lambda x, w, b: x.mean(dim=0),
    }


DEPTH = 16
#: op name -> the chained step when the op alone does not map ``(n, c)`` to ``(n, c)``
CHAIN = {
    "view_transpose": "x.view(n, 4, -1).transpose(1, 2).transpose(1, 2).view(n, c)",
    "sum_channels": "x - x.sum(dim=-1, keepdim=True)",
    "mean_points (all-reduce)": "x - x.mean(dim=0)",
}


def _chain_steps():
    steps = dict(_ops())
    steps.update({
        # transposed back: a copy (reshape) would compose 16 index maps, whose simplification takes inductor
        # tens of minutes
        "view_transpose": lambda x, w, b: x.view(x.shape[0], 4, -1).transpose(1, 2).transpose(1, 2).view(x.shape),
        "sum_channels": lambda x, w, b: x - x.sum(dim=-1, keepdim=True),
        "mean_points (all-reduce)": lambda x, w, b: x - x.mean(dim=0),
    })
    return steps


def _compiled(step, depth: int):
    import torch

    def chain(x, w, b):
        for _ in range(depth):
            x = step(x, w, b)
        return x

    return torch.compile(chain, fullgraph=True, dynamic=False)


def _time(fn, args, repeats: int, inner: int) -> float:
    """Median seconds per call of ``fn(*args)`` over ``repeats`` runs of ``inner`` calls (barrier-framed)."""
    import torch.distributed as dist

    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn(*args)
        times.append((time.perf_counter() - t0) / inner)
    times.sort()
    return times[len(times) // 2]


def _bench_compiled(kinds: dict, repeats: int, inner: int) -> dict:
    """Per op: compiled per-op time (us) of the ``DEPTH`` chain and the 1-op call, and the compile seconds."""
    import torch
    import torch.distributed as dist

    out = {}
    for name, step in _chain_steps().items():
        row = {}
        for kind in ("torch", "ShardTensor"):
            args = kinds[kind]
            torch._dynamo.reset()
            fn = _compiled(step, DEPTH)
            dist.barrier()
            t0 = time.perf_counter()
            fn(*args)
            row[f"{kind}_compile_s"] = time.perf_counter() - t0
            want = args[0]
            for _ in range(DEPTH):
                want = step(want, *args[1:])
            got = fn(*args)
            # compiled == eager chain, relative to the largest value (sum_channels' chain grows like 31**16)
            row[f"{kind}_max_diff"] = float((_local(got) - _local(want)).abs().max() / _local(want).abs().max())
            for _ in range(5):
                fn(*args)
            row[f"{kind}_compiled"] = _time(fn, args, repeats, inner) / DEPTH * 1e6
            torch._dynamo.reset()
            one = _compiled(step, 1)
            for _ in range(5):
                one(*args)
            row[f"{kind}_compiled_call"] = _time(one, args, repeats, inner) * 1e6
        out[name] = row
    return out


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _floor_subclass():
    """The cheapest possible ``__torch_function__`` subclass: the floor of any Python-level dispatch."""
    import torch

    class Floor(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            with torch._C.DisableTorchFunctionSubclass():
                out = func(*args, **(kwargs or {}))
            return out.as_subclass(Floor) if type(out) is torch.Tensor else out

    return Floor


def _bench(repeats: int, inner: int, compiled: bool = True):
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    import meshshard as ms

    mesh = ms.init_mesh()
    world = dist.get_world_size()
    torch.manual_seed(0)
    n, c = 64, 32
    local = torch.randn(n, c)
    w, b = torch.randn(c, c), torch.randn(c)
    st = ms.ShardTensor.from_local(local, mesh, sizes=[n] * world)
    dt = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
    wd, bd = distribute_tensor(w, mesh, [Replicate()]), distribute_tensor(b, mesh, [Replicate()])
    floor = local.as_subclass(_floor_subclass())
    out = {}
    kinds = {"torch": (local, w, b), "floor": (floor, w, b), "ShardTensor": (st, w, b), "DTensor": (dt, wd, bd)}
    for name, op in _ops().items():
        row = {}
        for kind, args in kinds.items():
            for _ in range(5):
                op(*args)
            row[kind] = _time(op, args, repeats, inner) * 1e6
        out[name] = row
    if compiled:
        for name, row in _bench_compiled(kinds, repeats, inner).items():
            out[name].update(row)
    return out


def main(quick: bool = False, compiled: bool = True) -> dict:
    from meshshard.testing import run_distributed

    repeats, inner = (5, 50) if quick else (15, 200)
    res = run_distributed(_bench, 2, repeats, inner, compiled, timeout=1800)[0]
    print(f"{'op (2 ranks, 64x32 local)':<26}{'torch us':>10}{'floor us':>10}{'Shard us':>10}{'DTensor us':>11}"
          f"{'Shard ovh':>10}{'DT ovh':>9}{'ratio':>7}")
    local_ratios = []
    for name, r in res.items():
        so, do = r["ShardTensor"] - r["torch"], r["DTensor"] - r["torch"]
        ratio = so / do if do > 0 else float("nan")
        r.update(shard_overhead_us=so, dtensor_overhead_us=do, overhead_ratio=ratio)
        if "all-reduce" not in name:
            local_ratios.append(ratio)
        print(f"{name:<26}{r['torch']:>10.1f}{r['floor']:>10.1f}{r['ShardTensor']:>10.1f}{r['DTensor']:>11.1f}"
              f"{so:>10.1f}{do:>9.1f}{ratio:>7.2f}")
    mean_ratio = sum(local_ratios) / len(local_ratios)
    worst = max(local_ratios)
    print(f"ShardTensor overhead / DTensor overhead on local ops: mean {mean_ratio:.2f}, worst {worst:.2f} "
          f"(target <= 0.5)")
    summary = {"ops": res, "mean_local_overhead_ratio": mean_ratio, "worst_local_overhead_ratio": worst}
    if compiled:
        summary.update(_print_compiled(res), compiled_depth=DEPTH, compiled_backend="inductor")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench_dispatch.json").write_text(json.dumps(summary, indent=1))
    _plot(res, RESULTS / "bench_dispatch.png")
    return summary


def _print_compiled(res: dict) -> dict:
    """The compiled columns (per op, us) and their summary; adds ``compiled_overhead_us`` to each row."""
    print(f"\ncompiled (inductor, fullgraph, chain of {DEPTH}; per op){'':<2}{'torch us':>10}{'Shard cmp':>10}"
          f"{'torch cmp':>10}{'cmp ovh':>9}{'call torch':>11}{'call Shard':>11}{'compile s':>10}{'rel diff':>9}")
    over = []
    for name, r in res.items():
        r["compiled_overhead_us"] = r["ShardTensor_compiled"] - r["torch_compiled"]
        if "all-reduce" not in name:
            over.append(r["compiled_overhead_us"])
        step = f"{name} [{CHAIN[name]}]" if name in CHAIN else name
        print(f"{step:<58}{r['torch']:>10.2f}{r['ShardTensor_compiled']:>10.2f}{r['torch_compiled']:>10.2f}"
              f"{r['compiled_overhead_us']:>9.2f}{r['torch_compiled_call']:>11.1f}{r['ShardTensor_compiled_call']:>11.1f}"
              f"{r['ShardTensor_compile_s']:>10.1f}{r['ShardTensor_max_diff']:>9.1e}")
    mean = sum(over) / len(over)
    print(f"compiled ShardTensor overhead over compiled torch on local ops: mean {mean:.2f} us/op, "
          f"worst {max(over):.2f} us/op (goal: about 0)")
    return {"mean_local_compiled_overhead_us": mean, "worst_local_compiled_overhead_us": max(over)}


def _plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    kinds = [k for k in ("torch", "floor", "ShardTensor", "DTensor", "torch_compiled", "ShardTensor_compiled")
             if k in res[names[0]]]
    width = 0.8 / len(kinds)
    for i, kind in enumerate(kinds):
        ax.bar([j + (i - (len(kinds) - 1) / 2) * width for j in range(len(names))], [res[n][kind] for n in names],
               width, label=kind.replace("_compiled", f" compiled (per op, chain of {DEPTH})"))
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right")
    ax.set_ylabel("time per op (us), 2 gloo ranks")
    ax.set_yscale("log")
    ax.set_title("Dispatch overhead on small tensors")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled columns")
    args = parser.parse_args()
    main(args.quick, not args.no_compile)
