"""A 2-D U-Net step on a grid sharded along H: row-halo bytes and step time for P = 1, 2, 4 (gloo, CPU).

The model (3x3 conv blocks, 2x max-pool, bilinear 2x upsampling, skip concatenation over channels; ``levels``
poolings) runs unchanged on a ``(1, C, H, W)`` ShardTensor sharded along ``H``: every 3x3 convolution and
every upsampling fetches its neighbouring rows with one ``all_to_all`` (meshshard's row halo), pooling needs
none when every rank's offset is a multiple of ``2^levels``. Peers in the same run:

* ``torch`` (P = 1): the plain model on the whole grid in one process;
* ``halo`` (P = 1, 2, 4): the sharded model; its output is checked against ``torch``'s (float32 tolerance)
  and the benchmark fails rather than report a wrong model.

``halo KiB/rank``: bytes this rank put into ``all_to_all`` in one forward+backward step (counted by
``meshshard.CommCounter``; the own block never travels), the largest over ranks; ``grid KiB/rank``: the
rank's input shard, for scale. Step time: median of ``--repeats`` forward+backward passes, the slowest rank.
The CPUs are shared with other jobs: read times as rough ratios.

    .venv/bin/python benchmarks/bench_unet_halo.py [--quick] [--h 192 --w 160]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _model(c_in: int, width: int, levels: int):
    import torch

    class UNet(torch.nn.Module):
        def __init__(self):
            super().__init__()

            def block(a, b):
                return torch.nn.Sequential(torch.nn.Conv2d(a, b, 3, padding=1), torch.nn.ReLU(),
                                           torch.nn.Conv2d(b, b, 3, padding=1), torch.nn.ReLU())

            chans = [width * 2**i for i in range(levels + 1)]
            self.down = torch.nn.ModuleList([block(c_in, chans[0])]
                                            + [block(chans[i], chans[i + 1]) for i in range(levels)])
            self.up = torch.nn.ModuleList([block(chans[i + 1] + chans[i], chans[i]) for i in reversed(range(levels))])
            self.pool = torch.nn.MaxPool2d(2)
            self.upsample = torch.nn.Upsample(scale_factor=2, mode="bilinear")
            self.head = torch.nn.Conv2d(chans[0], 1, 1)

        def forward(self, x):
            skips = []
            for i, blk in enumerate(self.down):
                x = blk(x if i == 0 else self.pool(x))
                skips.append(x)
            for blk, skip in zip(self.up, reversed(skips[:-1])):
                x = blk(torch.cat([self.upsample(x), skip], 1))
            return self.head(x)

    torch.manual_seed(0)
    return UNet()


def _sizes(h: int, world: int, unit: int) -> list[int]:
    blocks = h // unit
    return [unit * (blocks // world + (1 if r < blocks % world else 0)) for r in range(world)]


def _worker(method: str, c: int, h: int, w: int, width: int, levels: int, repeats: int) -> dict:
    import torch
    import torch.distributed as dist

    import meshshard as ms

    torch.set_num_threads(1)
    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = ms.init_mesh()
    model = _model(c, width, levels)
    x = torch.randn(1, c, h, w, generator=torch.Generator().manual_seed(1))
    sizes = _sizes(h, world, 2**levels)
    off = sum(sizes[:rank])
    local = x[:, :, off : off + sizes[rank]].clone().requires_grad_(True)
    ref = None
    if method == "halo":  # the single-process output, to check what is timed
        with torch.no_grad():
            ref = model(x)

    def step():
        model.zero_grad()
        if method == "torch":
            out = model(local)
            out.pow(2).mean().backward()
            return out
        out = model(ms.ShardTensor.from_local(local, mesh, sizes=sizes, dim=2))
        out.pow(2).mean().backward()
        return out

    with ms.CommCounter() as cc:
        out = step()
    if ref is not None:
        got = out.full_tensor().to_plain().detach()
        if not torch.allclose(got, ref, rtol=1e-4, atol=1e-5):
            raise AssertionError(f"sharded U-Net differs from single process: max {float((got - ref).abs().max())}")
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"time_s": times[len(times) // 2], "halo_bytes": cc.bytes_sent.get("all_to_all", 0),
            "all_to_all": cc.counts.get("all_to_all", 0), "grid_bytes": local.numel() * local.element_size()}


def main() -> None:
    from meshshard.testing import WorkerPool

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--c", type=int, default=4)
    ap.add_argument("--h", type=int, default=192)
    ap.add_argument("--w", type=int, default=160)
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--levels", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="a 96 x 80 grid, one repeat")
    args = ap.parse_args()
    if args.quick:
        args.h, args.w, args.repeats = 96, 80, 1
    rows = []
    for world, method in ((1, "torch"), (1, "halo"), (2, "halo"), (4, "halo")):
        pool = WorkerPool(world, timeout=900)
        try:
            res = pool.run(_worker, method, args.c, args.h, args.w, args.width, args.levels, args.repeats)
        finally:
            pool.close()
        rows.append({"P": world, "method": method, "time_s": round(max(r["time_s"] for r in res), 4),
                     "halo_kib": round(max(r["halo_bytes"] for r in res) / 1024, 1),
                     "all_to_all": res[0]["all_to_all"],
                     "grid_kib": round(max(r["grid_bytes"] for r in res) / 1024, 1)})
        r = rows[-1]
        print(f"P={world} {method:6s} step {r['time_s']:7.3f} s  halo {r['halo_kib']:8.1f} KiB/rank "
              f"({r['all_to_all']} all_to_all)  grid {r['grid_kib']:7.1f} KiB/rank", flush=True)
    base = rows[0]["time_s"]
    print(f"\nU-Net levels={args.levels} width={args.width}, grid (1, {args.c}, {args.h}, {args.w}) float32 sharded "
          "along H, forward+backward, gloo on CPU (shared machine: times are noisy)")
    print(f"{'P':>2} {'method':6s} {'step s':>8} {'vs P=1':>7} {'halo KiB/rank':>14} {'all_to_all':>10} "
          f"{'grid KiB/rank':>14}")
    for r in rows:
        print(f"{r['P']:>2} {r['method']:6s} {r['time_s']:>8.3f} {base / r['time_s']:>6.2f}x {r['halo_kib']:>14.1f} "
              f"{r['all_to_all']:>10} {r['grid_kib']:>14.1f}")
    RESULTS.mkdir(exist_ok=True)
    tag = "_quick" if args.quick else ""
    (RESULTS / f"bench_unet_halo{tag}.json").write_text(json.dumps({"config": vars(args), "rows": rows}, indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        halo = [r for r in rows if r["method"] == "halo"]
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        axes[0].plot([r["P"] for r in halo], [r["time_s"] for r in halo], "o-", label="sharded (row halo)")
        axes[0].axhline(base, color="k", ls="--", label="torch, one process")
        axes[0].set(xlabel="ranks P", ylabel="forward+backward (s)")
        axes[1].plot([r["P"] for r in halo], [r["halo_kib"] for r in halo], "o-")
        axes[1].set(xlabel="ranks P", ylabel="halo KiB sent per rank per step")
        axes[0].legend()
        fig.suptitle(f"U-Net on ({args.c}, {args.h}, {args.w}) sharded along H (CPU, gloo, loaded machine)")
        fig.tight_layout()
        fig.savefig(RESULTS / f"bench_unet_halo{tag}.png", dpi=100)
    except ImportError:
        pass


if __name__ == "__main__":
    main()
