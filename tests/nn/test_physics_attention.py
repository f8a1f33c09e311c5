"""PhysicsAttention: Transolver's math on plain tensors, and the same module on ShardTensors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

import meshshard as ms
from meshshard.nn import PhysicsAttention
from meshshard.testing import run_distributed


def _reference(attn: PhysicsAttention, x: torch.Tensor) -> torch.Tensor:
    """Transolver's irregular-mesh physics attention written out head by head."""
    h_n, d = attn.heads, attn.dim_head
    heads = []
    for h in range(h_n):
        rows = slice(h * d, (h + 1) * d)
        x_mid = x @ attn.in_project_x.weight[rows].T + attn.in_project_x.bias[rows]
        fx_mid = x @ attn.in_project_fx.weight[rows].T + attn.in_project_fx.bias[rows]
        logits = x_mid @ attn.in_project_slice.weight.T + attn.in_project_slice.bias
        w = torch.softmax(logits / attn.temperature[h].clamp(0.1, 5.0), dim=-1)  # (B, N, M)
        token = (w.transpose(-1, -2) @ fx_mid) / (w.sum(-2)[..., None] + attn.eps)  # (B, M, D)
        q, k, v = token @ attn.to_q.weight.T, token @ attn.to_k.weight.T, token @ attn.to_v.weight.T
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)
        heads.append(w @ (a @ v))  # de-slice: (B, N, D)
    return torch.cat(heads, dim=-1) @ attn.to_out[0].weight.T + attn.to_out[0].bias


def test_matches_transolver_math():
    torch.manual_seed(0)
    attn = PhysicsAttention(12, heads=3, dim_head=4, slice_num=5)
    with torch.no_grad():
        attn.temperature.copy_(torch.tensor([0.3, 0.5, 2.0]).view(3, 1, 1))
    x = torch.randn(2, 17, 12)
    torch.testing.assert_close(attn(x), _reference(attn, x), rtol=1e-5, atol=1e-6)


def test_unbatched_input_is_batch_one():
    torch.manual_seed(0)
    attn = PhysicsAttention(8, heads=2, dim_head=4, slice_num=3)
    x = torch.randn(9, 8)
    y = attn(x)
    assert y.shape == (9, 8)
    torch.testing.assert_close(y, attn(x[None])[0])


def test_initialisation():
    attn = PhysicsAttention(8, heads=2, dim_head=6, slice_num=4)
    torch.testing.assert_close(attn.temperature, torch.full((2, 1, 1), 0.5))
    w = attn.in_project_slice.weight  # (M, D) with M <= D: orthonormal rows
    torch.testing.assert_close(w @ w.T, torch.eye(4), rtol=0, atol=1e-5)


def test_temperature_is_clamped():
    torch.manual_seed(0)
    attn = PhysicsAttention(8, heads=2, dim_head=4, slice_num=3)
    x = torch.randn(10, 8)
    with torch.no_grad():
        attn.temperature.fill_(0.1)
        at_low = attn(x)
        attn.temperature.fill_(1e-4)  # would make the slice weights one-hot
        torch.testing.assert_close(attn(x), at_low)
        attn.temperature.fill_(50.0)
        far = attn(x)
        attn.temperature.fill_(5.0)
        torch.testing.assert_close(attn(x), far)


def test_rows_of_slice_weights_sum_to_one():
    attn = PhysicsAttention(8, heads=2, dim_head=4, slice_num=3)
    w = attn.slice_weights(torch.randn(1, 6, 8))
    assert w.shape == (1, 2, 6, 3)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 2, 6))


def test_errors():
    with pytest.raises(ValueError, match=r"slice_num must be positive \(got 0\)"):
        PhysicsAttention(8, 2, 4, 0)
    with pytest.raises(TypeError, match="Expected 'heads' to be an int"):
        PhysicsAttention(8, 2.0, 4, 3)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        PhysicsAttention(8, 2, 4, 3, dropout=1.0)
    with pytest.raises(ValueError, match="temperature_range"):
        PhysicsAttention(8, 2, 4, 3, temperature_range=(1.0, 2.0))
    attn = PhysicsAttention(8, 2, 4, 3)
    with pytest.raises(ValueError, match=r"x must have shape \(N, 8\) or \(B, N, 8\) \(got \(5, 7\)\)"):
        attn(torch.randn(5, 7))


def _sharded_attention(sizes, batch):
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    torch.manual_seed(0)
    attn = PhysicsAttention(8, heads=2, dim_head=4, slice_num=3)
    n = sum(sizes)
    g = torch.randn(batch, n, 8)
    ref_x = g.clone().requires_grad_()
    ref_y = attn(ref_x)
    ref_y.pow(2).sum().backward()
    ref_grads = {k: p.grad.clone() for k, p in attn.named_parameters()}
    attn.zero_grad()

    off = sum(sizes[:rank])
    leaf = g.narrow(1, off, sizes[rank]).clone().requires_grad_()
    x = ms.ShardTensor.from_local(leaf, mesh, sizes, dim=1)
    with ms.CommCounter() as cc:
        y = attn(x)
    assert isinstance(y, ms.ShardTensor) and y.sharding_sizes == tuple(sizes) and y.shard_dim == 1
    torch.testing.assert_close(y.full_tensor().to_plain(), ref_y.detach(), rtol=1e-5, atol=1e-6)
    y.pow(2).sum().backward()
    ms.nn.sync_gradients(attn, mesh)
    for k, p in attn.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[k], rtol=1e-5, atol=1e-6, msg=k)
    torch.testing.assert_close(leaf.grad, ref_x.grad.narrow(1, off, sizes[rank]), rtol=1e-5, atol=1e-6)
    return cc.counts["all_reduce"]


@pytest.mark.parametrize("world_size, sizes", [(2, [0, 11]), (3, [5, 1, 6])])
def test_sharded_attention_matches_serial(world_size, sizes):
    counts = run_distributed(_sharded_attention, world_size, sizes, 2)
    assert counts == [1] * world_size
