"""``meshshard/testing``: the multi-process harness: results come back, failures fail fast with tracebacks, no hangs."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from meshshard.testing import DistributedError, run_distributed


def _rank_and_sum(offset):
    rank = dist.get_rank()
    t = torch.tensor([float(rank + offset)])
    dist.all_reduce(t)
    return rank, dist.get_world_size(), t.item()


def _raise_on_rank(bad_rank):
    if dist.get_rank() == bad_rank:
        raise ValueError(f"boom on rank {bad_rank}")
    t = torch.ones(1)
    dist.all_reduce(t)  # the healthy ranks wait here for the failed one
    return t.item()


def _skip_collective_on_rank(lazy_rank):
    if dist.get_rank() != lazy_rank:
        dist.all_reduce(torch.ones(1))
    return dist.get_rank()


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_results_from_every_rank(world_size):
    out = run_distributed(_rank_and_sum, world_size, 10)
    expected_sum = sum(r + 10 for r in range(world_size))
    assert out == [(r, world_size, float(expected_sum)) for r in range(world_size)]


@pytest.mark.timeout(120)  # "does not hang": pytest-timeout fails the test instead of a wall-clock assertion
def test_exception_on_one_rank_fails_with_its_traceback_and_does_not_hang():
    with pytest.raises(DistributedError) as info:
        run_distributed(_raise_on_rank, 3, 1)
    err = info.value
    assert 1 in [f.rank for f in err.failures]
    bad = next(f for f in err.failures if f.rank == 1)
    assert bad.kind == "exception"
    assert "ValueError: boom on rank 1" in bad.message
    assert "_raise_on_rank" in bad.traceback
    # the pool was rebuilt: the next call works
    assert [r for r, _, _ in run_distributed(_rank_and_sum, 3, 0)] == [0, 1, 2]


@pytest.mark.timeout(120)  # the 4 s collective timeout must end the call: a hang fails here, not a clock check
def test_rank_that_never_reaches_a_collective_fails_within_the_timeout():
    with pytest.raises(DistributedError) as info:
        run_distributed(_skip_collective_on_rank, 2, 1, timeout=4.0)
    failed = {f.rank for f in info.value.failures}
    assert failed == {0}
    assert run_distributed(_rank_and_sum, 2, 0, timeout=4.0)[1][2] == 1.0


def _pid() -> int:
    import os

    return os.getpid()


def test_pooled_ranks_stay_under_the_cap_least_recently_used_first(monkeypatch):
    """A new pool stops the least recently used ones first, so a long suite keeps a bounded number of ranks."""
    import meshshard.testing as mt

    monkeypatch.setenv("MESHSHARD_TEST_POOL_RANKS", "3")
    mt.shutdown_pools()
    one = run_distributed(_pid, 1)
    two = run_distributed(_pid, 2)
    assert run_distributed(_pid, 1) == one  # reused (1 + 2 ranks fit), and now the most recently used
    short = run_distributed(_pid, 1, timeout=20)  # a fault test's own pool: the 2-rank one, least recent, stops
    assert sorted(p.world_size for p in mt._POOLS.values()) == [1, 1]
    assert run_distributed(_pid, 1) == one
    assert run_distributed(_pid, 2) != two  # restarted: it makes room by stopping the short-timeout pool
    assert run_distributed(_pid, 1) == one and len(mt._POOLS) == 2
    assert run_distributed(_pid, 1, timeout=20) != short
    mt.shutdown_pools()
