"""ShardedGraph: exact ghosts and edges for k-hop halos, cell edges, the relabelling of original ids, bad input."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import meshshard as ms
from meshshard.ops import ShardedGraph, cells_to_edges, shard_edges
from meshshard.partition import Partition
from meshshard.testing import run_distributed

from ._helpers import SIZES, C, N, graph_data


def _build_counts(hops):
    mesh = ms.init_mesh()
    world, rank = dist.get_world_size(), dist.get_rank()
    pos_all, _, edges = graph_data()
    sizes = SIZES[world]
    lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
    pos = ms.ShardTensor.from_local(pos_all[lo:hi], mesh, sizes=sizes)
    with ms.CommCounter() as cc:
        graph = ShardedGraph.from_edges(pos, edges, hops=hops)
    rel, length = graph.edge_vectors()
    with ms.CommCounter() as ex:
        rel2, _ = graph.edge_vectors(pos)  # exchanged positions: the same values
    torch.testing.assert_close(rel2, rel, rtol=0, atol=0)
    errors = []
    if world > 1:  # a ghost id this rank owns is refused on this rank only (no collective reached)
        mine = torch.arange(lo, hi)
        for bad in (mine[:1], torch.tensor([N])):
            if bad.numel():
                try:
                    ms.HaloPlan.from_ghost_ids(pos, bad)
                except ValueError as exc:
                    errors.append(str(exc))
    return (
        dict(cc.counts),
        graph.global_edge_index(),
        graph.owned_edges(),
        graph.global_index,
        graph.in_degree,
        (rel, length, dict(ex.counts)),
        errors,
    )


@pytest.mark.parametrize("hops", [1, 3])
def test_graph_build_ghosts_and_counts(hops):
    world = 3
    pos_all, _, edges = graph_data()
    sizes = SIZES[world]
    results = run_distributed(_build_counts, world, hops)
    deg = torch.bincount(edges[1], minlength=N)
    for rank, (counts, gedges, owned, gidx, in_degree, (rel, length, ex), errors) in enumerate(results):
        lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
        torch.testing.assert_close(rel, pos_all[gedges[0]] - pos_all[gedges[1]], rtol=0, atol=0)
        torch.testing.assert_close(length[:, 0], rel.norm(dim=-1))
        assert ex == {"all_to_all": 1}
        assert all("ghost_ids must be global indices in [0, 41) owned by other ranks than" in e for e in errors)
        assert len(errors) == (2 if hi > lo else 1)
        # from_ghost_ids: 3, degrees: 1, per extra hop: 4
        assert counts == {"all_to_all": 4 + 4 * (hops - 1)}
        mine = (edges[1] >= lo) & (edges[1] < hi)
        assert sorted(map(tuple, gedges[:, owned].t().tolist())) == sorted(map(tuple, edges[:, mine].t().tolist()))
        torch.testing.assert_close(in_degree, deg[gidx])
        # ghosts: exactly the nodes within `hops` in-hops of an owned node, not owned
        reach = torch.zeros(N, dtype=torch.bool)
        reach[lo:hi] = True
        for _ in range(hops):
            reach[edges[0][reach[edges[1]]]] = True
        reach[lo:hi] = False
        assert gidx[hi - lo :].tolist() == reach.nonzero().flatten().tolist()
        # with k hops every node closer than k has all its in-edges locally
        closer = torch.zeros(N, dtype=torch.bool)
        closer[lo:hi] = True
        for _ in range(hops - 1):
            closer[edges[0][closer[edges[1]]]] = True
        want = sorted(map(tuple, edges[:, closer[edges[1]]].t().tolist()))
        assert sorted(map(tuple, gedges.t().tolist())) == want


def test_cells_to_edges_exact():
    e = cells_to_edges(torch.tensor([[0, 1, 2], [2, 1, 3], [3, 4, -1]]))
    assert e.t().tolist() == [
        [1, 0],
        [2, 0],
        [0, 1],
        [2, 1],
        [3, 1],
        [0, 2],
        [1, 2],
        [3, 2],
        [1, 3],
        [2, 3],
        [4, 3],
        [3, 4],
    ]
    tet = cells_to_edges(torch.tensor([[0, 1, 2, 3]]), mode="all")
    assert tet.shape == (2, 12)


def test_original_ids_are_relabelled_to_partition_order():
    pos, _, edges = graph_data()
    part = Partition(perm=torch.randperm(N, generator=torch.Generator().manual_seed(0)), sizes=torch.tensor([N]))
    graph = ShardedGraph.from_edges(part.apply(pos), edges, partition=part)
    inverse = torch.empty_like(part.perm)
    inverse[part.perm] = torch.arange(N)
    want = sorted(map(tuple, inverse[edges].t().tolist()))
    assert sorted(map(tuple, graph.global_edge_index().t().tolist())) == want
    assert graph.num_nodes == graph.num_owned + graph.num_ghosts == N


def test_bad_input():
    pos, _, edges = graph_data()
    with pytest.raises(ValueError, match=r"edge_index must hold node ids in \[0, 41\) \(got \[0, 41\]\)"):
        ShardedGraph.from_edges(pos, torch.tensor([[0], [41]]))
    with pytest.raises(ValueError, match=r"edge_index must be an integer tensor of shape \(2, E\)"):
        ShardedGraph.from_edges(pos, edges.double())
    with pytest.raises(ValueError, match=r"hops must be at least 1 \(got 0\)"):
        ShardedGraph.from_edges(pos, edges, hops=0)
    with pytest.raises(ValueError, match=r"mode must be 'cycle' or 'all' \(got 'x'\)"):
        cells_to_edges(torch.tensor([[0, 1, 2]]), mode="x")
    with pytest.raises(TypeError, match=r"partition must be a meshshard Partition or MeshPartition \(got Tensor\)"):
        ShardedGraph.from_edges(pos, edges, partition=torch.arange(N))


# -- the direct path: unchanged layers on ShardTensor nodes and shard_edges' edges ------------------------------
# sizes with a one-node rank and an empty rank
DIRECT_SIZES = {1: [N], 2: [1, N - 1], 3: [0, 25, N - 25], 4: [9, 0, 1, N - 10]}
H = 4
LAYERS = ("gcn", "sage", "gat", "gine", "edgeconv", "pointnet", "mgn_index_add", "mgn_block")
POSTS = ("none", "batch_norm", "layer_norm_graph", "layer_norm_node", "mean_pool")
#: cases that raise (the same error on every rank) instead of running: none so far
DIRECT_RAISES: dict[tuple[str, str], str] = {}


class _MGNIndexAdd(torch.nn.Module):
    """A MeshGraphNet block written with index_select / index_add_, as PhysicsNeMo's PyG path writes it."""

    def __init__(self):
        super().__init__()
        self.edge_mlp = torch.nn.Sequential(torch.nn.Linear(2 * C + 2, H), torch.nn.SiLU(), torch.nn.LayerNorm(H))
        self.node_mlp = torch.nn.Sequential(torch.nn.Linear(C + H, H), torch.nn.SiLU())

    def forward(self, x, edge_index, edge_attr):
        src, dst = edge_index[0], edge_index[1]
        e = self.edge_mlp(torch.cat([x.index_select(0, src), x.index_select(0, dst), edge_attr], -1))
        agg = x.new_zeros((x.shape[0], H)).index_add_(0, dst, e)
        return self.node_mlp(torch.cat([x, agg], -1))


