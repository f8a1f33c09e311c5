"""Per-op dispatch overhead on small tensors: plain torch vs ShardTensor vs DTensor, 2 gloo ranks.

Each op runs on a small local shard (64 x 32 per rank) so the time is dominated by dispatch, not
arithmetic. DTensor gets *even* shards (its uneven path is wrong here), weights as replicated
DTensors; ShardTensor gets the same even sizes. Overhead = time - plain time, median of repeats.
Target (issue 4): ShardTensor's overhead at most half of DTensor's on the local ops. The ``floor``
column is an empty ``__torch_function__`` subclass: the least any Python-level dispatch can cost.

    .venv/bin/python benchmarks/bench_dispatch.py [--quick]
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


def _bench(repeats: int, inner: int):
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
    for name, op in _ops().items():
        row = {}
        kinds = {"torch": (local, w, b), "floor": (floor, w, b), "ShardTensor": (st, w, b), "DTensor": (dt, wd, bd)}
        for kind, (x, ww, bb) in kinds.items():
            for _ in range(5):
                op(x, ww, bb)
            times = []
            for _ in range(repeats):
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(inner):
                    op(x, ww, bb)
                times.append((time.perf_counter() - t0) / inner)
            times.sort()
            row[kind] = times[len(times) // 2] * 1e6
        out[name] = row
    return out


def main(quick: bool = False) -> dict:
    from meshshard.testing import run_distributed

    repeats, inner = (5, 50) if quick else (15, 200)
    res = run_distributed(_bench, 2, repeats, inner, timeout=300)[0]
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
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench_dispatch.json").write_text(json.dumps(summary, indent=1))
    _plot(res, RESULTS / "bench_dispatch.png")
    return summary


def _plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.2
    for i, kind in enumerate(("torch", "floor", "ShardTensor", "DTensor")):
        ax.bar([j + (i - 1.5) * width for j in range(len(names))], [res[n][kind] for n in names], width, label=kind)
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
    main(parser.parse_args().quick)
