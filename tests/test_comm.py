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
