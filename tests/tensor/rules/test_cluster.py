"""torch_cluster's radius / knn / radius_graph / knn_graph / fps on ShardTensor points equal the gathered call."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import meshshard as ms
from meshshard.tensor._rules._cluster import fps_index, knn_edges, radius_edges
from meshshard.testing import run_distributed

N = 37
SIZES = {1: [37], 2: [36, 1], 3: [0, 25, 12], 4: [9, 0, 1, 27]}


def _cloud():
    g = torch.Generator().manual_seed(5)
    return torch.rand(N, 3, generator=g, dtype=torch.float64)


def _sorted(ei: torch.Tensor) -> torch.Tensor:
    key = ei[0] * (N + 1) + ei[1]
    return ei[:, key.argsort()]


def _shard(pos):
    mesh = ms.init_mesh()
    world, rank = dist.get_world_size(), dist.get_rank()
    sizes = SIZES[world]
    lo = sum(sizes[:rank])
    return ms.ShardTensor.from_local(pos[lo: lo + sizes[rank]], mesh, sizes=sizes)


def _mechanism():
    pos = _cloud()
    x = _shard(pos)
    out = {
        "radius": radius_edges(x, x, 0.3, 64).full_tensor().tolist(),
        "knn": knn_edges(x, x, 5).full_tensor().tolist(),
        "fps": fps_index(x, 0.4).full_tensor().tolist(),
    }
    errors = []
    try:
        radius_edges(x, x, 0.9, 2)
    except ms.UnsupportedOpError as exc:
        errors.append(str(exc).split("]", 1)[1])
    return out, errors


def _reference(pos, r, k, ratio):
    d2 = torch.cdist(pos, pos).pow(2)
    inside = (d2 < r * r).nonzero().T  # [query, point], sorted by query then point
    order = torch.stack([d2, torch.arange(N).expand(N, N).double()], -1)
    knn = torch.stack([torch.arange(N).repeat_interleave(k),
                       torch.tensor([sorted(range(N), key=lambda j, i=i: tuple(order[i, j].tolist()))[:k]
                                     for i in range(N)]).flatten()])
    sel, dist2 = [0], (pos - pos[0]).pow(2).sum(1)
    for _ in range(1, int(torch.tensor(N * ratio, dtype=torch.float64).ceil())):
        sel.append(int(dist2.argmax()))
        dist2 = torch.minimum(dist2, (pos - pos[sel[-1]]).pow(2).sum(1))
    return inside, knn, torch.tensor(sel)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_mechanism_equals_exact_reference_without_torch_cluster(world):
    pos = _cloud()
    inside, knn, sel = _reference(pos, 0.3, 5, 0.4)
    results = run_distributed(_mechanism, world)
    for out, errors in results:
        out = {k: torch.tensor(v, dtype=torch.long) for k, v in out.items()}
        torch.testing.assert_close(out["radius"], inside, rtol=0, atol=0)
        torch.testing.assert_close(_sorted(out["knn"]), _sorted(knn), rtol=0, atol=0)
        torch.testing.assert_close(out["fps"], sel, rtol=0, atol=0)
        assert len(errors) == 1 and "max_num_neighbors" in errors[0] and "to_local" not in errors[0]
    assert len({e[0] for _, e in results}) == 1  # the same message on every rank


def _through_torch_cluster():
    import torch_cluster
    import torch_geometric.nn as pyg

    x = _shard(_cloud())
    out = {
        "radius": torch_cluster.radius(x, x, 0.3, max_num_neighbors=64).full_tensor().tolist(),
        "knn": torch_cluster.knn(x, x, 4).full_tensor().tolist(),
        "radius_graph": pyg.radius_graph(x, 0.3, max_num_neighbors=64).full_tensor().tolist(),
        "knn_graph": pyg.knn_graph(x, 4).full_tensor().tolist(),
        "fps": pyg.fps(x, ratio=0.3, random_start=False).full_tensor().tolist(),
    }
    errors = []
    for call in (lambda: torch_cluster.fps(x, ratio=0.5), lambda: torch_cluster.knn(x, x, 3, cosine=True)):
        try:
            call()
        except ms.UnsupportedOpError as exc:
            errors.append(str(exc))
    return out, errors


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_torch_cluster_calls_equal_the_gathered_call(world):
    torch_cluster = pytest.importorskip("torch_cluster", reason="torch-cluster is not installed")
    import torch_geometric.nn as pyg

    pos = _cloud()
    ref = {
        "radius": torch_cluster.radius(pos, pos, 0.3, max_num_neighbors=64),
        "knn": torch_cluster.knn(pos, pos, 4),
        "radius_graph": pyg.radius_graph(pos, 0.3, max_num_neighbors=64),
        "knn_graph": pyg.knn_graph(pos, 4),
        "fps": pyg.fps(pos, ratio=0.3, random_start=False),
    }
    for out, errors in run_distributed(_through_torch_cluster, world):
        for name, want in ref.items():
            got = torch.tensor(out[name], dtype=torch.long).reshape(want.shape[0] if name == "fps" else 2, -1)
            got = got.flatten() if name == "fps" else got
            if name != "fps":
                got, want = _sorted(got), _sorted(want)
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)
        assert len(errors) == 2 and all("to_local" not in e for e in errors)


def _set_abstraction(pos, x):
    """One PointNet++ set abstraction as PyG's pointnet2 example writes it (fps, radius, PointNetConv)."""
    from torch_geometric.nn import MLP, PointNetConv, fps, global_max_pool, radius

    torch.manual_seed(0)
    conv = PointNetConv(MLP([3 + 3, 8, 8]).double(), add_self_loops=False)
    idx = fps(pos, None, ratio=0.5, random_start=False)  # the example's default random_start=True is refused
    row, col = radius(pos, pos[idx], 0.4, None, None, max_num_neighbors=64)
    out = conv((x, x[idx]), (pos, pos[idx]), torch.stack([col, row], dim=0))
    return conv, out, global_max_pool(out, None)


