"""Morton and Hilbert keys: exact small values and the curve's defining properties."""

from __future__ import annotations

import pytest
import torch

from meshshard.partition._sfc import DEFAULT_BITS, hilbert_keys, morton_keys, quantize


def _full_grid(dim: int, bits: int) -> torch.Tensor:
    side = torch.arange(1 << bits)
    return torch.cartesian_prod(*([side] * dim)).reshape(-1, dim)


def test_morton_exact_3d_and_2d():
    grid3 = torch.tensor([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1], [2, 0, 0], [3, 5, 6]])
    # x is the least significant bit of each triple; (3,5,6): x=011 y=101 z=110
    assert morton_keys(grid3).tolist() == [0, 1, 2, 4, 7, 8, 0b110101011]
    grid2 = torch.tensor([[1, 0], [0, 1], [1, 1], [2, 0], [0, 2]])
    assert morton_keys(grid2).tolist() == [1, 2, 3, 4, 8]


def test_morton_uses_all_bits():
    top3 = (1 << 21) - 1
    assert morton_keys(torch.tensor([[top3, top3, top3]])).item() == (1 << 63) - 1
    top2 = (1 << 31) - 1
    assert morton_keys(torch.tensor([[top2, top2]])).item() == (1 << 62) - 1


@pytest.mark.parametrize(("dim", "bits"), [(2, 1), (2, 2), (2, 4), (3, 1), (3, 2), (3, 3)])
def test_hilbert_is_a_continuous_bijection(dim, bits):
    grid = _full_grid(dim, bits)
    keys = hilbert_keys(grid, bits)
    # a bijection onto 0 .. 2^(dim*bits) - 1 ...
    assert torch.equal(torch.sort(keys).values, torch.arange(grid.shape[0]))
    # ... whose consecutive cells are face neighbours (unit step along one axis)
    path = grid[torch.argsort(keys)]
    steps = (path[1:] - path[:-1]).abs()
    assert bool((steps.sum(dim=1) == 1).all())
    # and it starts at the origin
    assert path[0].tolist() == [0] * dim


def test_hilbert_exact_2d_order_1_and_2():
    grid = _full_grid(2, 1)
    path = grid[torch.argsort(hilbert_keys(grid, 1))].tolist()
    assert path == [[0, 0], [0, 1], [1, 1], [1, 0]]
    grid = _full_grid(2, 2)
    path = grid[torch.argsort(hilbert_keys(grid, 2))]
    assert path[-1].tolist() == [3, 0]  # ends at the far corner of the starting edge


@pytest.mark.parametrize("dim", [2, 3])
def test_hilbert_keys_fit_int64_at_default_bits(dim):
    bits = DEFAULT_BITS[dim]
    grid = torch.randint(0, 1 << bits, (1000, dim), generator=torch.Generator().manual_seed(0))
    grid[0] = (1 << bits) - 1
    keys = hilbert_keys(grid, bits)
    assert bool((keys >= 0).all())  # 63 (3-D) or 62 (2-D) bits: never the int64 sign bit
    if dim == 2:
        assert bool((keys < (1 << 62)).all())
    assert keys.unique().numel() == grid.unique(dim=0).shape[0]


def test_quantize_spans_the_grid_on_a_cube():
    pts = torch.tensor([[0.0, 0.0, 0.0], [2.0, 1.0, 0.5], [1.0, 0.5, 0.25]], dtype=torch.float64)
    grid = quantize(pts, 21)
    top = (1 << 21) - 1
    assert grid[0].tolist() == [0, 0, 0]
    assert grid[1].tolist() == [top, top // 2, top // 4]  # one scale for every axis
    assert quantize(torch.ones(5, 3), 21).tolist() == [[0, 0, 0]] * 5
    assert quantize(torch.zeros(0, 2), 31).shape == (0, 2)


def test_hilbert_blocks_give_the_same_keys():
    grid = torch.randint(0, 1 << 21, (1000, 3), generator=torch.Generator().manual_seed(1))
    assert torch.equal(hilbert_keys(grid, 21, chunk=97), hilbert_keys(grid, 21))