def _direct_model(layer: str, post: str):
    from torch_geometric import nn as gnn

    from meshshard.nn import MeshGraphNetBlock

    torch.manual_seed(0)
    conv = {
        "gcn": lambda: gnn.GCNConv(C, H, add_self_loops=False),
        "sage": lambda: gnn.SAGEConv(C, H),
        "gat": lambda: gnn.GATConv(C, H // 2, heads=2, add_self_loops=False),
        "gine": lambda: gnn.GINEConv(torch.nn.Linear(C, H), edge_dim=2),
        "edgeconv": lambda: gnn.EdgeConv(torch.nn.Sequential(torch.nn.Linear(2 * C, H), torch.nn.ReLU()), aggr="max"),
        "pointnet": lambda: gnn.PointNetConv(torch.nn.Linear(C + 3, H), add_self_loops=False),
        "mgn_index_add": _MGNIndexAdd,
        "mgn_block": lambda: torch.nn.Sequential(torch.nn.Linear(C, H), MeshGraphNetBlock(H)),
    }[layer]()
    norm = {
        "batch_norm": lambda: torch.nn.BatchNorm1d(H),
        "layer_norm_graph": lambda: gnn.LayerNorm(H, mode="graph"),
        "layer_norm_node": lambda: gnn.LayerNorm(H, mode="node"),
    }.get(post, lambda: None)()
    return torch.nn.ModuleDict({"conv": conv, **({"norm": norm} if norm is not None else {})}).double()


def _direct_forward(model, layer, post, x, pos, edge_index, edge_attr, batch, weight):
    conv = model["conv"]
    if layer == "gcn":
        h = conv(x, edge_index, weight)
    elif layer in ("gine", "mgn_index_add"):
        h = conv(x, edge_index, edge_attr)
    elif layer == "pointnet":
        h = conv(x, pos, edge_index)
    elif layer == "mgn_block":
        lin, block = conv[0], conv[1]
        hx = lin(x)
        h, _ = block(hx, edge_index, lin(torch.cat([edge_attr, edge_attr, edge_attr[:, :1]], -1)))
    else:
        h = conv(x, edge_index)
    h = torch.relu(h)
    if post == "batch_norm":
        h = model["norm"](h)
    elif post.startswith("layer_norm"):
        h = model["norm"](h, batch) if post == "layer_norm_graph" else model["norm"](h)
    elif post == "mean_pool":
        from torch_geometric.nn import global_mean_pool

        return global_mean_pool(h, batch, 2)
    return h


def _direct_case(layer, post):
    import copy

    mesh = ms.init_mesh()
    world, rank = dist.get_world_size(), dist.get_rank()
    pos_all, x_all, edges = graph_data()
    attr_all = torch.randn(edges.shape[1], 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    batch_all = (torch.arange(N) >= 20).long()
    loops = layer in ("gcn", "gat")  # what their add_self_loops=True does, done by shard_edges
    model = _direct_model(layer, post)
    ref_model = copy.deepcopy(model)
    # single process: the layer's own self loops
    xs = x_all.clone().requires_grad_()
    if loops:
        ref_model["conv"].add_self_loops = True
    ref = _direct_forward(ref_model, layer, post, xs, pos_all, edges, attr_all, batch_all, None)
    (ref * ref.sin()).sum().backward()
    sizes = DIRECT_SIZES[world]
    lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
    xl = x_all[lo:hi].clone().requires_grad_()
    x = ms.ShardTensor.from_local(xl, mesh, sizes=sizes)
    pos = ms.ShardTensor.from_local(pos_all[lo:hi], mesh, sizes=sizes)
    batch = ms.ShardTensor.from_local(batch_all[lo:hi], mesh, sizes=sizes)
    graph = shard_edges(edges, x, self_loops=loops)
    try:
        edge_attr = attr_all[graph.edge_id] if not loops else None
        weight = torch.ones_like(graph.edge_index[0], dtype=torch.float64)
        with ms.CommCounter() as cc:
            out = _direct_forward(model, layer, post, x, pos, graph.edge_index, edge_attr, batch, weight)
        (out * out.sin()).sum().backward()
        ms.nn.sync_gradients(model, mesh)
    except Exception as exc:  # noqa: BLE001 - compared across ranks by the test
        return {"raised": type(exc).__name__, "message": str(exc)}
    got = out.full_tensor().to_plain() if isinstance(out, ms.ShardTensor) else out
    grad = xl.grad if xl.grad is not None else torch.zeros_like(xl)
    params = [(p.grad, q.grad) for p, q in zip(model.parameters(), ref_model.parameters())]
    return {
        "type": type(out).__name__,
        "forward": torch.allclose(got, ref, rtol=1e-9, atol=1e-11),
        "x_grad": torch.allclose(grad, xs.grad[lo:hi], rtol=1e-8, atol=1e-10),
        "param_grads": all(q is None and (p is None or not p.any()) or p is not None and torch.allclose(
            p, q, rtol=1e-8, atol=1e-10) for p, q in params),
        "local_rows": out.local_shape[0] if isinstance(out, ms.ShardTensor) else None,
        "counts": dict(cc.counts),
    }


def _direct_cases(cases):
    return [_direct_case(layer, post) for layer, post in cases]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_direct_path_model_zoo_is_exact_and_sharded_like_the_nodes(world_size):
    pytest.importorskip("torch_geometric")
    cases = [(layer, post) for layer in LAYERS for post in POSTS]
    results = run_distributed(_direct_cases, world_size, cases, timeout=120)
    sizes = DIRECT_SIZES[world_size]
    for i, case in enumerate(cases):
        per_rank = [res[i] for res in results]
        if case in DIRECT_RAISES:
            assert {r.get("raised") for r in per_rank} == {DIRECT_RAISES[case]}, (case, per_rank)
            continue
        for rank, r in enumerate(per_rank):
            assert "raised" not in r, (case, rank, r)
            assert r["forward"] and r["x_grad"] and r["param_grads"], (case, rank, r)
            if case[1] == "mean_pool":
                assert r["type"] == "ReplicatedTensor", (case, r)
            else:  # sharded like the nodes: no rank holds all N rows
                assert r["type"] == "ShardTensor" and r["local_rows"] == sizes[rank], (case, rank, r)
        assert all(r["counts"] == per_rank[0]["counts"] for r in per_rank), (case, per_rank)


def _edges_case():
    mesh = ms.init_mesh()
    world, rank = dist.get_world_size(), dist.get_rank()
    pos_all, x_all, edges = graph_data()
    sizes = DIRECT_SIZES[world]
    lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
    x = ms.ShardTensor.from_local(x_all[lo:hi], mesh, sizes=sizes)
    with ms.CommCounter() as cc:
        plain, looped = shard_edges(edges, x), shard_edges(edges, x, self_loops=True)
    with ms.CommCounter() as fetch:
        rows = x[plain.edge_index[0]]
    return (plain.edge_index.to_local(), plain.edge_id.to_local(), looped.edge_index.to_local(),
            looped.edge_id.to_local(), plain.edge_index.spec.node_sizes, dict(cc.counts),
            rows.to_local(), fetch.bytes_sent["all_to_all"])


def test_shard_edges_keeps_the_edges_into_owned_nodes_and_x_src_moves_each_ghost_once():
    world = 4
    _, x_all, edges = graph_data()
    sizes = DIRECT_SIZES[world]
    results = run_distributed(_edges_case, world)
    seen = []
    for rank, (ei, eid, looped, looped_id, node_sizes, counts, rows, sent) in enumerate(results):
        lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
        mine = ((edges[1] >= lo) & (edges[1] < hi)).nonzero().flatten()
        assert torch.equal(eid, mine) and torch.equal(ei, edges[:, mine])
        assert node_sizes == tuple(sizes) and counts == {"all_gather": 2}
        no_loops = mine[edges[0, mine] != edges[1, mine]]
        assert torch.equal(looped_id, torch.cat([no_loops, torch.arange(lo, hi) + edges.shape[1]]))
        assert torch.equal(looped[:, : no_loops.numel()], edges[:, no_loops])
        torch.testing.assert_close(rows, x_all[ei[0]], rtol=0, atol=0)
        seen.append(eid)
        # sent: counts, the distinct remote ids its edges need, and each row other ranks need from it, once
        asked = {int(s) for s in ei[0] if not lo <= int(s) < hi}
        served = set()
        for r, (e2, *_rest) in enumerate(results):
            lo2, hi2 = sum(sizes[:r]), sum(sizes[: r + 1])
            served |= {(r, int(s)) for s in e2[0] if lo <= int(s) < hi and not lo2 <= int(s) < hi2}
        assert sent == 2 * world * 8 + len(asked) * 8 + len(served) * C * 8, (rank, sent, len(asked), len(served))
    assert torch.equal(torch.sort(torch.cat(seen)).values, torch.arange(edges.shape[1]))


def test_nested_comm_counters_with_equal_counts_leave_in_order():
    """CommCounter compares by identity: the inner one leaves, the outer one still counts (was: ValueError)."""
    outer = ms.CommCounter()
    with outer:
        inner = ms.CommCounter()
        with inner:
            assert inner == inner and inner != outer  # equal fields, distinct counters
        ms.comm._record("all_reduce", 8)
    assert outer.counts["all_reduce"] == 1 and inner.counts["all_reduce"] == 0
    assert outer not in ms.comm._ACTIVE and inner not in ms.comm._ACTIVE


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_simulate_graph_halo_counts_the_ghost_sets_of_from_edges(hops):
    """The serial simulation's ghosts are the nodes within ``hops`` in-hops of a part (the sets the
    test above checks ShardedGraph.from_edges builds), its bytes the halo and the ring's."""
    _, _, edges = graph_data()
    for world, sizes in SIZES.items():
        report = ms.ops.simulate_graph_halo(edges, sizes, row_bytes=12, hops=hops)
        want = []
        for rank in range(world):
            lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
            reach = torch.zeros(N, dtype=torch.bool)
            reach[lo:hi] = True
            for _ in range(hops):
                reach[edges[0][reach[edges[1]]]] = True
            reach[lo:hi] = False
            want.append(int(reach.sum()))
        assert report.num_ghosts == want
        assert report["ghost_bytes"] == [12 * g for g in want]
        assert report.ring_bytes == [(world - 1) * n * 12 for n in sizes]
        assert report.total_ring_bytes == sum(report.ring_bytes) and report.num_owned == sizes
        assert report.to_dict()["hops"] == hops
