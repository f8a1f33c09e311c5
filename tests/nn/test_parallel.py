"""A small MLP + global pooling model: sharded gradients equal single-process ones (1-D and 2-D meshes)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import Replicate, distribute_tensor

import meshshard as ms
from meshshard.testing import run_distributed

SIZES = {1: [9], 2: [7, 0], 3: [5, 0, 8], 4: [7, 0, 13, 2]}


class PoolNet(torch.nn.Module):
    """Per-point MLP, global mean+max pooling, a head on the pooled vector, and a per-point output."""

    def __init__(self):
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.GELU(), torch.nn.LayerNorm(16))
        self.head = torch.nn.Linear(32, 16)
        self.out = torch.nn.Linear(16, 2)

    def forward(self, x):
        h = self.mlp(x)
        pooled = torch.cat([h.mean(0), h.amax(0)])  # replicated, all-reduced
        return self.out(h + self.head(pooled))  # replicated vector broadcast onto local points


def _model(seed=0):
    torch.manual_seed(seed)
    return PoolNet()


def _data(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, generator=g), torch.randn(n, 2, generator=g)


def _loss(y, t):
    return ((y - t) ** 2).mean() + y.std()


def _reference(n, seed):
    model = _model()
    x, t = _data(n, seed)
    x.requires_grad_()
    y = model(x)
    _loss(y, t).backward()
    return y.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}, x.grad


def _sharded_step(sizes):
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    n = sum(sizes)
    model = _model()
    x, t = _data(n, seed=1)
    off = sum(sizes[:rank])
    local = x[off : off + sizes[rank]].clone().requires_grad_()
    xs = ms.ShardTensor.from_local(local, mesh, sizes=sizes)
    ts = ms.scatter(t, sizes, mesh)
    y = model(xs)
    loss = _loss(y, ts)
    loss.backward()
    ms.nn.sync_gradients(model, mesh)
    y_ref, g_ref, x_grad_ref = _reference(n, seed=1)
    grads_ok = {
        k: torch.allclose(p.grad, g_ref[k], rtol=1e-5, atol=1e-6) for k, p in model.named_parameters()
    }
    return (
        torch.allclose(y.full_tensor(), y_ref, rtol=1e-5, atol=1e-6),
        grads_ok,
        torch.allclose(local.grad, x_grad_ref[off : off + sizes[rank]], rtol=1e-5, atol=1e-6),
    )


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_mlp_pooling_gradients_equal_single_process(world_size):
    for y_ok, grads_ok, xgrad_ok in run_distributed(_sharded_step, world_size, SIZES[world_size]):
        assert y_ok
        assert all(grads_ok.values()), grads_ok
        assert xgrad_ok


def _two_d_step(sizes_per_sample):
    """Mesh (dp=2, domain=2): sample i on dp rank i, its points over the domain axis."""
    mesh = ms.init_mesh((2, 2))
    dp, dom = mesh.get_local_rank(0), mesh.get_local_rank(1)
    model = _model()
    sizes = sizes_per_sample[dp]
    x, t = _data(sum(sizes), seed=10 + dp)
    xs = ms.scatter(x, sizes, mesh)
    ts = ms.scatter(t, sizes, mesh)
    _loss(model(xs), ts).backward()
    ms.nn.sync_gradients(model, mesh)
    # reference: the mean of the per-sample gradients (what DDP over 2 samples computes)
    refs = [_reference(sum(s), seed=10 + i)[1] for i, s in enumerate(sizes_per_sample)]
    return dp, dom, {k: torch.allclose(p.grad, (refs[0][k] + refs[1][k]) / 2, rtol=1e-5, atol=1e-6)
                     for k, p in model.named_parameters()}


def test_two_d_mesh_data_parallel_times_domain():
    out = run_distributed(_two_d_step, 4, [[6, 0], [3, 9]])
    assert sorted((dp, dom) for dp, dom, _ in out) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for _, _, ok in out:
        assert all(ok.values()), ok


def _dtensor_weight(sizes):
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    torch.manual_seed(0)
    w = torch.randn(4, 3)
    wd = distribute_tensor(w, mesh, [Replicate()])
    x, _ = _data(sum(sizes), seed=2)
    off = sum(sizes[:rank])
    xs = ms.ShardTensor.from_local(x[off : off + sizes[rank]], mesh, sizes=sizes)
    y = torch.nn.functional.linear(xs, wd)
    return type(y).__name__, torch.allclose(y.full_tensor(), x @ w.T, atol=1e-6)


def test_replicated_dtensor_weights_interoperate():
    for kind, ok in run_distributed(_dtensor_weight, 2, SIZES[2]):
        assert kind == "ShardTensor" and ok


class BranchNet(torch.nn.Module):
    """Points with a positive first coordinate go through ``pos``, the others through ``neg``; ``never`` is unused.

    Written as such code is (``if mask.any(): ...``): a rank without positive points never reaches ``pos``.
    """

    def __init__(self):
        super().__init__()
        self.pos = torch.nn.Linear(3, 2)
        self.neg = torch.nn.Linear(3, 2)
        self.never = torch.nn.Linear(3, 2)

    def forward(self, x):
        out = x.new_zeros(x.shape[0], 2)
        mask = x[:, 0] > 0
        if mask.any():
            out = out.index_put((mask,), self.pos(x[mask]))
        if (~mask).any():
            out = out.index_put((~mask,), self.neg(x[~mask]))
        return out


def _branch_points(n):
    x, _ = _data(n, seed=4)
    x[:, 0] = torch.linspace(-1.0, 1.0, n)  # sorted: the first ranks hold only negative points
    return x


def _branch_step(sizes):
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = BranchNet()
    x = _branch_points(sum(sizes))
    off = sum(sizes[:rank])
    # each rank's loss on its own points (plain tensors): the sum over ranks is the single-process loss
    loss = (model(x[off : off + sizes[rank]]) ** 2).sum()
    if loss.requires_grad:  # an empty rank reaches no parameter at all
        loss.backward()
    reached = {k: p.grad is not None for k, p in model.named_parameters()}
    ms.nn.sync_gradients(model, mesh)
    torch.manual_seed(0)
    ref = BranchNet()
    (ref(x) ** 2).sum().backward()
    return reached, {
        k: (p.grad is None) if ref.get_parameter(k).grad is None
        else torch.allclose(p.grad, ref.get_parameter(k).grad, rtol=1e-5, atol=1e-6)
        for k, p in model.named_parameters()
    }


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_a_parameter_reached_on_some_ranks_only_is_a_zero_gradient_elsewhere(world_size):
    sizes = {2: [3, 4], 3: [3, 0, 6], 4: [2, 0, 5, 1]}[world_size]
    results = run_distributed(_branch_step, world_size, sizes)
    assert not results[0][0]["pos.weight"]  # rank 0 holds only negative points (or none)
    assert any(reached["pos.weight"] for reached, _ in results)
    for _, ok in results:
        assert all(ok.values()), ok


def _mismatched_models(_):
    from meshshard.errors import ShardingError

    mesh = ms.init_mesh()
    model = torch.nn.Linear(3, 2 + dist.get_rank())
    model(torch.ones(1, 3)).sum().backward()
    try:
        ms.nn.sync_gradients(model, mesh)
    except ShardingError as exc:
        return str(exc)
    return None


def test_ranks_with_different_parameters_raise_the_same_error():
    for rank, msg in enumerate(run_distributed(_mismatched_models, 2, None)):
        assert msg == (f"[rank {rank}] sync_gradients: every rank must hold the same parameters (numbers, shapes, "
                       "dtypes); found rank 0: 2 parameters of 8 elements; rank 1: 2 parameters of 12 elements")
