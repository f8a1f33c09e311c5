"""DomainParallel on a ShardedGraph: unchanged PyG layers and MeshGraphNet equal single-process.

Outputs, input gradients and every parameter gradient (after ``sync_gradients``) are compared
with the plain PyG model on the whole graph, at world sizes 1-4 with uneven and empty shards,
per-layer exchange and a k-hop halo exchanged once.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist
from torch_geometric.nn import (
    EdgeConv,
    GATConv,
    GCNConv,
    GINEConv,
    LayerNorm,
    MessagePassing,
    PointNetConv,
    SAGEConv,
    global_mean_pool,
)

import meshshard as ms
from meshshard.nn import DomainParallel, MeshGraphNet
from meshshard.ops import ShardedGraph, cells_to_edges, knn
from meshshard.testing import run_distributed

from ..ops._helpers import SIZES, C, N, graph_data


def _mlp(a, b):
    return torch.nn.Sequential(torch.nn.Linear(a, 7), torch.nn.Tanh(), torch.nn.Linear(7, b))


class Net(torch.nn.Module):
    """Two message-passing layers of one kind with a row-wise op between them."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        mk = {
            "gcn": lambda a, b: GCNConv(a, b),
            "gcn_weighted": lambda a, b: GCNConv(a, b),
            "sage": lambda a, b: SAGEConv(a, b),
            "gat": lambda a, b: GATConv(a, b, heads=2, concat=False),
            "edge": lambda a, b: EdgeConv(_mlp(2 * a, b), aggr="max"),
            "pointnet": lambda a, b: PointNetConv(_mlp(a + 3, b), _mlp(b, b)),
            "gine": lambda a, b: GINEConv(_mlp(a, b), edge_dim=4),
        }[kind]
        self.conv1, self.conv2 = mk(C, 6), mk(6, 4)

    def forward(self, x, pos, edge_index, edge_attr):
        def call(conv, h):
            if self.kind == "pointnet":
                return conv(h, pos, edge_index)
            if self.kind == "gine":
                return conv(h, edge_index, edge_attr)
            if self.kind == "gcn_weighted":
                return conv(h, edge_index, edge_attr[:, -1].exp())
            return conv(h, edge_index)

        return call(self.conv2, torch.tanh(call(self.conv1, x)))


KINDS = ["gcn", "gcn_weighted", "sage", "gat", "edge", "pointnet", "gine", "mgn"]


def _model(kind):
    torch.manual_seed(0)
    if kind == "mgn":
        return MeshGraphNet(C, 4, 3, hidden=8, num_layers=4).double()
    return Net(kind).double()


def _run(model, graph, x, pos, edge_index, edge_attr, wrap):
    x = x.clone().requires_grad_()
    pos = pos.clone().requires_grad_()
    if wrap:
        runner = DomainParallel(model, graph)
        args = (
            (x, graph.edge_index, edge_attr)
            if isinstance(model, MeshGraphNet)
            else (x, pos, graph.edge_index, edge_attr)
        )
        out = runner(*args)
        runner.remove()
        out = out.to_local() if isinstance(out, ms.ShardTensor) else out
    else:
        out = (
            model(x, edge_index, edge_attr) if isinstance(model, MeshGraphNet) else model(x, pos, edge_index, edge_attr)
        )
    return out, x, pos


def _loss(out, gid):
    w = torch.cos(gid.double()[:, None] + torch.arange(out.shape[1], dtype=torch.float64))
    return (out * w).sum() + 0.5 * (out**2).sum()


def _edge_attr(rel, dist):
    return torch.cat([rel, dist], -1)


