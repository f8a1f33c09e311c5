"""slice_tokens: the fused slice reduction of physics attention, serial and sharded."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import meshshard as ms
from meshshard.ops import finish_slice_tokens, slice_sums, slice_tokens
from meshshard.testing import run_distributed

SIZES = {1: [23], 2: [17, 6], 3: [9, 0, 14], 4: [7, 0, 13, 2]}


def test_hand_made_values():
    w = torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]])
    f = torch.tensor([[1.0], [2.0], [3.0]])
    # sum w f = [1 + 1, 1 + 3], sum w = [1.5, 1.5]
    torch.testing.assert_close(slice_tokens(w, f, eps=0.0), torch.tensor([[4.0 / 3.0], [8.0 / 3.0]]))
    sum_wf, sum_w = slice_sums(w, f)
    torch.testing.assert_close(sum_wf, torch.tensor([[2.0], [4.0]]))
    torch.testing.assert_close(sum_w, torch.tensor([1.5, 1.5]))
    # eps is added once to the weight sum
    torch.testing.assert_close(slice_tokens(w, f, eps=0.5), torch.tensor([[1.0], [2.0]]))


def test_batched_shapes_and_plain_result():
    w = torch.softmax(torch.randn(2, 3, 11, 4), dim=-1)
    f = torch.randn(2, 3, 11, 5)
    z = slice_tokens(w, f)
    assert type(z) is torch.Tensor and z.shape == (2, 3, 4, 5)
    expected = torch.einsum("bhng,bhnc->bhgc", w, f) / (w.sum(2)[..., None] + 1e-5)
    torch.testing.assert_close(z, expected)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 30), m=st.integers(1, 6), c=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_tokens_are_convex_combinations(n, m, c, seed):
    gen = torch.Generator().manual_seed(seed)
    w = torch.softmax(3 * torch.randn(n, m, generator=gen, dtype=torch.float64), dim=-1)
    f = torch.randn(n, c, generator=gen, dtype=torch.float64)
    z = slice_tokens(w, f, eps=0.0)
    assert (z >= f.min(0).values - 1e-12).all() and (z <= f.max(0).values + 1e-12).all()
    torch.testing.assert_close(finish_slice_tokens(*slice_sums(w, f), eps=0.0), z)


def test_errors():
    w, f = torch.rand(5, 3), torch.rand(5, 2)
    with pytest.raises(ValueError, match=r"must agree on every dim but the last \(got \(5, 3\) and \(4, 2\)\)"):
        slice_tokens(w, torch.rand(4, 2))
    with pytest.raises(ValueError, match="weights must have shape"):
        slice_tokens(torch.rand(5), f)
    with pytest.raises(TypeError, match="Expected 'features' to be a torch.Tensor"):
        slice_tokens(w, [[1.0]])
    with pytest.raises(ValueError, match=r"eps must be non-negative \(got -1.0\)"):
        slice_tokens(w, f, eps=-1.0)
    with pytest.raises(ValueError, match="sum_wf"):
        finish_slice_tokens(torch.rand(3, 2), torch.rand(4))


def _sharded_tokens(sizes, batch):
    mesh = ms.init_mesh()
    rank, n = dist.get_rank(), sum(sizes)
    gen = torch.Generator().manual_seed(0)
    g_w = torch.softmax(torch.randn(batch, 2, n, 4, generator=gen), dim=-1)
    g_f = torch.randn(batch, 2, n, 3, generator=gen)
    ref_w, ref_f = g_w.clone().requires_grad_(), g_f.clone().requires_grad_()
    ref = slice_tokens(ref_w, ref_f)
    probe = torch.randn(ref.shape, generator=gen)
    (ref * probe).sum().backward()

    off = sum(sizes[:rank])
    w = g_w.narrow(2, off, sizes[rank]).clone().requires_grad_()
    f = g_f.narrow(2, off, sizes[rank]).clone().requires_grad_()
    sw = ms.ShardTensor.from_local(w, mesh, sizes, dim=2)
    sf = ms.ShardTensor.from_local(f, mesh, sizes, dim=2)
    with ms.CommCounter() as fwd:
        z = slice_tokens(sw, sf)
    assert isinstance(z, ms.ReplicatedTensor)
    torch.testing.assert_close(z.to_plain(), ref.detach(), rtol=1e-5, atol=1e-6)
    with ms.CommCounter() as bwd:
        (z * probe).sum().backward()  # replicated: seeds 1/P on each rank
    torch.testing.assert_close(w.grad, ref_w.grad.narrow(2, off, sizes[rank]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(f.grad, ref_f.grad.narrow(2, off, sizes[rank]), rtol=1e-5, atol=1e-6)
    return dict(fwd.counts), dict(fwd.bytes_sent), dict(bwd.counts)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_sharded_tokens_equal_serial_with_one_fused_all_reduce(world_size):
    for counts, nbytes, bwd in run_distributed(_sharded_tokens, world_size, SIZES[world_size], 2):
        if world_size == 1:
            assert counts == {} and bwd == {}
        else:
            # B * H * M * (C + 1) float32 values: sum w f and sum w in one buffer
            assert counts == {"all_reduce": 1} and nbytes == {"all_reduce": 2 * 2 * 4 * (3 + 1) * 4}
            assert bwd == {"all_reduce": 1}


def _mixed_operands():
    mesh = ms.init_mesh()
    sw = ms.ShardTensor.from_local(torch.rand(3, 4), mesh, [3, 3], dim=0)
    try:
        slice_tokens(sw, torch.rand(6, 2))  # global shapes agree; the mix of kinds is the error
    except TypeError as e:
        return str(e)
    return "no error"


def test_mixed_sharded_and_plain_operands_raise():
    msgs = run_distributed(_mixed_operands, 2)
    assert all("both be ShardTensors or both be plain" in m for m in msgs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_sums_do_not_overflow_at_real_sizes(dtype):
    """sum_n w passes float16's 65504 at 100k points in one slice: summed in float32, tokens finite (issue 32)."""
    n = 100_000
    w = torch.rand(1, n, 2, generator=torch.Generator().manual_seed(0)).softmax(-1)
    f = torch.rand(1, n, 3, generator=torch.Generator().manual_seed(1))
    ref = slice_tokens(w.double(), f.double())
    for autocast in (False, True):
        if autocast:  # the model's Linear layers hand float16 operands over under autocast
            with torch.autocast("cpu", dtype):
                lin = torch.nn.functional.linear
                got = slice_tokens(lin(w, torch.eye(2)), lin(f, torch.eye(3)))
        else:
            got = slice_tokens(w.to(dtype), f.to(dtype))
        assert got.dtype == dtype and torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), ref, rtol=2e-2, atol=2e-2)
    wf, sw = slice_sums(w.to(dtype), f.to(dtype))
    assert wf.dtype == sw.dtype == torch.float32 and float(sw.sum()) == pytest.approx(n, rel=1e-3)
