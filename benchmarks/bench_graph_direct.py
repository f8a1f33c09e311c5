"""The direct path vs DomainParallel vs the replicated path: a 3-layer GCN on a triangulated surface mesh.

Side by side in one run, the same 3 ``GCNConv`` layers (ReLU between) on the same mesh graph (an
``nx x ny`` grid, two triangles per quad, both directions of every cell edge, nodes split in row
blocks of the grid), at ``P = 2`` and ``P = 4`` (gloo, one thread per rank):

* **direct**: ShardTensor nodes and ``ms.ops.shard_edges(..., self_loops=True)`` edges fed to the
  unchanged layers (``add_self_loops=False``, a sharded ``edge_weight`` of ones); the output is
  sharded like the nodes;
* **DomainParallel**: ``ms.nn.DomainParallel`` on a ``ShardedGraph`` (one halo exchange per layer);
* **replicated**: ShardTensor nodes with the plain global ``edge_index``: ``x[src]`` gathers every
  edge's source on every rank and the scatter all-reduces all ``N`` rows (what the direct path did
  before sharded targets); the later layers then run replicated on every rank.

Per path and rank: output type and local rows, the **peak node rows** (the most rows of any
feature tensor ``(rows, C)`` an op produced, edge-sized ones excluded (this rank's edge count, and
anything longer than ``N``: DomainParallel's layers add self loops and padding edges): ``[owned;
ghosts]`` for a halo, ``N`` when replicated) against owned + ghosts, bytes sent per layer (``CommCounter``: forward,
and forward + backward), and the wall time of forward + backward. Every output is checked against
the single-process model on the whole graph (a benchmark of a wrong model fails).

Run: ``.venv/bin/python benchmarks/bench_graph_direct.py [--quick] [--nodes N]`` (default 200k
nodes; quick: 20k). Results: ``benchmarks/results/bench_graph_direct.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
C = 16  # channels
LAYERS = 3


def _mesh(nodes: int) -> tuple[int, torch.Tensor]:
    from meshshard.ops import cells_to_edges

    nx = max(2, int(math.sqrt(nodes)))
    ny = max(2, nodes // nx)
    ids = torch.arange(nx * ny).view(ny, nx)
    a, b, c, d = ids[:-1, :-1], ids[:-1, 1:], ids[1:, :-1], ids[1:, 1:]
    tri = torch.cat([torch.stack([a, b, d], -1).reshape(-1, 3), torch.stack([a, d, c], -1).reshape(-1, 3)])
    return nx * ny, cells_to_edges(tri)


class _GCN(torch.nn.Module):
    def __init__(self, self_loops: bool):
        super().__init__()
        from torch_geometric.nn import GCNConv

        torch.manual_seed(0)
        self.convs = torch.nn.ModuleList(GCNConv(C, C, add_self_loops=self_loops) for _ in range(LAYERS))

    def forward(self, x, edge_index, edge_weight=None, counters=None):
        for i, conv in enumerate(self.convs):
            if counters is not None:
                with counters[i]:
                    x = conv(x, edge_index, edge_weight)
            else:
                x = conv(x, edge_index, edge_weight)
            if i < LAYERS - 1:
                x = torch.relu(x)
        return x


def _row_meter(exclude: set[int], num_nodes: int):
    from torch.utils._python_dispatch import TorchDispatchMode

    class RowMeter(TorchDispatchMode):
        peak = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            with torch._C.DisableTorchFunctionSubclass():  # local shards: no sharding rules at this level
                out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.dim() == 2 and t.shape[1] == C and t.shape[0] not in exclude \
                        and t.shape[0] <= num_nodes:
                    RowMeter.peak = max(RowMeter.peak, int(t.shape[0]))
            return out

    return RowMeter


def _rank(nodes: int, reps: int) -> dict:
    import torch.distributed as dist

    import meshshard as ms
    from meshshard.nn import DomainParallel
    from meshshard.ops import ShardedGraph, shard_edges

    torch.set_num_threads(1)
    mesh = ms.init_mesh()
    world, rank = dist.get_world_size(), dist.get_rank()
    n, edges = _mesh(nodes)
    g = torch.Generator().manual_seed(0)
    x_all = torch.randn(n, C, generator=g)
    pos_all = torch.rand(n, 3, generator=g)
    sizes = [n // world + (r < n % world) for r in range(world)]
    lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
    ref = _GCN(True)(x_all, edges)  # single process, the layers' own self loops
    ref_local = ref[lo:hi].detach()
    del ref

    pos = ms.ShardTensor.from_local(pos_all[lo:hi], mesh, sizes=sizes)
    graph = ShardedGraph.from_edges(pos, edges)
    direct_edges = shard_edges(edges, pos, self_loops=True)
    loops_all = torch.cat([edges[:, edges[0] != edges[1]], torch.arange(n).expand(2, -1)], 1)
    out: dict = {"rank": rank, "owned": hi - lo, "ghosts": graph.num_ghosts, "num_nodes": n,
                 "num_edges": int(edges.shape[1]), "edges_local": int(direct_edges.edge_index.local_shape[1])}

    def run(name, model, make_input, args, exclude):
        times = []
        for rep in range(reps + 1):
            xl = x_all[lo:hi].clone().requires_grad_()
            counters = [ms.CommCounter() for _ in range(LAYERS)]
            meter = _row_meter(exclude, n)
            dist.barrier()
            t0 = time.perf_counter()
            with meter():  # (CommCounters compare by value: never nest two, one may remove the other)
                y = model(make_input(xl), *args, counters=counters)
                with ms.CommCounter() as backward:
                    (y * y).sum().backward()
            dist.barrier()
            if rep:
                times.append(time.perf_counter() - t0)
        local = y.to_local() if isinstance(y, ms.ShardTensor) else y[lo:hi] if y.shape[0] == n else y
        ok = bool(torch.allclose(local.detach(), ref_local, rtol=1e-4, atol=1e-5))
        out[name] = {
            "type": type(y).__name__,
            "local_rows": int(local.shape[0]) if isinstance(y, ms.ShardTensor) else int(y.shape[0]),
            "exact": ok,
            "peak_node_rows": meter.peak,
            "forward_bytes_per_layer": [sum(cc.bytes_sent.values()) for cc in counters],
            "forward_backward_bytes": sum(sum(cc.bytes_sent.values()) for cc in (*counters, backward)),
            "collectives": [dict(cc.counts) for cc in (*counters, backward)],
            "seconds": min(times),
        }

    e_local = {int(direct_edges.edge_index.local_shape[1]), int(graph.edge_index.shape[1])}
    w = torch.ones_like(direct_edges.edge_index[0], dtype=torch.float32)
    run("direct", _GCN(False), lambda xl: ms.ShardTensor.from_local(xl, mesh, sizes=sizes),
        (direct_edges.edge_index, w), e_local)
    dp = DomainParallel(_GCN(True), graph)
    run("domain_parallel", lambda x, ei, counters: dp(x, ei, None, counters), lambda xl: xl, (graph.edge_index,),
        e_local)
    run("replicated", _GCN(False), lambda xl: ms.ShardTensor.from_local(xl, mesh, sizes=sizes),
        (loops_all,), {int(loops_all.shape[1])})
    return out


def main() -> None:
    from meshshard.testing import run_distributed

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--quick", action="store_true", help="20k nodes")
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args()
    nodes = 20_000 if args.quick else args.nodes
    report = {"nodes": nodes, "channels": C, "layers": LAYERS, "runs": {}}
    print(f"3-layer GCN, {nodes:,} nodes, C = {C}, fp32, gloo CPU, one thread per rank")
    print(f"{'P':>2} {'path':>16} {'type':>16} {'exact':>5} {'peak rows':>10} {'owned+gh':>9} "
          f"{'fwd B/layer':>12} {'fwd+bwd B':>12} {'s':>7}")
    for world in (2, 4):
        ranks = run_distributed(_rank, world, nodes, args.reps, timeout=1800)
        report["runs"][str(world)] = ranks
        for name in ("direct", "domain_parallel", "replicated"):
            worst = max(ranks, key=lambda r: r[name]["peak_node_rows"])
            per_layer = max(max(r[name]["forward_bytes_per_layer"]) for r in ranks)
            fb = max(r[name]["forward_backward_bytes"] for r in ranks)
            secs = max(r[name]["seconds"] for r in ranks)
            exact = all(r[name]["exact"] for r in ranks)
            print(f"{world:>2} {name:>16} {worst[name]['type']:>16} {str(exact):>5} "
                  f"{worst[name]['peak_node_rows']:>10,} {worst['owned'] + worst['ghosts']:>9,} {per_layer:>12,} "
                  f"{fb:>12,} {secs:>7.2f}")
            if not exact:
                raise SystemExit(f"P = {world}: the {name} path does not match the single-process model")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "bench_graph_direct.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
