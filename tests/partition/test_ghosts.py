"""ghost_sets: the exact ghost sets, checked against all pairs (closed ball, one distance formula)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshshard.partition import Partition, partition
from meshshard.partition._ghosts import ghost_sets


def brute_force(points, owner, num_parts, radius, queries=None, query_owner=None):
    """Every part's ghosts from all pairs: float64 squared distances summed in axis order, ``<= r * r``."""
    p = np.asarray(points, dtype=np.float64)
    q, q_own = (p, np.asarray(owner)) if queries is None else (np.asarray(queries, np.float64), np.asarray(query_owner))
    diff = q[:, None, :] - p[None, :, :]
    sq = diff * diff
    d2 = sq[..., 0]
    for c in range(1, sq.shape[-1]):
        d2 = d2 + sq[..., c]
    near = d2 <= radius * radius  # (M, N)
    return [
        np.flatnonzero(near[q_own == r].any(0) & (np.asarray(owner) != r)).tolist() for r in range(num_parts)
    ]


def test_tiny_closed_ball():
    pts = torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [10.0, 0.0]])
    owner = torch.tensor([0, 0, 1, 1, 2])
    got = ghost_sets(pts, owner, 3, 1.0)  # distance exactly 1 counts
    assert [g.tolist() for g in got] == [[2], [1], []]
    assert all(g.dtype == torch.long for g in got)
    assert [g.tolist() for g in ghost_sets(pts, owner, 3, 0.999)] == [[], [], []]


def test_just_outside_the_ball_is_not_a_ghost():
    # scipy finds the point within its widened bound; the exact formula rejects it
    radius = 0.3
    pts = np.array([[0.0, 0.0, 0.0], [radius * (1 + 1e-12), 0.0, 0.0], [0.0, radius, 0.0]])
    owner = np.array([0, 1, 1])
    assert [g.tolist() for g in ghost_sets(pts, owner, 2, radius)] == brute_force(pts, owner, 2, radius)


@pytest.mark.parametrize("dim", [2, 3])
def test_random_cloud_with_duplicates_matches_all_pairs(dim):
    pts = torch.rand(1500, dim, generator=torch.Generator().manual_seed(dim), dtype=torch.float64)
    pts[:40] = pts[40]  # duplicates across parts
    part = partition(pts, 6)
    radius = 0.03 if dim == 2 else 0.08
    got = ghost_sets(pts, part.owner, 6, radius)
    assert [g.tolist() for g in got] == brute_force(pts, part.owner, 6, radius)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(0, 60),
    m=st.integers(0, 20),
    num_parts=st.integers(1, 4),
    radius=st.sampled_from([0.25, 0.5, 0.75]),
    seed=st.integers(0, 2**16),
    with_queries=st.booleans(),
)
def test_lattice_matches_all_pairs(n, m, num_parts, radius, seed, with_queries):
    # lattice points: many pairs exactly at the radius, decided like HaloPlan (closed ball)
    g = torch.Generator().manual_seed(seed)
    pts = torch.randint(0, 6, (n, 3), generator=g).float() * 0.25
    owner = torch.randint(0, num_parts, (n,), generator=g)
    queries = torch.randint(0, 6, (m, 3), generator=g).float() * 0.25 if with_queries else None
    query_owner = torch.randint(0, num_parts, (m,), generator=g) if with_queries else None
    got = ghost_sets(pts, owner, num_parts, radius, queries=queries, query_owner=query_owner)
    want = brute_force(pts, owner, num_parts, radius, queries, query_owner) if n else [[]] * num_parts
    assert [s.tolist() for s in got] == want


def test_numpy_input_and_empty_parts():
    pts = np.random.default_rng(0).random((30, 3)).astype(np.float32)
    part = Partition(perm=torch.arange(30), sizes=torch.tensor([10, 0, 20]))
    got = ghost_sets(pts, part.owner.numpy(), 3, 0.3)
    assert got[1].numel() == 0
    assert [g.tolist() for g in got] == brute_force(pts, part.owner.numpy(), 3, 0.3)


def test_queries_need_their_owner():
    with pytest.raises(ValueError, match="queries and query_owner must be given together"):
        ghost_sets(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), 1, 1.0, queries=torch.zeros(1, 3))
