"""Sharded BatchNorm (meshshard's ``F.batch_norm`` rule) vs SyncBatchNorm over the same gloo ranks.

A PointNet-like stack of ``layers`` x (Conv1d k=1, BatchNorm1d, ReLU) on ``(B, C, N_local)`` per rank,
one forward + backward per step. Peers, side by side on the same ranks and data:

* ``meshshard``: ``nn.BatchNorm1d`` fed a ShardTensor: one fused all-reduce (sum, sum of squares,
  count) forward, one all-reduce backward, per layer;
* ``SyncBatchNorm``: ``torch.nn.SyncBatchNorm`` where it runs (CUDA). On the CPU it cannot
  (``aten::batch_norm_stats`` has no CPU kernel), so its algorithm is re-stated here with the same
  collectives: an all-gather of every rank's (mean, invstd, count) forward and an all-reduce of
  (sum dy, sum dy * (x - mean)) backward, per layer;
* ``local BN`` (unsynchronised, wrong statistics): the floor of what a BatchNorm costs with no
  communication at all.

    .venv/bin/python benchmarks/bench_batchnorm.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _finite import check_finite

RESULTS = Path(__file__).resolve().parent / "results"


def _sync_bn_function():
    """torch's SyncBatchNorm algorithm on plain CPU tensors, with its collectives (all_gather, all_reduce)."""
    import torch
    import torch.distributed as dist

    class SyncBN(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias, eps, counter):
            dims = (0, 2)
            count = torch.tensor([x.shape[0] * x.shape[2]], dtype=x.dtype)
            mean = x.mean(dims)
            var = x.var(dims, unbiased=False)
            invstd = torch.rsqrt(var + eps)
            mine = torch.cat([mean, invstd, count])
            everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
            dist.all_gather(everyone, mine)
            counter["all_gather"] += 1
            allst = torch.stack(everyone)
            c = x.shape[1]
            means, invstds, counts = allst[:, :c], allst[:, c : 2 * c], allst[:, 2 * c :]
            n = counts.sum()
            g_mean = (means * counts).sum(0) / n
            g_var = ((1 / invstds**2 - eps + (means - g_mean) ** 2) * counts).sum(0) / n
            g_invstd = torch.rsqrt(g_var + eps)
            ctx.save_for_backward(x, weight, g_mean, g_invstd)
            ctx.n, ctx.counter = n, counter
            return (x - g_mean[None, :, None]) * (g_invstd * weight)[None, :, None] + bias[None, :, None]

        @staticmethod
        def backward(ctx, dy):
            x, weight, mean, invstd = ctx.saved_tensors
            xmu = x - mean[None, :, None]
            sums = torch.cat([dy.sum((0, 2)), (dy * xmu).sum((0, 2))])
            local_db, local_dw = sums[: x.shape[1]].clone(), sums[x.shape[1] :] * invstd
            dist.all_reduce(sums)
            ctx.counter["all_reduce"] += 1
            c = x.shape[1]
            sum_dy, sum_dy_xmu = sums[:c], sums[c:]
            dx = (weight * invstd)[None, :, None] * (
                dy - sum_dy[None, :, None] / ctx.n - xmu * (invstd**2 * sum_dy_xmu / ctx.n)[None, :, None])
            return dx, local_dw, local_db, None, None

    return SyncBN


