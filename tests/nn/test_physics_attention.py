"""PhysicsAttention: Transolver's math on plain tensors, and the same module on ShardTensors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

import meshshard as ms
from meshshard._keyed_random import gumbel_noise
from meshshard.nn import PhysicsAttention
from meshshard.testing import run_distributed


def _reference(attn: PhysicsAttention, x: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
    """The published physics attention written out head by head from the papers' equations.

    Transolver (Wu et al. 2024, Eq. 1-4): ``w = softmax(W_s W_x x / tau_h)`` (no clamp),
    ``z = sum w f / (sum w + 1e-5)`` with ``f = W_f x``, attention among the ``z``, ``y = sum_g w z'``.
    Transolver++ (Luo et al. 2025, Eq. 5-6): ``tau_n = max(tau_h + GELU(W_2 GELU(W_1 x_mid)), 0.01)``,
    ``w = softmax((W_s x_mid + g) / tau_n)``, ``f = x_mid``.
    """
    h_n, d = attn.heads, attn.dim_head
    plus = attn.variant == "plus"
    heads = []
    for h in range(h_n):
        rows = slice(h * d, (h + 1) * d)
        x_mid = x @ attn.in_project_x.weight[rows].T + attn.in_project_x.bias[rows]
        logits = x_mid @ attn.in_project_slice.weight.T + attn.in_project_slice.bias
        if plus:
            fx_mid = x_mid
            p = attn.proj_temperature
            hidden = torch.nn.functional.gelu(x_mid @ p[0].weight.T + p[0].bias)
            tau = (attn.temperature[h] + torch.nn.functional.gelu(hidden @ p[2].weight.T + p[2].bias)).clamp(min=0.01)
            if noise is not None:
                logits = logits + noise[:, h]
        else:
            fx_mid = x @ attn.in_project_fx.weight[rows].T + attn.in_project_fx.bias[rows]
            tau = attn.temperature[h]
        w = torch.softmax(logits / tau, dim=-1)  # (B, N, M)
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


def _grads(module, fn):
    module.zero_grad()
    fn().pow(2).sum().backward()
    return {k: p.grad.clone() for k, p in module.named_parameters()}


@pytest.mark.parametrize("temperatures", [[0.01, 0.5, 40.0], [1e-3, 7.5, 0.05]])
def test_temperatures_far_outside_the_old_clamp_match_the_published_model(temperatures):
    """No clamp by default: any positive temperature gives the published output and gradient."""
    torch.manual_seed(1)
    attn = PhysicsAttention(12, heads=3, dim_head=4, slice_num=5).double()
    with torch.no_grad():
        attn.temperature.copy_(torch.tensor(temperatures, dtype=torch.float64).view(3, 1, 1))
    x = torch.randn(2, 17, 12, dtype=torch.float64)
    torch.testing.assert_close(attn(x), _reference(attn, x), rtol=1e-10, atol=1e-12)
    ours, ref = _grads(attn, lambda: attn(x)), _grads(attn, lambda: _reference(attn, x))
    for k in ours:
        torch.testing.assert_close(ours[k], ref[k], rtol=1e-9, atol=1e-12, msg=k)
    assert (ours["temperature"].abs() > 0).all()  # no clamp blocks the gradient


def test_plus_matches_transolver_plus_math_in_eval_and_training():
    torch.manual_seed(2)
    attn = PhysicsAttention(12, heads=3, dim_head=4, slice_num=5, variant="plus").double()
    assert not hasattr(attn, "in_project_fx")
    with torch.no_grad():
        attn.temperature.copy_(torch.tensor([0.02, 0.5, 9.0], dtype=torch.float64).view(3, 1, 1))
        for p in attn.proj_temperature.parameters():
            p.normal_(0, 0.5)
    x = torch.randn(2, 17, 12, dtype=torch.float64)
    attn.eval()
    torch.testing.assert_close(attn(x), _reference(attn, x), rtol=1e-10, atol=1e-12)
    attn.train()
    seed = 12345
    noise = gumbel_noise(torch.arange(17), 2, 3, 5, seed, torch.float64)
    torch.testing.assert_close(attn(x, seed), _reference(attn, x, noise), rtol=1e-10, atol=1e-12)
    ours, ref = _grads(attn, lambda: attn(x, seed)), _grads(attn, lambda: _reference(attn, x, noise))
    for k in ours:
        torch.testing.assert_close(ours[k], ref[k], rtol=1e-9, atol=1e-12, msg=k)


def test_plus_draws_new_noise_each_training_step_and_none_in_eval():
    torch.manual_seed(3)
    attn = PhysicsAttention(8, heads=2, dim_head=4, slice_num=3, variant="plus")
    x = torch.randn(1, 11, 8)
    a, b = attn(x), attn(x)
    assert attn.rng_step == 2 and not torch.allclose(a, b)
    attn.rng_step = 1  # replay step 2
    torch.testing.assert_close(attn(x), b)
    attn.eval()
    torch.testing.assert_close(attn(x), attn(x))
    assert attn.rng_step == 2


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


def test_temperature_is_clamped_only_on_request():
    torch.manual_seed(0)
    attn = PhysicsAttention(8, heads=2, dim_head=4, slice_num=3, temperature_range=(0.1, 5.0))
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
    with pytest.raises(ValueError, match=r"slice_num must be at least 1 \(got 0\)"):
        PhysicsAttention(8, 2, 4, 0)
    with pytest.raises(TypeError, match=r"heads must be an integer \(got"):
        PhysicsAttention(8, 2.0, 4, 3)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        PhysicsAttention(8, 2, 4, 3, dropout=1.0)
    with pytest.raises(ValueError, match=r"temperature_range must satisfy 0 < low <= high \(got \(2.0, 1.0\)\)"):
        PhysicsAttention(8, 2, 4, 3, temperature_range=(2.0, 1.0))
    with pytest.raises(ValueError, match="temperature_range applies to variant='plain' only"):
        PhysicsAttention(8, 2, 4, 3, variant="plus", temperature_range=(0.1, 5.0))
    with pytest.raises(ValueError, match=r"variant must be one of \('plain', 'plus'\) \(got 'plus\+\+'\)"):
        PhysicsAttention(8, 2, 4, 3, variant="plus++")
    attn = PhysicsAttention(8, 2, 4, 3)
    with pytest.raises(ValueError, match=r"x must have shape \(N, 8\) or \(B, N, 8\) \(got \(5, 7\)\)"):
        attn(torch.randn(5, 7))
    with pytest.raises(ValueError, match=r"point_ids must have shape \(5,\), one id per point \(got \(4,\)\)"):
        attn(torch.randn(5, 8), point_ids=torch.arange(4))
    with pytest.raises(TypeError, match="Expected 'point_ids' to be an int32/int64 tensor"):
        attn(torch.randn(5, 8), point_ids=torch.zeros(5))


def _sharded_attention(sizes, batch, variant="plain"):
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    torch.manual_seed(0)
    attn = PhysicsAttention(8, heads=2, dim_head=4, slice_num=3, variant=variant)
    n = sum(sizes)
    g = torch.randn(batch, n, 8)
    ref_x = g.clone().requires_grad_()
    ref_y = attn(ref_x)
    attn.rng_step = 0  # the sharded run draws the same Gumbel noise (plus, training) as the serial one
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


@pytest.mark.parametrize("variant", ["plain", "plus"])
@pytest.mark.parametrize("world_size, sizes", [(2, [0, 11]), (3, [5, 1, 6])])
def test_sharded_attention_matches_serial(world_size, sizes, variant):
    counts = run_distributed(_sharded_attention, world_size, sizes, 2, variant)
    assert counts == [1] * world_size
