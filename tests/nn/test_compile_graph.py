"""``torch.compile(fullgraph=True)`` of the graph path: ``DomainParallel(MeshGraphNet)`` on a ShardedGraph.

Compiled equals eager (float64, 1e-10: output, input and parameter gradients) on 1-3 ranks with uneven
shards and an empty rank; one forward and one backward graph (no break), nothing compiled on a second
step with the same sizes, and the collectives in the compiled graphs equal the eager step's
(``CommCounter``): the input-kind agreement, one halo exchange per block forward and backward. The halo
routing (``send_index``, ``edge_index``) enters the graph as tensors, its counts as constants.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import meshshard as ms
from meshshard.nn import DomainParallel, MeshGraphNet
from meshshard.ops import ShardedGraph
from meshshard.testing import run_distributed

from ..ops._helpers import C, graph_data
from ..tensor.test_compile import _Recorder

SIZES = {1: [41], 2: [30, 11], 3: [0, 25, 16]}


def _setup(sizes, hops=1):
    torch.set_num_threads(1)
    torch._dynamo.reset()
    mesh = ms.init_mesh()
    r = dist.get_rank()
    pos_all, x_all, edges = graph_data()
    lo, hi = sum(sizes[:r]), sum(sizes[: r + 1])
    pos = ms.ShardTensor.from_local(pos_all[lo:hi], mesh, sizes=sizes)
    graph = ShardedGraph.from_edges(pos, edges, hops=hops)
    xl = x_all[lo:hi].clone().requires_grad_()
    return mesh, graph, xl


def _grads(xl, model):
    return [xl.grad.clone()] + [p.grad.clone() for p in model.parameters()]


def _zero(xl, model):
    xl.grad = None
    model.zero_grad(set_to_none=True)


def _mgn_case(sizes, plain_x, hops):
    mesh, graph, xl = _setup(sizes, hops)
    torch.manual_seed(0)
    layers = 2
    model = MeshGraphNet(C, 4, 3, hidden=8, num_layers=layers).double()
    dp = DomainParallel(model, graph)
    rel, d = graph.edge_vectors()
    edge_attr = torch.cat([rel, d], -1)

    def step(x, edge_index, edge_attr):
        return dp(x, edge_index, edge_attr).square().mean()

    x = xl if plain_x else ms.ShardTensor.from_local(xl, mesh, sizes=sizes)
    with ms.CommCounter() as eager_comm:
        eager = step(x, graph.edge_index, edge_attr)
        eager.backward()
    ref = _grads(xl, model)
    _zero(xl, model)
    rec = _Recorder()
    compiled = torch.compile(step, fullgraph=True, backend=rec.backend())
    with ms.CommCounter() as compiled_comm:
        out = compiled(x, graph.edge_index, edge_attr)
        out.backward()
    got = _grads(xl, model)
    first = list(rec.graphs)
    _zero(xl, model)
    out2 = compiled(x, graph.edge_index, edge_attr)
    out2.backward()
    return {
        "out": max(float((out - eager).abs()), float((out2 - eager).abs())),
        "grads": max(float((a - b).abs().max()) if a.numel() else 0.0 for a, b in zip(got, ref)),
        "n_grads": (len(got), len(ref)),
        "graphs_first": first,
        "graphs_total": len(rec.graphs),
        "collectives": sum(n for _, n in first),
        "eager_collectives": eager_comm.total,
        "compiled_recorded": compiled_comm.total,
        "type": type(out).__name__,
    }


# 1 rank: shard_x only (with one rank there is no halo, so k_hop and plain_x take the 1-rank path shard_x
# proves; they run at 2 and 3, with an empty rank)
PARAMS = [("shard_x", 1), ("shard_x", 2), ("shard_x", 3), ("plain_x", 2), ("plain_x", 3), ("k_hop", 2), ("k_hop", 3)]


@pytest.mark.parametrize(("case", "world_size"), PARAMS, ids=[f"{c}-{w}" for c, w in PARAMS])
def test_compiled_domain_parallel_meshgraphnet_equals_eager(case, world_size):
    hops = 2 if case == "k_hop" else 1
    results = run_distributed(_mgn_case, world_size, SIZES[world_size], case == "plain_x", hops, timeout=120)
    for rank, res in enumerate(results):
        assert res["out"] <= 1e-10 and res["grads"] <= 1e-10, (rank, res)
        assert res["n_grads"][0] == res["n_grads"][1], (rank, res)
        assert [k for k, _ in res["graphs_first"]] == ["fw", "bw"], (rank, res)  # no graph break
        assert res["graphs_total"] == 2, (rank, res)  # the second step compiled nothing
        assert res["collectives"] == res["eager_collectives"], (rank, res)
        # the first compiled call: only the input-kind agreement run once while tracing (eagerly, so counted)
        assert res["compiled_recorded"] == (1 if world_size > 1 else 0), (rank, res)
        assert res["type"] == "ReplicatedTensor", (rank, res)
    if world_size > 1:  # the exchanges are in the graph: the agreement, and per block one forward, one backward
        assert results[0]["collectives"] >= 1 + (2 if hops > 1 else 2 * 2), results[0]


def _divergent_kinds(sizes):
    _, graph, xl = _setup(sizes)
    dp = DomainParallel(MeshGraphNet(C, 4, 3, hidden=8, num_layers=1).double(), graph)
    rel, d = graph.edge_vectors()
    edge_attr = torch.cat([rel, d], -1)
    x = xl if dist.get_rank() == 0 else xl[:-1]  # node rows on rank 0; neither node nor edge rows on rank 1
    step = torch.compile(lambda x, ei, ea: dp(x, ei, ea).square().mean(), fullgraph=True, backend="aot_eager")
    step(x, graph.edge_index, edge_attr)


@pytest.mark.timeout(120)
def test_inputs_of_different_kinds_on_the_ranks_raise_on_every_rank_without_a_hang():
    # rank 1 alone would fail while tracing (a plain tensor reaching a layer) while rank 0 waited in its graph's
    # agreement: the agreement also runs once while tracing, so both ranks raise the same error then
    with pytest.raises(ms.testing.DistributedError) as info:
        run_distributed(_divergent_kinds, 2, SIZES[2], timeout=60)
    failures = info.value.failures
    assert [f.rank for f in failures] == [0, 1] and all(f.kind == "exception" for f in failures), failures
    for f in failures:
        assert "are not of one kind" in f.message + f.traceback, f
