"""Property tests (hypothesis) over random clouds, part counts, weights and fractions."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshshard.partition import partition

from ._helpers import check_invariants

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)


@st.composite
def clouds(draw):
    """Random clouds with duplicates, flat axes and clusters: integer grids scaled, N in 0..200."""
    n = draw(st.integers(0, 200))
    dim = draw(st.sampled_from([2, 3]))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    levels = draw(st.sampled_from([1, 3, 50, 10**6]))  # few levels: many ties and duplicates
    pts = rng.integers(0, levels, size=(n, dim)).astype(np.float64)
    pts *= rng.uniform(0.01, 100.0, size=dim)
    if n and draw(st.booleans()):
        pts[:, draw(st.integers(0, dim - 1))] = 0.0  # zero extent on one axis
    return torch.from_numpy(pts), seed


@SETTINGS
@given(clouds(), st.integers(1, 20), st.sampled_from(["rcb", "morton", "hilbert", "rcb-longest"]))
def test_invariants_hold(cloud, num_parts, method):
    pts, _ = cloud
    kwargs = {"method": "rcb", "axis_rule": "longest"} if method == "rcb-longest" else {"method": method}
    part = partition(pts, num_parts, **kwargs)
    check_invariants(pts, part)
    again = partition(pts, num_parts, **kwargs)
    assert torch.equal(again.perm, part.perm) and torch.equal(again.regions, part.regions)


@SETTINGS
@given(clouds(), st.integers(1, 12), st.sampled_from(["rcb", "morton", "hilbert"]))
def test_weighted_parts_within_one_point_weight_of_target(cloud, num_parts, method):
    pts, seed = cloud
    n = pts.shape[0]
    rng = np.random.default_rng(seed + 1)
    w = torch.from_numpy(rng.uniform(0.0, 5.0, size=n))
    if n == 0 or float(w.sum()) == 0.0:
        return
    part = partition(pts, num_parts, method=method, weights=w)
    load = torch.zeros(num_parts, dtype=torch.float64).index_add_(0, part.owner, w)
    target = w.sum() / num_parts
    assert float((load - target).abs().max()) <= float(w.max()) * (1 + 1e-9)
    region = part.regions[part.owner]
    assert bool(((pts >= region[:, 0]) & (pts <= region[:, 1])).all())


@SETTINGS
@given(clouds(), st.lists(st.integers(0, 10), min_size=1, max_size=10), st.sampled_from(["rcb", "hilbert"]))
def test_fractions_honoured(cloud, shares, method):
    pts, _ = cloud
    if sum(shares) == 0:
        shares = [1] * len(shares)
    fractions = [s / sum(shares) for s in shares]
    part = partition(pts, len(shares), method=method, fractions=fractions)
    check_invariants(pts, part, fractions)
