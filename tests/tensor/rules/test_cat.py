"""Concatenation along the sharded dim (meshshard/tensor/_rules/_cat.py) vs single-process torch, world sizes 1-4."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import meshshard as ms
from meshshard.testing import run_distributed

from .._serial import check, raises_everywhere, run_cases

N, M, C = 13, 7, 3


def _x(*shape, seed=4):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


CASES = {
    "cat_two": lambda S, P: torch.cat([S(_x(N, C)), S(_x(M, C, seed=5))], 0),
    "cat_three_batched": lambda S, P: torch.cat([S(_x(2, N, C), 1), S(_x(2, M, C, seed=5), 1),
                                                 S(_x(2, 3, C, seed=6), 1)], dim=1),
    "cat_with_one_row": lambda S, P: torch.cat([S(_x(1, C)), S(_x(M, C, seed=5)), S(_x(N, C))], 0),
    "cat_promotes": lambda S, P: torch.cat([S(torch.arange(N * C).reshape(N, C)), S(_x(M, C))], 0),
    "split_then_cat": lambda S, P: torch.cat(S(_x(N, C)).split(4), 0),
    "slices_then_cat_swapped": lambda S, P: (lambda x: torch.cat([x[5:], x[:5]], 0))(S(_x(N, C))),
    "concat_neg_dim": lambda S, P: torch.concat([S(_x(C, N), 1), S(_x(C, M, seed=5), 1)], -1),
    "hstack_1d": lambda S, P: torch.hstack([S(_x(N)), S(_x(M, seed=5))]),
    "vstack": lambda S, P: torch.vstack([S(_x(N, C)), S(_x(M, C, seed=5))]),
    "stack_then_flatten": lambda S, P: torch.stack([S(_x(N, C)), S(_x(N, C, seed=5))], 1).flatten(0, 1),
}


def _run(names):
    return run_cases(CASES, names)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_cat_along_points_matches_single_process(world_size):
    res = check(run_distributed(_run, world_size, sorted(CASES), timeout=600))
    assert res["split_then_cat"][2] == {}  # nothing moves
    if world_size > 1:
        assert res["cat_two"][2] == {"all_to_all": 1}, res["cat_two"]
        assert res["cat_two"][3] == {"all_to_all": 1, "all_reduce": 1}, res["cat_two"]


def _sharding(world):
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    a = ms.ShardTensor.from_local(torch.zeros(rank + 1, 2), mesh, sizes=[r + 1 for r in range(world)])
    b = ms.ShardTensor.from_local(torch.zeros(2, 2), mesh, sizes=[2] * world)
    return torch.cat([a, b]).sharding_sizes


def test_result_sizes_add_up_rank_by_rank():
    assert run_distributed(_sharding, 3, 3) == [(3, 4, 5)] * 3


def _bad(kind):
    mesh = ms.init_mesh()
    x = ms.ShardTensor.from_local(torch.zeros(2, 3), mesh, sizes=[2] * dist.get_world_size())
    if kind == "plain":
        return raises_everywhere(torch.cat, [x, torch.zeros(2, 3)], 0)
    return raises_everywhere(torch.cat, [x, ms.ShardTensor.from_local(torch.zeros(2, 4), mesh,
                                                                      sizes=[2] * dist.get_world_size())], 0)


@pytest.mark.parametrize("kind,err", [("plain", "UnsupportedOpError"), ("shape", "RuntimeError")])
def test_bad_cat_raises_on_every_rank(kind, err):
    assert run_distributed(_bad, 2, kind) == [err, err]
