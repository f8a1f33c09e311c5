"""ShardedGraph: exact ghosts and edges for k-hop halos, cell edges, the relabelling of original ids, bad input."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import meshshard as ms
from meshshard.ops import ShardedGraph, cells_to_edges
from meshshard.partition import Partition
from meshshard.testing import run_distributed

from ._helpers import SIZES, N, graph_data


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
