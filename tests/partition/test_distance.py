"""sq_dist: float64, coordinates summed in axis order, the same value for every grouping of the terms."""

from __future__ import annotations

import torch

from meshshard.partition._distance import sq_dist


def test_fixed_order_float64_and_broadcasting():
    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(50, 1, 3, generator=g), torch.rand(1, 40, 3, generator=g)
    d2 = sq_dist(a, b)
    assert d2.shape == (50, 40) and d2.dtype == torch.float64
    diff = a.double() - b.double()
    assert torch.equal(d2, (diff[..., 0] * diff[..., 0] + diff[..., 1] * diff[..., 1]) + diff[..., 2] * diff[..., 2])


def test_symmetric_bit_for_bit_and_exact_on_a_lattice():
    g = torch.Generator().manual_seed(1)
    a, b = torch.rand(200, 3, generator=g, dtype=torch.float64), torch.rand(200, 3, generator=g, dtype=torch.float64)
    assert torch.equal(sq_dist(a, b), sq_dist(b, a))
    assert sq_dist(torch.tensor([0.0, 0.0]), torch.tensor([0.25, 0.5])).item() == 0.3125
