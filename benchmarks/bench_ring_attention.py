"""Ring attention over sharded points: peak memory per rank and step time for P = 1, 2, 4 (gloo, CPU).

Self-attention of ``N`` points (``H`` heads of width ``E``, float32), forward + backward, compared
side by side in one run with its peers:

* ``ring`` — meshshard's ring attention (``F.scaled_dot_product_attention`` on ShardTensors), blocks
  sent with ``isend``/``irecv`` while the previous block is used;
* ``ring_no_overlap`` — the same with each transfer finished before computing (the overlap's effect);
* ``gather_kv`` — the naive alternative: all-gather K/V (``full_tensor``) and run torch's SDPA on the
  local queries (scores ``N/P x N`` per rank);
* ``torch`` (P = 1 only) — torch's own SDPA on the whole cloud in one process.

Peak memory: the rise of the worker's peak RSS (``ru_maxrss``) over its RSS just before the step,
each configuration in a fresh worker pool, so earlier runs do not mask it. ``scores MiB`` is the
largest score block one rank holds at once: ``H (N/P)^2`` floats for the ring, ``H (N/P) N`` for
``gather_kv``. Step time: median of ``--repeats`` forward+backward passes. The CPUs are shared with
other jobs, so times are noisy: read them as rough ratios.

    .venv/bin/python benchmarks/bench_ring_attention.py [--quick] [--n 4096]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _finite import check_finite

RESULTS = Path(__file__).resolve().parent / "results"


def _rss_mib() -> float:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _maxrss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _worker(method: str, n: int, heads: int, width: int, repeats: int) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import meshshard as ms
    from meshshard.tensor._rules import _attention

    torch.set_num_threads(1)
    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = ms.init_mesh()
    sizes = [n // world + (1 if r < n % world else 0) for r in range(world)]
    off = sum(sizes[:rank])
    g = torch.Generator().manual_seed(0)
    full = [torch.randn(1, heads, n, width, generator=g) for _ in range(3)]
    local = [t[:, :, off:off + sizes[rank]].clone().requires_grad_(True) for t in full]
    del full
    _attention.OVERLAP = method != "ring_no_overlap"

    def step():
        if method == "torch":
            out = F.scaled_dot_product_attention(*local)
            out.backward(torch.ones_like(out))
            return out
        q, k, v = (ms.ShardTensor.from_local(t, mesh, sizes=sizes, dim=2) for t in local)
        if method == "gather_kv":
            k, v = k.full_tensor().to_plain(), v.full_tensor().to_plain()
            out = F.scaled_dot_product_attention(q.to_local(), k, v)
        else:
            out = F.scaled_dot_product_attention(q, k, v).to_local()
        out.backward(torch.ones_like(out))
        return out

    dist.barrier()
    before = _rss_mib()
    out = step()
    peak = _maxrss_mib() - before
    check_finite(f"{method} attention output and gradients (rank {rank})", [out] + [t.grad for t in local])
    del out
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    _attention.OVERLAP = True
    times.sort()
    return {"peak_mib": peak, "time_s": times[len(times) // 2]}


def _scores_mib(method: str, n: int, heads: int, world: int) -> float:
    rows = -(-n // world)
    cols = n if method in ("gather_kv", "torch") else rows
    return heads * rows * cols * 4 / 2**20


def main() -> None:
    from meshshard.testing import WorkerPool

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="N = 1024, one repeat")
    args = ap.parse_args()
    if args.quick:
        args.n, args.repeats = 1024, 1
    rows = []
    for world in (1, 2, 4):
        methods = ["torch", "ring"] if world == 1 else ["ring", "ring_no_overlap", "gather_kv"]
        for method in methods:
            pool = WorkerPool(world, timeout=900)
            try:
                res = pool.run(_worker, method, args.n, args.heads, args.width, args.repeats)
            finally:
                pool.close()
            peak = max(r["peak_mib"] for r in res)
            t = max(r["time_s"] for r in res)
            rows.append({"P": world, "method": method, "peak_mib": round(peak, 1), "time_s": round(t, 4),
                         "scores_mib": round(_scores_mib(method, args.n, args.heads, world), 1)})
            print(f"P={world} {method:16s} peak rise/rank {peak:8.1f} MiB  scores block {rows[-1]['scores_mib']:7.1f} "
                  f"MiB  step {t:7.3f} s", flush=True)
    print(f"\nN={args.n} heads={args.heads} width={args.width} float32, forward+backward, gloo on CPU "
          "(machine shared with other jobs: times are noisy)")
    print(f"{'P':>2} {'method':16s} {'peak MiB/rank':>14} {'scores MiB':>11} {'step s':>8}")
    for r in rows:
        print(f"{r['P']:>2} {r['method']:16s} {r['peak_mib']:>14.1f} {r['scores_mib']:>11.1f} {r['time_s']:>8.3f}")
    RESULTS.mkdir(exist_ok=True)
    tag = "_quick" if args.quick else ""
    out = RESULTS / f"bench_ring_attention{tag}.json"
    out.write_text(json.dumps({"config": vars(args), "rows": rows}, indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for method in ("ring", "ring_no_overlap", "gather_kv", "torch"):
            sel = [r for r in rows if r["method"] == method]
            if sel:
                axes[0].plot([r["P"] for r in sel], [r["peak_mib"] for r in sel], "o-", label=method)
                axes[1].plot([r["P"] for r in sel], [r["time_s"] for r in sel], "o-", label=method)
        axes[0].set(xlabel="ranks P", ylabel="peak RSS rise per rank (MiB)", xscale="log", yscale="log")
        axes[1].set(xlabel="ranks P", ylabel="forward+backward (s)", xscale="log")
        for ax in axes:
            ax.legend()
        fig.suptitle(f"ring attention, N={args.n}, H={args.heads}, E={args.width} (CPU, gloo, loaded machine)")
        fig.tight_layout()
        fig.savefig(out.with_suffix(".png"), dpi=100)
    except ImportError:
        pass
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
