"""The kernels' interface: every backend decides the closed ball exactly, with one float64 formula."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshshard.kernels import (
    _grid_knn_bound,
    _points_near_boxes_torch,
    knn_bound,
    points_near_boxes,
    points_within,
    radius_pairs,
)
from tests.kernels._helpers import OWN_BACKENDS, grid_cloud


def test_grid_knn_bound_equals_brute_force():
    g = torch.Generator().manual_seed(5)
    pts = torch.rand(600, 3, generator=g)
    pts[:200, 2] = 0.0  # a flat patch: the density estimate is off, the radius doubles
    q = torch.rand(90, 3, generator=g) * 1.5
    for k in (1, 7, 50):
        assert torch.equal(_grid_knn_bound(pts, q, k), knn_bound(pts, q, k, backend="grid"))


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(1, 80),
    m=st.integers(1, 30),
    seed=st.integers(0, 10_000),
    dim=st.sampled_from([2, 3]),
)
def test_points_within_matches_brute_force(n, m, seed, dim):
    pts, q = grid_cloud(n, seed, dim=dim, span=6), grid_cloud(m, seed + 1, dim=dim, span=6)
    g = torch.Generator().manual_seed(seed)
    r2 = (torch.randint(0, 5, (m,), generator=g).double() * 0.25) ** 2  # radii on the lattice: exact ties
    d2 = ((q[:, None, :].double() - pts[None, :, :].double()) ** 2).sum(-1)
    want = (d2 <= r2[:, None]).any(0)
    for backend in OWN_BACKENDS:
        assert torch.equal(points_within(pts, q, r2, backend=backend), want), backend
        assert torch.equal(points_within(pts, q, 0.5**2, backend=backend), (d2 <= 0.25).any(0)), backend


def test_radius_pairs_per_query_radii():
    pts = torch.tensor([[0.0], [1.0], [2.0]])
    q = torch.tensor([[0.0], [2.0]])
    qi, pj, d2 = radius_pairs(pts, q, torch.tensor([1.0, 0.0], dtype=torch.float64), backend="grid")
    assert sorted(zip(qi.tolist(), pj.tolist())) == [(0, 0), (0, 1), (1, 2)]


def test_points_near_boxes_numba_equals_torch_on_exact_ties():
    g = torch.Generator().manual_seed(0)
    for dim in (1, 2, 3):
        pts = torch.randint(-4, 9, (500, dim), generator=g).double() * 0.25
        corners = torch.randint(0, 5, (2, 6, dim), generator=g).double() * 0.25
        lo, hi = corners.min(0).values, corners.max(0).values
        r2 = (torch.randint(0, 4, (6,), generator=g).double() * 0.25) ** 2  # lattice radii: boundary ties
        got = points_near_boxes(pts, lo, hi, r2)
        assert got.shape == (6, 500) and got.any() and not got.all()
        assert torch.equal(got, _points_near_boxes_torch(pts, lo, hi, r2))
