"""Invariant checks shared by the partition tests."""

from __future__ import annotations

import torch

from meshshard.partition import Partition


def check_invariants(points: torch.Tensor, part: Partition, fractions: list[float] | None = None) -> None:
    """Every invariant a partition of ``points`` must satisfy (unweighted balance included)."""
    n, p = points.shape[0], part.num_parts
    assert part.num_points == n
    assert part.perm.dtype == part.sizes.dtype == part.owner.dtype == part.offsets.dtype == torch.long
    assert part.perm.device == points.device
    # perm is a permutation; sizes sum to N; offsets derive from sizes
    assert torch.equal(torch.sort(part.perm).values, torch.arange(n))
    assert int(part.sizes.sum()) == n and bool((part.sizes >= 0).all())
    assert torch.equal(part.offsets, torch.cat([torch.zeros(1, dtype=torch.long), part.sizes.cumsum(0)]))
    # every point has exactly one owner, consistent with the shards
    counts = torch.zeros(n, dtype=torch.long)
    for r in range(p):
        idx = part.shard_indices(r)
        counts[idx] += 1
        assert bool((part.owner[idx] == r).all())
        # within a part, points keep their original order
        assert bool((idx[1:] > idx[:-1]).all())
    assert bool((counts == 1).all())
    # balance: every part within one point of its target
    share = torch.full((p,), 1.0 / p, dtype=torch.float64) if fractions is None else torch.tensor(fractions)
    assert float((part.sizes.double() - n * share).abs().max()) <= 1.0 + 1e-9
    # boxes are the tight bounds of each part's points; points lie in their closed region
    assert part.boxes is not None and part.regions is not None
    for r in range(p):
        mine = points[part.shard_indices(r)]
        if mine.shape[0] == 0:
            assert bool((part.boxes[r, 0] == torch.inf).all()) and bool((part.boxes[r, 1] == -torch.inf).all())
        else:
            assert torch.equal(part.boxes[r, 0], mine.amin(0)) and torch.equal(part.boxes[r, 1], mine.amax(0))
    region = part.regions[part.owner]
    assert bool(((points >= region[:, 0]) & (points <= region[:, 1])).all())
