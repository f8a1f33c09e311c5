"""A plain-PyTorch PointNet surrogate trains domain-parallel unchanged: same losses and parameters as one process."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import meshshard as ms
from meshshard.testing import run_distributed

N, STEPS = 57, 5


def _data():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 6, N, generator=g)
    y = torch.randn(1, 4, N, generator=g)
    return x, y


def _train(x, y, mesh=None):
    torch.manual_seed(0)
    model = ms.nn.PointNetSurrogate(in_dim=6, out_dim=4, width=16, global_dim=32)
    # SGD with momentum: Adam would turn the round-off-level gradients of the conv biases in front of
    # BatchNorm (exactly zero in exact arithmetic) into full-size steps, in one process as in several
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(STEPS):
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if mesh is not None:
            ms.nn.sync_gradients(model, mesh)
        opt.step()
        losses.append(float(loss.detach()))
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return losses, state


def _check(sizes):
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    x, y = _data()
    ref_losses, ref_state = _train(x, y)
    off = sum(sizes[:rank])
    xs = ms.ShardTensor.from_local(x[..., off : off + sizes[rank]].clone(), mesh, sizes=sizes, dim=2)
    ys = ms.ShardTensor.from_local(y[..., off : off + sizes[rank]].clone(), mesh, sizes=sizes, dim=2)
    losses, state = _train(xs, ys, mesh)
    same_loss = all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(losses, ref_losses))
    same_params = all(torch.allclose(state[k].float(), ref_state[k].float(), rtol=1e-5, atol=1e-6) for k in state)
    worst = max(float(((state[k].double() - ref_state[k].double()).abs() / (ref_state[k].double().abs() + 1e-6)).max())
                for k in state)
    return same_loss, same_params, losses, ref_losses, worst


@pytest.mark.parametrize("sizes", [[20, 37], [30, 0, 27]])
def test_pointnet_trains_like_one_process(sizes):
    for same_loss, same_params, losses, ref, worst in run_distributed(_check, len(sizes), sizes, timeout=600):
        assert same_loss, (losses, ref)
        assert same_params, worst
        assert losses[-1] < losses[0]
