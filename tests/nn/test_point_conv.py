"""PointConv: exact values on a tiny input; sharded forward and gradients equal single-process ones."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import meshshard as ms
from meshshard.nn import PointConv
from meshshard.ops import ball_query, knn
from meshshard.partition import partition
from meshshard.testing import run_distributed


def test_tiny_max_and_mean_exact():
    pos = torch.tensor([[0.0], [1.0], [3.0]])
    x = torch.tensor([[1.0], [2.0], [5.0]])
    nbr = ball_query(pos, None, 1.0, 4)  # 0: {0, 1}, 1: {1, 0}, 2: {2}
    conv = PointConv(1, 1, hidden_channels=(), aggr="max", pos_dim=1)
    with torch.no_grad():
        conv.mlp[0].weight.copy_(torch.tensor([[1.0, 10.0]]))  # h = x_j + 10 (p_j - p_i)
        conv.mlp[0].bias.zero_()
    assert conv(x, pos, nbr).flatten().tolist() == [12.0, 2.0, 5.0]
    conv.aggr = "mean"
    assert conv(x, pos, nbr).flatten().tolist() == [6.5, -3.5, 5.0]


def test_no_neighbours_gives_zeros_and_positions_only():
    pos = torch.tensor([[0.0, 0.0], [5.0, 5.0]])
    q = torch.tensor([[100.0, 100.0]])
    nbr = ball_query(pos, q, 1.0, 3)
    conv = PointConv(0, 4, pos_dim=2)
    assert conv(None, pos, nbr, query_pos=q).tolist() == [[0.0] * 4]


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"aggr must be one of \('max', 'mean'\) \(got 'sum'\)"):
        PointConv(3, 4, aggr="sum")
    with pytest.raises(TypeError, match=r"in_channels must be an int \(got float\)"):
        PointConv(3.0, 4)
    conv = PointConv(2, 4)
    pos = torch.rand(5, 3)
    nbr = ball_query(pos, None, 0.5, 3)
    with pytest.raises(ValueError, match=r"x must be None exactly when in_channels is 0"):
        conv(None, pos, nbr)
    with pytest.raises(ValueError, match=r"query_pos must have one row per query of nbr \(5\) \(got 2\)"):
        conv(torch.rand(5, 2), pos, nbr, query_pos=torch.rand(2, 3))
    with pytest.raises(TypeError, match=r"nbr must be a meshshard.ops.Neighbors"):
        conv(torch.rand(5, 2), pos, None)


def _cloud(n, seed):
    g = torch.Generator().manual_seed(seed)
    pts = torch.randint(0, 8, (n, 3), generator=g).double() * 0.25
    pts[n - n // 8 :] = pts[: n // 8]
    return pts, torch.randn(n, 5, generator=g, dtype=torch.float64)


def _model(aggr):
    torch.manual_seed(0)
    return PointConv(5, 6, hidden_channels=(8,), aggr=aggr).double()


def _run(pos, x, query_pos, aggr, neighbours, other):
    """Forward + backward on plain or sharded inputs; returns output, parameter and input grads."""
    model = _model(aggr)
    pos = pos.clone().requires_grad_()
    x = x.clone().requires_grad_()
    if neighbours == "ball":
        nbr = ball_query(pos, query_pos if other else None, 0.5, 7)
    else:
        nbr = knn(pos, query_pos if other else None, 5)
    out = model(x, pos, nbr, query_pos=query_pos if other else None)
    weights = torch.linspace(-1, 1, 6, dtype=torch.float64)
    loss = (out * weights).sum() + out.pow(2).mean()
    loss.backward()
    return model, out, pos, x


def _sharded_case(aggr, neighbours, other):
    mesh = ms.init_mesh()
    world, rank = dist.get_world_size(), dist.get_rank()
    pts, feats = _cloud(150, 1)
    part = partition(pts, world, method="rcb" if aggr == "max" else "hilbert")
    pos = ms.scatter(pts, part, mesh)
    x = ms.scatter(feats, part, mesh)
    qpart = qpts = None
    if other:
        qpts = _cloud(60, 2)[0] + 0.1
        sizes = [7, 0, 13, 2][:world]
        sizes = [60 * s // sum(sizes) for s in sizes]
        sizes[-1] = 60 - sum(sizes[:-1])
        qpart = sizes
    query_pos = ms.scatter(qpts, qpart, mesh) if other else None
    model, out, pos_leaf, x_leaf = _run(pos, x, query_pos, aggr, neighbours, other)
    ms.nn.sync_gradients(model, mesh)
    lo, hi = pos.offsets[rank], pos.offsets[rank + 1]
    return {
        "out": out.full_tensor().to_plain().detach(),
        "params": {n: p.grad for n, p in model.named_parameters()},
        "pos_grad": pos_leaf.grad.to_local() if isinstance(pos_leaf.grad, ms.ShardTensor) else pos_leaf.grad,
        "x_grad": x_leaf.grad.to_local() if isinstance(x_leaf.grad, ms.ShardTensor) else x_leaf.grad,
        "lohi": (lo, hi),
    }


def _sharded_all(cases):
    return [_sharded_case(*c) for c in cases]


CASES = [("max", "ball", False), ("mean", "knn", True), ("max", "ball", True)]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_sharded_matches_single_process(world_size):
    results = run_distributed(_sharded_all, world_size, CASES)
    pts, feats = _cloud(150, 1)
    qpts = _cloud(60, 2)[0] + 0.1
    for i, (aggr, neighbours, other) in enumerate(CASES):
        # The reference runs on the gathered tensors (partition order): ties between equidistant
        # neighbours are broken by position in points.full_tensor().
        perm = partition(pts, world_size, method="rcb" if aggr == "max" else "hilbert").perm
        model, out, pos_leaf, x_leaf = _run(pts[perm], feats[perm], qpts, aggr, neighbours, other)
        for res in (r[i] for r in results):
            lo, hi = res["lohi"]
            torch.testing.assert_close(res["out"], out.detach(), rtol=1e-10, atol=1e-12)
            for name, p in model.named_parameters():
                torch.testing.assert_close(res["params"][name], p.grad, rtol=1e-9, atol=1e-12)
            torch.testing.assert_close(res["x_grad"], x_leaf.grad[lo:hi], rtol=1e-9, atol=1e-12)
            torch.testing.assert_close(res["pos_grad"], pos_leaf.grad[lo:hi], rtol=1e-9, atol=1e-12)
