"""torch.autograd.grad with respect to sharded coordinates (create_graph=True): PDE residuals, sharded."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import meshshard as ms
from meshshard.testing import run_distributed

from ._serial import split

N = 17


def _field(xyz, net):
    """A smooth predicted field (u, v, w, p) of the coordinates: an MLP, as a PINN would use."""
    return net(xyz)


def _d(y, xyz, form):
    """d(y)/d(xyz) per point: ``grad(y.sum(), x)`` (an all-reduce and its backward) or with ``grad_outputs``."""
    if form == "sum":
        return torch.autograd.grad(y.sum(), xyz, create_graph=True)[0]
    return torch.autograd.grad(y, xyz, grad_outputs=torch.ones_like(y), create_graph=True)[0]


def _residuals(xyz, net, form):
    """Gradient of p, divergence of (u, v, w), Laplacian of p, and a loss on them (second derivatives)."""
    out = _field(xyz, net)
    p = out[:, 3]
    grad_p = _d(p, xyz, form)
    div = 0
    for i in range(3):
        div = div + _d(out[:, i], xyz, form)[:, i]
    lap = 0
    for i in range(3):
        lap = lap + _d(grad_p[:, i], xyz, form)[:, i]
    loss = (div**2).mean() + ((lap - 1.0) ** 2).mean()
    return grad_p, div, lap, loss


def _check(form):
    mesh = ms.init_mesh()
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()
    coords = torch.rand(N, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ref_x = coords.clone().requires_grad_()
    ref = _residuals(ref_x, net, form)
    ref[3].backward()
    ref_grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    sizes = split(N, world)
    off = sum(sizes[:rank])
    local = coords[off : off + sizes[rank]].clone().requires_grad_()
    x = ms.ShardTensor.from_local(local, mesh, sizes=sizes)
    with ms.CommCounter() as cc:
        got = _residuals(x, net, form)
    got[3].backward()
    ms.nn.sync_gradients(net, mesh)
    rows = slice(off, off + sizes[rank])
    ok = [isinstance(g, ms.ShardTensor) for g in got[:3]]
    ok += [torch.allclose(g.to_local(), r[rows], rtol=1e-10, atol=1e-12) for g, r in zip(got[:3], ref[:3])]
    ok.append(torch.allclose(got[3].to_plain(), ref[3], rtol=1e-10))
    ok += [torch.allclose(torch.zeros_like(p) if p.grad is None else p.grad, r, rtol=1e-9, atol=1e-12)
           for p, r in zip(net.parameters(), ref_grads)]
    return all(ok), dict(cc.counts)


@pytest.mark.parametrize("form", ["grad_outputs", "sum"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_pde_residuals_wrt_sharded_coordinates(world_size, form):
    for ok, counts in run_distributed(_check, world_size, form):
        assert ok
        if world_size > 1:
            # grad_outputs: no communication for the derivatives, only the loss's two means; y.sum(): one
            # all-reduce per sum and one in each grad's backward through it (7 derivatives)
            assert counts == {"all_reduce": 2 if form == "grad_outputs" else 2 + 2 * 7}