def _sa_on_ranks():
    pos_all = _cloud()
    x_all = torch.randn(N, 3, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    pos, x = _shard(pos_all), _shard(x_all).detach().requires_grad_()
    conv, out, pooled = _set_abstraction(pos, x)
    (out.square().sum() + pooled.sum()).backward()
    ms.nn.sync_gradients(conv, ms.init_mesh())  # replicated weights: their gradients summed over the domain
    grads = {n: p.grad.tolist() for n, p in conv.named_parameters()}
    return out.full_tensor().tolist(), pooled.tolist(), x.grad.full_tensor().tolist(), grads


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_pointnet2_set_abstraction_is_exact_forward_and_backward(world):
    pytest.importorskip("torch_cluster", reason="torch-cluster is not installed")
    pos = _cloud()
    x = torch.randn(N, 3, generator=torch.Generator().manual_seed(6), dtype=torch.float64).requires_grad_()
    conv, out, pooled = _set_abstraction(pos, x)
    (out.square().sum() + pooled.sum()).backward()
    for got, got_pooled, grad, param_grads in run_distributed(_sa_on_ranks, world):
        assert set(param_grads) == {n for n, _ in conv.named_parameters()}
        for name, p in conv.named_parameters():
            torch.testing.assert_close(torch.tensor(param_grads[name], dtype=torch.float64), p.grad,
                                       rtol=0, atol=1e-12, msg=name)
        torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), out.detach(), rtol=0, atol=1e-12)
        torch.testing.assert_close(torch.tensor(got_pooled, dtype=torch.float64), pooled.detach(), rtol=0, atol=1e-12)
        torch.testing.assert_close(torch.tensor(grad, dtype=torch.float64), x.grad, rtol=0, atol=1e-12)