def _bench(batch: int, channels: int, n_local: int, layers: int, repeats: int):
    from collections import Counter

    import torch
    import torch.distributed as dist
    from torch import nn

    import meshshard as ms

    mesh = ms.init_mesh()
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.set_num_threads(1)
    sync_fn = _sync_bn_function()
    counter: Counter = Counter()

    class Stack(nn.Module):
        def __init__(self, kind):
            super().__init__()
            self.kind = kind
            self.convs = nn.ModuleList(nn.Conv1d(channels, channels, 1) for _ in range(layers))
            self.bns = nn.ModuleList(nn.BatchNorm1d(channels) for _ in range(layers))

        def forward(self, x):
            for conv, bn in zip(self.convs, self.bns):
                x = conv(x)
                x = sync_fn.apply(x, bn.weight, bn.bias, bn.eps, counter) if self.kind == "sync" else bn(x)
                x = torch.relu(x)
            return x

    torch.manual_seed(0)
    local = torch.randn(batch, channels, n_local)
    sharded = ms.ShardTensor.from_local(local, mesh, sizes=[n_local] * world, dim=2)
    out = {}
    check = {}
    for kind, x in (("meshshard", sharded), ("SyncBatchNorm", local), ("local BN", local)):
        torch.manual_seed(0)
        model = Stack("sync" if kind == "SyncBatchNorm" else "plain")
        for _ in range(2):  # warm-up
            model(x).sum().backward()
        counter.clear()
        with ms.CommCounter() as cc:
            y = model(x)
            y.sum().backward()
        counts = dict(cc.counts) if kind == "meshshard" else dict(counter)
        counts.pop("all_reduce_loss", None)
        check[kind] = (y.to_local() if isinstance(y, ms.ShardTensor) else y).detach()
        check_finite(f"{kind} BatchNorm stack output and gradients (rank {rank})",
                     [check[kind]] + [p.grad for p in model.parameters()])
        times = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            y = model(x)
            y.sum().backward()
            times.append(time.perf_counter() - t0)
        times.sort()
        out[kind] = {"ms_per_step": times[len(times) // 2] * 1e3, "collectives": counts}
    # the final y.sum() of a ShardTensor is one all-reduce forward and one backward: not the layers'
    out["meshshard"]["collectives"]["all_reduce"] -= 2
    out["max_abs_diff_meshshard_vs_sync"] = float((check["meshshard"] - check["SyncBatchNorm"]).abs().max())
    return out if rank == 0 else None


def main(quick: bool = False) -> dict:
    from meshshard.testing import run_distributed

    batch, channels, layers = 2, 64, 3
    n_locals = [2048, 8192] if quick else [2048, 8192, 32768]
    repeats = 5 if quick else 10
    rows = []
    for world in (2, 3):
        for n_local in n_locals:
            res = run_distributed(_bench, world, batch, channels, n_local, layers, repeats, timeout=900)[0]
            rows.append({"ranks": world, "n_local": n_local, **res})
    print(f"BatchNorm stack: {layers} x (Conv1d k=1, BatchNorm1d, ReLU), B={batch}, C={channels}, gloo CPU ranks, "
          "forward+backward per step (machine shared with other jobs: timings are noisy)")
    print(f"{'ranks':>5}{'N/rank':>8}{'meshshard ms':>14}{'SyncBN ms':>11}{'local BN ms':>13}{'ratio':>7}"
          f"{'max |diff|':>11}  collectives per layer (meshshard | SyncBN)")
    for r in rows:
        ms_, sy, lo = (r[k]["ms_per_step"] for k in ("meshshard", "SyncBatchNorm", "local BN"))
        per = {k: {c: v / layers for c, v in r[k]["collectives"].items()} for k in ("meshshard", "SyncBatchNorm")}
        print(f"{r['ranks']:>5}{r['n_local']:>8}{ms_:>14.2f}{sy:>11.2f}{lo:>13.2f}{ms_ / sy:>7.2f}"
              f"{r['max_abs_diff_meshshard_vs_sync']:>11.1e}  {per['meshshard']} | {per['SyncBatchNorm']}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    summary = {"batch": batch, "channels": channels, "layers": layers, "rows": rows}
    (RESULTS / "bench_batchnorm.json").write_text(json.dumps(summary, indent=1))
    _plot(rows, RESULTS / "bench_batchnorm.png")
    return summary


def _plot(rows: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    labels = [f"P={r['ranks']}\nN={r['n_local']}" for r in rows]
    width = 0.27
    for i, kind in enumerate(("meshshard", "SyncBatchNorm", "local BN")):
        ax.bar([j + (i - 1) * width for j in range(len(rows))], [r[kind]["ms_per_step"] for r in rows], width,
               label=kind)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels)
    ax.set_ylabel("ms per step (forward + backward)")
    ax.set_title("Sharded BatchNorm vs SyncBatchNorm (gloo CPU ranks, loaded machine)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    main(parser.parse_args().quick)
