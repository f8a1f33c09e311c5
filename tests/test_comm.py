"""meshshard.comm's small non-differentiable collectives: results on every rank and their counts."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from meshshard import comm
from meshshard.testing import run_distributed


def _small_collectives(world_size: int) -> dict:
    rank = dist.get_rank() if dist.is_initialized() else 0
    with comm.CommCounter() as cc:
        low = comm.all_reduce_min(torch.tensor([rank + 1, 10 - rank], dtype=torch.int32))
        objects = comm.all_gather_object({"rank": rank, "name": "r" * (rank + 1)})
        comm.barrier()
    return {"min": low.tolist(), "objects": objects, "counts": dict(cc.counts)}


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_all_reduce_min_all_gather_object_and_barrier(world_size):
    out = run_distributed(_small_collectives, world_size, world_size)
    expected_objects = [{"rank": r, "name": "r" * (r + 1)} for r in range(world_size)]
    expected_counts = {} if world_size == 1 else {"all_reduce": 1, "all_gather_object": 1, "barrier": 1}
    for got in out:
        assert got["min"] == [1, 10 - (world_size - 1)]
        assert got["objects"] == expected_objects
        assert got["counts"] == expected_counts


def test_one_rank_without_a_process_group_is_the_identity():
    assert comm.all_reduce_min(torch.tensor([3.0])).tolist() == [3.0]
    assert comm.all_gather_object("x") == ["x"]
    comm.barrier()


def _agreement(world_size: int) -> dict:
    from meshshard.errors import ShardingError

    rank = dist.get_rank() if dist.is_initialized() else 0
    out = {}
    with comm.CommCounter() as cc:
        quiet = comm.agree(None, payload=[rank, 7])
    out["quiet"] = (quiet.errors, quiet.payloads.tolist(), quiet.failed, dict(cc.counts))
    mine = f"bad thing {rank}" if rank % 2 == 1 else None
    found = comm.agree(mine)
    out["found"] = (found.errors, found.failed, found.first_error())
    try:
        comm.agree(mine, error_type=ShardingError, what="my check")
        out["raised"] = None
    except ShardingError as exc:
        out["raised"] = str(exc)
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_agree_shares_every_verdict_and_raises_the_same_error_on_every_rank(world_size):
    results = run_distributed(_agreement, world_size, world_size)
    odd = [r for r in range(world_size) if r % 2 == 1]
    errors = tuple(f"bad thing {r}" if r in odd else None for r in range(world_size))
    for rank, out in enumerate(results):
        assert out["quiet"][0] == (None,) * world_size
        assert out["quiet"][1] == [[r, 7] for r in range(world_size)]
        assert out["quiet"][2] == ()
        assert out["quiet"][3] == ({} if world_size == 1 else {"all_gather": 1})
        assert out["found"] == (errors, tuple(odd), "[rank 1] bad thing 1" if odd else None)
        if odd:
            found = "; ".join(f"rank {r}: bad thing {r}" for r in odd)
            assert out["raised"] == f"[rank {rank}] my check on rank(s) {odd}: {found}"
        else:
            assert out["raised"] is None
