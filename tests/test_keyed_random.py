"""Keyed Gumbel noise: the bits agree with a plain-Python hash; a point's draw depends only on its keys."""

from __future__ import annotations

import math

import pytest
import torch

from meshshard._keyed_random import gumbel_noise, keyed_uniform, mix32, unit_interval


def _lowbias32(x: int) -> int:
    """Chris Wellons' lowbias32, written out on Python ints."""
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_tensor_hash_equals_the_python_hash_on_every_bit():
    values = [0, 1, 2, 12345, 2**31 - 1, 2**31, 2**32 - 1, 0xDEADBEEF]
    signed = [v - 2**32 if v >= 2**31 else v for v in values]
    got = mix32(torch.tensor(signed, dtype=torch.int32)).tolist()
    assert [g & 0xFFFFFFFF for g in got] == [_lowbias32(v) for v in values]
    assert [mix32(v) for v in values] == [_lowbias32(v) for v in values]


def test_a_points_draw_depends_on_its_id_not_on_its_neighbours():
    ids = torch.arange(1000)
    u = keyed_uniform(ids, 2, 3, 4, seed=7)
    assert u.shape == (2, 3, 1000, 4)
    perm = torch.randperm(1000, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(keyed_uniform(ids[perm], 2, 3, 4, seed=7), u[:, :, perm], rtol=0, atol=0)
    torch.testing.assert_close(keyed_uniform(ids[300:301], 2, 3, 4, seed=7), u[:, :, 300:301], rtol=0, atol=0)
    assert not torch.equal(keyed_uniform(ids, 2, 3, 4, seed=8), u)
    big = torch.tensor([5, 2**40 + 5, 2**33 + 5])  # the high 32 bits of the id count too
    v = keyed_uniform(big, 1, 1, 2, seed=0)
    assert not torch.equal(v[0, 0, 0], v[0, 0, 1]) and not torch.equal(v[0, 0, 1], v[0, 0, 2])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_element_wise_uniforms_are_exact_and_strictly_inside_0_1(dtype):
    from meshshard._keyed_random import _FRACTION_BITS, uniform_at  # here, not at the top: see the note of i27c

    index = torch.arange(200_000).reshape(400, 500) * 7919 + 2**40
    u = uniform_at(index, seed=11, dtype=dtype)
    assert u.dtype == dtype and u.shape == index.shape
    assert float(u.min()) > 0 and float(u.max()) < 1
    k = _FRACTION_BITS[dtype]
    t = u.double() * 2.0**k - 0.5  # (t + 1/2) 2^-k is exact: t comes back as a whole number below 2^k
    assert torch.equal(t, t.round()) and float(t.max()) < 2**k
    assert abs(float(u.double().mean()) - 0.5) < 5e-3
    assert torch.equal(uniform_at(index[123:124, 7:9], seed=11, dtype=dtype), u[123:124, 7:9])  # keyed, not stateful
    assert not torch.equal(uniform_at(index, seed=12, dtype=dtype), u)
    assert not torch.equal(uniform_at(index, seed=11, dtype=dtype, stream=1), u)


def test_element_wise_normals_and_bits():
    from meshshard._keyed_random import keyed_bits, normal_at, uniform_at

    index = torch.arange(100_000)
    for dtype in (torch.float64, torch.float32):
        z = normal_at(index, seed=4, dtype=dtype)
        assert z.dtype == dtype and torch.isfinite(z).all()
        assert abs(float(z.mean())) < 0.01 and abs(float(z.std()) - 1) < 0.01
        assert abs(float(torch.corrcoef(torch.stack([z[:-1], z[1:]]).double())[0, 1])) < 0.02
    bits = keyed_bits(index, seed=1)
    assert bits.dtype == torch.int32 and len(bits.unique()) > 99_990
    with pytest.raises(TypeError, match=r"Expected float64, float32, float16 or bfloat16 for uniform numbers "
                                        r"\(got torch.int64\)"):
        uniform_at(index, seed=0, dtype=torch.int64)


def test_uniform_and_gumbel_statistics():
    u = keyed_uniform(torch.arange(50_000), 1, 2, 8, seed=3)
    assert 0 < float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 3e-3 and abs(float(u.var()) - 1 / 12) < 2e-3
    g = gumbel_noise(torch.arange(50_000), 1, 2, 8, seed=3, dtype=torch.float64)
    assert abs(float(g.mean()) - 0.5772156649) < 0.01  # Euler-Mascheroni
    assert abs(float(g.var()) - math.pi**2 / 6) < 0.03
    # neighbouring slices, heads and points are uncorrelated
    flat = g[0, 0]
    assert abs(float(torch.corrcoef(torch.stack([flat[:, 0], flat[:, 1]]))[0, 1])) < 0.02
    assert abs(float(torch.corrcoef(torch.stack([g[0, 0, :, 0], g[0, 1, :, 0]]))[0, 1])) < 0.02
    assert abs(float(torch.corrcoef(torch.stack([flat[:-1, 0], flat[1:, 0]]))[0, 1])) < 0.02


def test_half_precision_and_errors():
    g = gumbel_noise(torch.arange(10), 1, 1, 3, seed=1, dtype=torch.bfloat16)
    assert g.dtype == torch.bfloat16 and torch.isfinite(g).all()
    with pytest.raises(ValueError, match=r"point_ids must be a 1-d integer tensor \(got shape \(2, 2\)"):
        keyed_uniform(torch.zeros(2, 2, dtype=torch.int64), 1, 1, 1, seed=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_every_24_bit_pattern_gives_a_number_strictly_inside_0_1_and_finite_gumbel(dtype):
    """Exhaustive over the top 24 bits (the low 8 bits all set, the worst case for rounding up).

    The float32 conversion of earlier versions, ``(t + 0.5) * 2**-24``, gave exactly 1.0 for
    ``t = 2**24 - 1`` (``-log(-log(1)) = inf``: NaN in Transolver++ from ~20k points, issue 32).
    """
    top = torch.arange(2**24, dtype=torch.int64)
    bits = ((top << 8) | 0xFF).to(torch.int64)
    bits = (bits - ((bits >> 31) & 1) * (1 << 32)).to(torch.int32)  # the int32 with the same bits
    u = unit_interval(bits, dtype)
    assert u.dtype == dtype
    assert float(u.min()) > 0 and float(u.max()) < 1
    k = {torch.float64: 23, torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}[dtype]
    steps = u[1:] != u[:-1]  # u rises with the bits: count its distinct values without sorting
    assert bool((u[1:] >= u[:-1]).all()) and int(steps.sum()) + 1 == 2**k  # no two draws merged by rounding
    g = -torch.log(-torch.log(u))
    assert torch.isfinite(g).all()
    assert torch.isfinite(gumbel_noise(torch.arange(4), 1, 1, 2, seed=0, dtype=dtype)).all()


def test_float32_and_float64_draw_the_same_numbers():
    ids = torch.arange(5000)
    u32, u64 = keyed_uniform(ids, 1, 2, 3, seed=9), keyed_uniform(ids, 1, 2, 3, seed=9, dtype=torch.float64)
    assert torch.equal(u32.double(), u64)
    with pytest.raises(TypeError, match=r"Expected a floating dtype for the uniform numbers \(got torch.int64\)"):
        keyed_uniform(ids, 1, 1, 1, seed=0, dtype=torch.int64)


def test_tensor_seed_draws_the_python_seeds_numbers():
    # the traced form of Transolver++'s step seed (a 0-d int64 tensor) hashes to the same keys as the int
    from meshshard._keyed_random import _key, _key_tensor, _s32, step_seed

    bases = [0, 1, 1_000_003, 2**32 - 1, 2**32, 2**62 + 12345, 2**63 - 1, 2**63 - 2**32]
    steps = [0, 1, 3, 2**31, 2**32 - 1, 2**32, 2**40 + 7, -1, -(2**33)]
    for base in bases:
        for step in steps:
            seed = (base + step) % 2**63
            t = step_seed(base, torch.tensor(step, dtype=torch.int64))
            assert t.dtype == torch.int64 and int(t) == seed
            for rest in [(0, 0), (3, 1), (-1, 5)]:
                assert int(_key_tensor(t, *rest)) == _s32(_key(seed, *rest))
    ids = torch.arange(50) * 977 + 2**33
    for seed in [0, 7, 2**63 - 1, 2**40 + 3]:
        assert torch.equal(gumbel_noise(ids, 2, 3, 4, torch.tensor(seed), torch.float64),
                           gumbel_noise(ids, 2, 3, 4, seed, torch.float64))
