"""quality() and ghost_counts(): exact ghost counts (checked against all pairs), balance, estimates, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.spatial import cKDTree

from meshshard.partition import Partition, neighbor_radius, partition, quality, surface_to_volume_estimate
from meshshard.partition._quality import ghost_counts


def _brute_ghosts(points: np.ndarray, owner: np.ndarray, num_parts: int, radius: float):
    """Ghosts of every part from all pairs within radius (closed ball)."""
    pairs = cKDTree(points).query_pairs(radius * (1 + 1e-12), output_type="ndarray")
    d = np.linalg.norm(points[pairs[:, 0]] - points[pairs[:, 1]], axis=1)
    pairs = pairs[d <= radius]
    part = np.concatenate([owner[pairs[:, 0]], owner[pairs[:, 1]]])
    other = np.concatenate([pairs[:, 1], pairs[:, 0]])
    keep = part != owner[other]
    keys = np.unique(part[keep] * len(points) + other[keep])
    ghost_part, ghost = keys // len(points), keys % len(points)
    ghosts = np.bincount(ghost_part, minlength=num_parts)
    neighbors = [len(np.unique(owner[ghost[ghost_part == r]])) for r in range(num_parts)]
    sent = np.bincount(owner[ghost], minlength=num_parts)
    return ghosts, np.array(neighbors), sent


def test_tiny_exact():
    pts = torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [10.0, 0.0]])
    part = Partition.from_owner(torch.tensor([0, 0, 1, 1, 2]), 3)
    q = quality(pts, part, radius=1.0)  # closed ball: distance exactly 1 counts
    assert q["ghosts"].tolist() == [1, 1, 0]
    assert q["neighbor_parts"].tolist() == [1, 1, 0]
    assert q["ghost_fraction"] == pytest.approx(2 / 5)
    assert q["max_ghost_fraction"] == pytest.approx(0.5)
    assert q["max_neighbor_parts"] == 1
    assert q["imbalance"] == pytest.approx(2 / (5 / 3))
    assert q["sizes"] == [2, 2, 1] and q["radius"] == 1.0
    assert quality(pts, part, radius=0.999)["ghosts"].tolist() == [0, 0, 0]


@pytest.mark.parametrize("method", ["rcb", "morton", "hilbert"])
@pytest.mark.parametrize("dim", [2, 3])
def test_ghosts_match_all_pairs(method, dim):
    pts = torch.rand(3000, dim, generator=torch.Generator().manual_seed(dim), dtype=torch.float64)
    pts[:50] = pts[50]  # duplicates across parts
    part = partition(pts, 7, method=method)
    radius = 0.08 if dim == 3 else 0.03
    q = quality(pts, part, radius=radius)
    ghosts, neighbors, sent = _brute_ghosts(pts.numpy(), part.owner.numpy(), 7, radius)
    assert q["ghosts"].tolist() == ghosts.tolist()
    assert [t.tolist() for t in ghost_counts(pts, part, radius)] == [ghosts.tolist(), neighbors.tolist(), sent.tolist()]
    assert q["neighbor_parts"].tolist() == neighbors.tolist()
    assert q["ghost_fraction"] == pytest.approx(ghosts.sum() / 3000)


def test_without_radius_ghost_entries_are_none():
    pts = torch.rand(100, 3, generator=torch.Generator().manual_seed(0))
    q = quality(pts, partition(pts, 4))
    assert q["imbalance"] == 1.0 and q["ghosts"] is None and q["ghost_fraction"] is None
    assert q["num_parts"] == 4 and q["num_points"] == 100 and q["load"].tolist() == [25.0] * 4


def test_imbalance_uses_fractions_and_weights():
    pts = torch.rand(400, 3, generator=torch.Generator().manual_seed(1))
    part = partition(pts, 2, fractions=[0.25, 0.75])
    assert quality(pts, part)["imbalance"] == pytest.approx(1.0)
    even = Partition(perm=part.perm, sizes=part.sizes)  # no fractions: judged against 1/P
    assert quality(pts, even)["imbalance"] == pytest.approx(1.5)
    w = torch.ones(400)
    w[part.owner == 0] = 3.0
    assert quality(pts, part, weights=w)["imbalance"] == pytest.approx(300 / (600 * 0.25))
    zero = Partition.from_owner(torch.zeros(4, dtype=torch.long), 2, params={"fractions": [0.0, 1.0]})
    assert math.isinf(quality(torch.rand(4, 2), zero)["imbalance"])


def test_one_part_and_empty_parts():
    pts = torch.rand(10, 3, generator=torch.Generator().manual_seed(2))
    q = quality(pts, partition(pts, 1), radius=0.5)
    assert q["ghosts"].tolist() == [0] and q["ghost_fraction"] == 0.0
    q = quality(pts[:3], partition(pts[:3], 5), radius=10.0)
    assert q["ghosts"].tolist().count(2) == 3 and q["max_ghost_fraction"] == 2.0


def test_surface_to_volume_estimate_formula():
    cube = torch.tensor([[0.0, 0.0, 0.0], [2.0, 2.0, 2.0]])
    # 6 (P^(1/3) - 1) * 0.85 r / L with L = 2
    assert surface_to_volume_estimate(cube, 64, 0.1) == pytest.approx(6 * 3 * 0.85 * 0.1 / 2)
    square = torch.tensor([[0.0, 0.0, 5.0], [1.0, 4.0, 5.0]])  # flat: 2-D form, side sqrt(4)
    assert surface_to_volume_estimate(square, 16, 0.1) == pytest.approx(4 * 3 * 0.85 * 0.1 / 2)
    assert surface_to_volume_estimate(cube, 1, 0.1) == 0.0


def test_uniform_cube_ghost_fraction_near_estimate():
    pts = torch.rand(20000, 3, generator=torch.Generator().manual_seed(3))
    radius = neighbor_radius(pts, 32)
    q = quality(pts, partition(pts, 8), radius=radius)
    assert q["ghost_fraction"] == pytest.approx(q["surface_to_volume_estimate"], rel=0.3)


def test_neighbor_radius_holds_about_k():
    pts = np.random.default_rng(4).random((5000, 3))
    r = neighbor_radius(pts, 16)
    counts = np.array([len(c) - 1 for c in cKDTree(pts).query_ball_point(pts[::50], r)])
    assert 10 <= np.median(counts) <= 20
    with pytest.raises(ValueError, match=r"more than num_neighbors = 16 points \(got 5\)"):
        neighbor_radius(pts[:5], 16)


def test_bad_arguments():
    pts = torch.rand(10, 3)
    part = partition(pts, 2)
    with pytest.raises(ValueError, match=r"radius must be positive and finite \(got -1.0\)"):
        quality(pts, part, radius=-1.0)
    with pytest.raises(TypeError, match=r"radius must be a real number \(got str\)"):
        quality(pts, part, radius="1")
    with pytest.raises(TypeError, match=r"part must be a Partition \(got dict\)"):
        quality(pts, {}, radius=1.0)
    with pytest.raises(ValueError, match=r"points must have part.num_points = 10 rows \(got 9\)"):
        quality(pts[:9], part)
    with pytest.raises(ValueError, match=r"weights must have shape \(10,\)"):
        quality(pts, part, weights=torch.ones(3))