def _sharded(world_hops):
    mesh = ms.init_mesh()
    world, rank = dist.get_world_size(), dist.get_rank()
    pos_all, x_all, edges = graph_data()
    sizes = SIZES[world]
    lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
    results = []
    for hops in world_hops:
        pos = ms.ShardTensor.from_local(pos_all[lo:hi], mesh, sizes=sizes)
        with ms.CommCounter() as build:
            graph = ShardedGraph.from_edges(pos, edges, hops=hops)
        per_kind = {"build": dict(build.counts)}
        for kind in KINDS:
            model = _model(kind)
            rel, dist_ = graph.edge_vectors()
            with ms.CommCounter() as cc:
                out, x, posl = _run(model, graph, x_all[lo:hi], pos_all[lo:hi], None, _edge_attr(rel, dist_), True)
                _loss(out, torch.arange(lo, hi)).backward()
            ms.nn.sync_gradients(model, mesh)
            per_kind[kind] = {
                "out": out.detach(),
                "x_grad": x.grad,
                "pos_grad": posl.grad,
                "params": {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
                "counts": dict(cc.counts),
                "ghosts": graph.num_ghosts,
            }
        results.append(per_kind)
    return lo, hi, results


def _reference(kind):
    pos, x, edges = graph_data()
    model = _model(kind)
    rel = pos[edges[0]] - pos[edges[1]]
    out, xl, posl = _run(model, None, x, pos, edges, _edge_attr(rel, rel.norm(dim=-1, keepdim=True)), False)
    _loss(out, torch.arange(N)).backward()
    return model, out.detach(), xl.grad, posl.grad


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_layers_match_single_process(world_size):
    hops_list = [1, 4]
    results = run_distributed(_sharded, world_size, hops_list)
    refs = {k: _reference(k) for k in KINDS}
    for lo, hi, per_hops in results:
        for hops, per_kind in zip(hops_list, per_hops):
            for kind in KINDS:
                model, out, xg, pg = refs[kind]
                res = per_kind[kind]
                msg = f"{kind} hops={hops} rows {lo}:{hi}"
                torch.testing.assert_close(res["out"], out[lo:hi], rtol=1e-5, atol=1e-9, msg=msg)
                torch.testing.assert_close(res["x_grad"], xg[lo:hi], rtol=1e-5, atol=1e-9, msg=msg)
                if kind == "pointnet":  # pos is a layer input: exchanged, its ghost grads summed
                    torch.testing.assert_close(res["pos_grad"], pg[lo:hi], rtol=1e-5, atol=1e-9, msg=msg)
                names = {n for n, p in model.named_parameters() if p.grad is not None}
                assert set(res["params"]) == names, msg
                for name, p in model.named_parameters():
                    torch.testing.assert_close(res["params"][name], p.grad, rtol=1e-5, atol=1e-9, msg=f"{msg} {name}")
                layers = 4 if kind == "mgn" else 2
                exchanges = layers if hops == 1 else 1
                if world_size == 1:
                    assert res["counts"].get("all_to_all", 0) == 0, msg
                else:
                    extra = 2 if kind == "gcn_weighted" else 0  # one weighted-degree exchange per GCN call
                    # forward + backward per exchange (the pointnet pos too, fused with x)
                    assert res["counts"].get("all_to_all", 0) == 2 * exchanges + extra, (msg, res["counts"])
                    # plus the one agreement on which plain inputs are node / edge tensors
                    assert res["counts"].get("all_reduce", 0) == 1, (msg, res["counts"])
                    assert set(res["counts"]) == {"all_to_all", "all_reduce"}, msg


def test_layers_match_single_process_with_hops_too_small():
    pos, x, edges = graph_data()
    graph = ShardedGraph.from_edges(pos, edges, hops=2)
    model = _model("mgn")
    rel, d = graph.edge_vectors()
    runner = DomainParallel(model, graph)
    with pytest.raises(RuntimeError, match="halo covers 2 message-passing layers per exchange"):
        runner(x, graph.edge_index, torch.cat([rel, d], -1))


def _knn_graph():
    mesh = ms.init_mesh()
    world, rank = dist.get_world_size(), dist.get_rank()
    pos_all, x_all, _ = graph_data()
    sizes = SIZES[world]
    lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
    pos = ms.ShardTensor.from_local(pos_all[lo:hi], mesh, sizes=sizes)
    graph = ShardedGraph.from_neighbors(pos, knn(pos, None, 6))
    model = _model("mgn")
    rel, d = graph.edge_vectors()
    out, x, _ = _run(model, graph, x_all[lo:hi], pos_all[lo:hi], None, torch.cat([rel, d], -1), True)
    _loss(out, torch.arange(lo, hi)).backward()
    ms.nn.sync_gradients(model, mesh)
    return out.detach(), {n: p.grad for n, p in model.named_parameters()}, graph.global_edge_index()


def test_knn_graph_meshgraphnet_matches_single_process():
    pos, x, _ = graph_data()
    nbr = knn(pos, None, 6)
    ref_graph = ShardedGraph.from_neighbors(pos, nbr)
    edges = ref_graph.edge_index
    model = _model("mgn")
    rel = pos[edges[0]] - pos[edges[1]]
    out, _, _ = _run(model, None, x, pos, edges, torch.cat([rel, rel.norm(dim=-1, keepdim=True)], -1), False)
    _loss(out, torch.arange(N)).backward()
    for world in (2, 4):
        results = run_distributed(_knn_graph, world)
        sizes = SIZES[world]
        gathered = torch.cat([r[0] for r in results])
        torch.testing.assert_close(gathered, out.detach(), rtol=1e-5, atol=1e-9)
        all_edges = torch.cat([r[2] for r in results], 1)
        assert sorted(map(tuple, all_edges.t().tolist())) == sorted(map(tuple, edges.t().tolist()))
        for name, p in model.named_parameters():
            for r in results:
                torch.testing.assert_close(r[1][name], p.grad, rtol=1e-5, atol=1e-9)
        assert sum(sizes) == N


def test_bad_input():
    pos, _, edges = graph_data()
    with pytest.raises(TypeError, match="graph must be a meshshard.ops.ShardedGraph"):
        DomainParallel(_model("gcn"), edges)
    model = _model("gcn")
    first = DomainParallel(model, ShardedGraph.from_edges(pos, edges))
    with pytest.raises(RuntimeError, match="already wrapped"):
        DomainParallel(model, ShardedGraph.from_edges(pos, edges))
    first.remove()
    DomainParallel(model, ShardedGraph.from_edges(pos, edges)).remove()


def _train_steps(steps, hops):
    """``steps`` AdamW steps of a 4-layer MeshGraphNet on the sharded mesh graph; the global losses."""
    mesh = ms.init_mesh() if dist.is_initialized() else None
    pos_all, x_all, edges = graph_data()
    target_all = torch.sin(3 * pos_all)
    if mesh is None:
        lo, hi, pos = 0, N, pos_all
    else:
        world, rank = dist.get_world_size(), dist.get_rank()
        sizes = SIZES[world]
        lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
        pos = ms.ShardTensor.from_local(pos_all[lo:hi], mesh, sizes=sizes)
    graph = ShardedGraph.from_edges(pos, edges, hops=hops)
    model = _model("mgn")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rel, d = graph.edge_vectors()
    runner = DomainParallel(model, graph)
    target = graph.wrap(target_all[lo:hi])
    losses = []
    for _ in range(steps):
        y = runner(x_all[lo:hi], graph.edge_index, torch.cat([rel, d], -1))
        loss = ((y - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        if mesh is not None:
            ms.nn.sync_gradients(model, mesh)
        opt.step()
        losses.append(float(loss))
    return losses


@pytest.mark.parametrize("hops", [1, 4])
def test_five_training_steps_same_losses_on_1_2_3_ranks(hops):
    ref = _train_steps(5, hops)
    assert len(set(ref)) == 5 and ref[-1] < ref[0]
    for world in (1, 2, 3):
        for losses in run_distributed(_train_steps, world, 5, hops):
            assert losses == pytest.approx(ref, rel=1e-5), (world, losses, ref)


def _partitioned_mgn(method):
    """MeshGraphNet on a mesh scattered with an RCB / Hilbert partition, cells in original ids."""
    from meshshard.partition import partition

    mesh = ms.init_mesh()
    pos_all, x_all, edges = graph_data()
    part = partition(pos_all, dist.get_world_size(), method=method)
    pos = ms.scatter(pos_all, part, mesh)
    graph = ShardedGraph.from_edges(pos, edges, partition=part)
    model = _model("mgn")
    rel, d = graph.edge_vectors()
    x = ms.scatter(x_all, part, mesh)
    out = DomainParallel(model, graph)(x, graph.edge_index, torch.cat([rel, d], -1))
    return out.full_tensor().to_plain().detach(), part.perm


@pytest.mark.parametrize("method", ["rcb", "hilbert"])
def test_partitioned_mesh_graph_original_ids(method):
    pos, x, edges = graph_data()
    model = _model("mgn")
    rel = pos[edges[0]] - pos[edges[1]]
    with torch.no_grad():
        ref = model(x, edges, torch.cat([rel, rel.norm(dim=-1, keepdim=True)], -1))
    for out, perm in run_distributed(_partitioned_mgn, 3, method):
        torch.testing.assert_close(out, ref[perm], rtol=1e-5, atol=1e-9)


# -- the model zoo: every case exact, or the same clear error on every rank --------------------------------
#
# Layers of every kind PyG users reach for, with what users put between them (BatchNorm1d, PyG
# LayerNorm in "graph" and "node" mode, h - h.mean(0), a global_mean_pool readout), run through
# DomainParallel at world sizes 1-4 on uneven shards with an empty and a one-point rank, float64,
# forward, backward and parameter gradients after sync_gradients, plus BatchNorm's running stats.

ZOO_N = 60
ZOO_SIZES = {1: [60], 2: [59, 1], 3: [0, 35, 25], 4: [17, 1, 0, 42]}


def _zoo_data():
    """Positions, features, two-graph ``batch`` and a mesh-like edge list of ``ZOO_N`` nodes."""
    g = torch.Generator().manual_seed(7)
    pos = torch.rand(ZOO_N, 3, generator=g, dtype=torch.float64)
    x = torch.randn(ZOO_N, C, generator=g, dtype=torch.float64)
    batch = (torch.arange(ZOO_N) >= 23).long()
    tri = [[i, i + 1, i + 2] for i in range(ZOO_N - 2)]
    tri += torch.randint(0, ZOO_N, (10, 3), generator=g).tolist()
    return pos, x, batch, cells_to_edges(torch.tensor(tri))


class FeatureKNNConv(MessagePassing):
    """A kNN in feature space inside the layer, as ``DynamicEdgeConv`` does (without torch-cluster)."""

    def __init__(self, a: int, b: int, k: int = 4) -> None:
        super().__init__(aggr="max")
        self.nn, self.k = _mlp(2 * a, b), k

    def forward(self, x):
        nbr = torch.cdist(x, x).topk(self.k + 1, largest=False).indices[:, 1:]
        dst = torch.arange(x.shape[0]).repeat_interleave(self.k)
        return self.propagate(torch.stack([nbr.reshape(-1), dst]), x=x)

    def message(self, x_i, x_j):
        return self.nn(torch.cat([x_i, x_j - x_i], -1))


def _zoo_conv(kind, a, b):
    if kind == "dynamic":
        from torch_geometric.nn import DynamicEdgeConv

        return DynamicEdgeConv(_mlp(2 * a, b), k=4)
    if kind == "feature_knn":
        return FeatureKNNConv(a, b)
    return {
        "gcn": lambda: GCNConv(a, b),
        "gat": lambda: GATConv(a, b, heads=2, concat=False),
        "sage": lambda: SAGEConv(a, b),
        "gine": lambda: GINEConv(_mlp(a, b), edge_dim=4),
        "edge": lambda: EdgeConv(_mlp(2 * a, b), aggr="max"),
        "pointnet": lambda: PointNetConv(_mlp(a + 3, b), _mlp(b, b)),
    }[kind]()


class ZooNet(torch.nn.Module):
    """``conv -> between -> tanh -> conv -> after``; returns (node output, pooled readout).

    ``between``/``after``: ``"bn_pool"`` BatchNorm1d, then ``global_mean_pool(h, batch)``;
    ``"ln"`` PyG LayerNorm(mode="node"), then ``h - h.mean(0)``, LayerNorm(mode="graph") and
    ``global_mean_pool(h)``; ``"ln_graph_batch"`` PyG LayerNorm(mode="graph") per graph of ``batch``;
    ``"edges_outside"`` a message ``h[edge_index[0]]`` computed outside any layer; ``"unused"`` no layer run;
    ``"edge_bn"`` BatchNorm1d over the edges; ``"plain_to_layer"`` the input's local shard handed to a layer;
    ``"global_edges"`` (given ``graph.global_edge_index()`` instead of ``graph.edge_index``) as ``"ln"``.
    """

    def __init__(self, kind: str, variant: str) -> None:
        super().__init__()
        self.kind, self.variant = kind, variant
        self.conv1, self.conv2 = _zoo_conv(kind, C, 6), _zoo_conv(kind, 6, 4)
        self.bn = torch.nn.BatchNorm1d(6)
        self.ln_node, self.ln_graph, self.ln_out = LayerNorm(6, mode="node"), LayerNorm(6, mode="graph"), LayerNorm(4)
        self.edge_bn = torch.nn.BatchNorm1d(4)

    def _call(self, conv, h, pos, edge_index, edge_attr):
        if self.kind in ("dynamic", "feature_knn"):
            return conv(h)
        if self.kind == "pointnet":
            return conv(h, pos, edge_index)
        if self.kind == "gine":
            return conv(h, edge_index, edge_attr)
        return conv(h, edge_index)

    def forward(self, x, pos, batch, edge_index, edge_attr):
        if self.variant == "unused":
            return x * 2, x.sum(0)
        if self.variant == "edge_bn":
            edge_attr = self.edge_bn(edge_attr)
        if self.variant == "plain_to_layer":
            x = x.to_local()
        h = self._call(self.conv1, x, pos, edge_index, edge_attr)
        if self.variant == "bn_pool":
            h = self.bn(h)
        elif self.variant == "ln_graph_batch":
            h = self.ln_graph(h, batch)
        elif self.variant == "edges_outside":
            h = h + h[edge_index[0]].sum() * 0
        else:
            h = self.ln_node(h)
        h = self._call(self.conv2, torch.tanh(h), pos, edge_index, edge_attr)
        if self.variant == "bn_pool":
            return h, global_mean_pool(h, batch)
        h = self.ln_out(h - h.mean(0))
        return h, global_mean_pool(h, None)


class IndexAddMeshGraphNet(torch.nn.Module):
    """A MeshGraphNet block written as PhysicsNeMo writes it: ``index_select`` + ``index_add``, no PyG layer."""

    def __init__(self) -> None:
        super().__init__()
        self.edge_mlp, self.node_mlp = _mlp(2 * C + 4, C), _mlp(2 * C, 4)

    def forward(self, x, pos, batch, edge_index, edge_attr):
        src, dst = edge_index
        e = self.edge_mlp(torch.cat([x.index_select(0, src), x.index_select(0, dst), edge_attr], -1))
        agg = torch.zeros_like(x).index_add(0, dst, e)
        return self.node_mlp(torch.cat([x, agg], -1)), x.sum(0)


_ZOO_KINDS = ["gcn", "gat", "sage", "gine", "edge", "pointnet", "feature_knn"]

#: Every case: (kind, variant, hops) -> None (exact) or (error type, message fragment), at every world size.
ZOO = {
    **{(k, "bn_pool", 1): None for k in _ZOO_KINDS},
    **{(k, "ln", 1): None for k in _ZOO_KINDS},
    ("gcn_model", "batch_norm", 1): None,  # torch_geometric.nn.models.GCN(norm="batch_norm")
    ("gcn", "ln_graph_batch", 1): None,  # per-graph statistics: scatter over ``batch``, then index_select back
    ("gcn", "edges_outside", 1): ("UnsupportedOpError", "__getitem__ on a graph.edge_index is not a row-wise op"),
    ("gcn", "unused", 1): ("RuntimeError", "ran none of its MessagePassing layers"),
    ("gine", "edge_bn", 1): ("UnsupportedOpError", "batch_norm on a per-edge tensor is not a row-wise op"),
    ("sage", "global_edges", 1): ("UnsupportedOpError", "SAGEConv's edge_index is not graph.edge_index"),
    ("gcn", "plain_to_layer", 1): ("UnsupportedOpError", "GCNConv's argument 'x' is a plain 2-d tensor"),
    ("gcn", "bn_pool", 2): ("UnsupportedOpError", "batch_norm on a node tensor with ghost rows (hops > 1)"),
    ("feature_knn", "ln", 2): ("UnsupportedOpError", "FeatureKNNConv takes no edge_index"),
    ("index_add_mgn", "none", 1): ("TypeError", "IndexAddMeshGraphNet has none"),
}


def _zoo_model(kind, variant):
    torch.manual_seed(0)
    if kind == "gcn_model":
        from torch_geometric.nn.models import GCN

        return GCN(C, 6, num_layers=2, out_channels=4, norm="batch_norm").double()
    if kind == "index_add_mgn":
        return IndexAddMeshGraphNet().double()
    return ZooNet(kind, variant).double()


def _zoo_forward(model, kind, x, pos, batch, edge_index, edge_attr):
    if kind == "gcn_model":
        h = model(x, edge_index)
        return h, global_mean_pool(h, batch)
    return model(x, pos, batch, edge_index, edge_attr)


def _zoo_loss(h, pooled, w):
    return (h * w).sum() + 0.5 * (h**2).sum() + (pooled * torch.linspace(-1, 1, pooled.shape[-1])).sum()


def _zoo_weights(n_rows, lo, width):
    gid = torch.arange(lo, lo + n_rows, dtype=torch.float64)
    return torch.cos(gid[:, None] + torch.arange(width, dtype=torch.float64))


def _zoo_reference(kind, variant):
    pos, x, batch, edges = _zoo_data()
    x, pos = x.clone().requires_grad_(), pos.clone().requires_grad_()
    model = _zoo_model(kind, variant)
    rel = pos[edges[0]] - pos[edges[1]]
    h, pooled = _zoo_forward(model, kind, x, pos, batch, edges, torch.cat([rel, rel.norm(dim=-1, keepdim=True)], -1))
    _zoo_loss(h, pooled, _zoo_weights(ZOO_N, 0, h.shape[1])).backward()
    return {
        "out": h.detach(),
        "pooled": pooled.detach(),
        "x_grad": x.grad,
        "pos_grad": pos.grad,
        "params": {n: p.grad for n, p in model.named_parameters() if p.grad is not None},
        "buffers": {n: b.clone() for n, b in model.named_buffers()},
    }


def _zoo_sharded(cases):
    """Every case on this rank: its results, or the error it raised (type, message without the rank)."""
    mesh = ms.init_mesh()
    world, rank = dist.get_world_size(), dist.get_rank()
    pos_all, x_all, batch_all, edges = _zoo_data()
    sizes = ZOO_SIZES[world]
    lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
    pos_s = ms.ShardTensor.from_local(pos_all[lo:hi], mesh, sizes=sizes)
    graphs = {hops: ShardedGraph.from_edges(pos_s, edges, hops=hops) for hops in (1, 2)}
    out = {}
    for kind, variant, hops in cases:
        graph = graphs[hops]
        x, pos = x_all[lo:hi].clone().requires_grad_(), pos_all[lo:hi].clone().requires_grad_()
        model = _zoo_model(kind, variant)
        try:
            runner = DomainParallel(model, graph)
            try:
                rel, d = graph.edge_vectors()
                batch = graph.wrap(batch_all[lo:hi])  # a ShardTensor (x, pos: plain, classified by the wrapper)
                edge_index = graph.global_edge_index() if variant == "global_edges" else graph.edge_index
                h, pooled = _zoo_forward(runner, kind, x, pos, batch, edge_index, torch.cat([rel, d], -1))
                _zoo_loss(h, pooled, graph.wrap(_zoo_weights(hi - lo, lo, h.shape[1]))).backward()
            finally:
                runner.remove()
            ms.nn.sync_gradients(model, mesh)
        except Exception as exc:
            out[kind, variant, hops] = (type(exc).__name__, re.sub(r"^\[rank \d+\] ", "", str(exc)))
            continue
        out[kind, variant, hops] = {
            "types": (type(h).__name__, type(pooled).__name__),
            "out": h.to_local().detach(),
            "pooled": pooled.to_plain().detach(),
            "x_grad": x.grad,
            "pos_grad": pos.grad,
            "params": {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
            "buffers": {n: b.clone() for n, b in model.named_buffers()},
        }
    return lo, hi, out


def _check_zoo(world_size, zoo):
    results = run_distributed(_zoo_sharded, world_size, list(zoo))
    refs = {case: _zoo_reference(case[0], case[1]) for case, expected in zoo.items() if expected is None}
    for case, expected in zoo.items():
        per_rank = [res[case] for _, _, res in results]
        if expected is not None:
            kind, fragment = expected
            assert all(isinstance(r, tuple) for r in per_rank), (case, per_rank)  # refused, not run
            assert all(r == per_rank[0] for r in per_rank), (case, per_rank)  # one error, every rank
            assert per_rank[0][0] == kind, (case, per_rank[0])
            assert fragment in per_rank[0][1], (case, per_rank[0])
            continue
        ref = refs[case]
        for (lo, hi, _), res in zip(results, per_rank):
            msg = f"{case} world={world_size} rows {lo}:{hi}"
            assert isinstance(res, dict), (msg, res)
            assert res["types"] == ("ShardTensor", "ReplicatedTensor"), msg
            torch.testing.assert_close(res["out"], ref["out"][lo:hi], rtol=1e-7, atol=1e-10, msg=msg)
            torch.testing.assert_close(res["pooled"], ref["pooled"], rtol=1e-7, atol=1e-10, msg=msg)
            torch.testing.assert_close(res["x_grad"], ref["x_grad"][lo:hi], rtol=1e-7, atol=1e-10, msg=msg)
            if case[0] == "pointnet":
                torch.testing.assert_close(res["pos_grad"], ref["pos_grad"][lo:hi], rtol=1e-7, atol=1e-10, msg=msg)
            assert set(res["params"]) == set(ref["params"]), msg
            for name, grad in ref["params"].items():
                torch.testing.assert_close(res["params"][name], grad, rtol=1e-7, atol=1e-10, msg=f"{msg} {name}")
            for name, buf in ref["buffers"].items():
                torch.testing.assert_close(res["buffers"][name], buf, rtol=1e-7, atol=1e-10, msg=f"{msg} {name}")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_model_zoo_exact_or_refused_on_every_rank(world_size):
    _check_zoo(world_size, ZOO)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world_size", [1, 3, 4])
def test_dynamic_edge_conv_exact(world_size):
    """PyG's DynamicEdgeConv (a kNN in feature space, through torch-cluster) runs on all nodes gathered."""
    pytest.importorskip("torch_cluster")
    _check_zoo(world_size, {("dynamic", "bn_pool", 1): None, ("dynamic", "ln", 1): None})
