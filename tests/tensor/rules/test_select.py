"""Selection and counting with sharded inputs (meshshard/tensor/_rules/_select.py) vs single process, world 1-4."""

from __future__ import annotations

import math

import pytest
import torch

import meshshard as ms
from meshshard.testing import run_distributed

from .._serial import check, raises_everywhere, run_cases

N = 13


def _ints(*shape, high=5, seed=3):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def _x(*shape, seed=4):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _runs(n):
    """Long runs of equal values: runs straddle every cut."""
    return torch.arange(n) // 4 % 3


def _sorted(n, seed=5):
    return torch.sort(_x(n, seed=seed)).values


CASES = {
    "unique": lambda S, P: torch.unique(S(_ints(N))),
    "unique_all": lambda S, P: torch.unique(S(_ints(N)), return_inverse=True, return_counts=True),
    "unique_2d_flat": lambda S, P: torch.unique(S(_ints(N, 2)), return_inverse=True, return_counts=True),
    "unique_2d_flat_dim1": lambda S, P: torch.unique(S(_ints(3, N), 1), return_inverse=True, return_counts=True),
    "unique_dim_rows": lambda S, P: torch.unique(S(_ints(N, 2, high=2)), dim=0, return_inverse=True,
                                                 return_counts=True),
    "unique_other_dim": lambda S, P: torch.unique(S(_ints(N, 4, high=2)), dim=1, return_inverse=True),
    "unique_float_nan": lambda S, P: torch.unique(S(torch.tensor([1.0, math.nan, 2.0, 1.0] * 3), grad=False),
                                                  return_counts=True),
    "unique_bool": lambda S, P: S(_ints(N) > 2).unique(return_counts=True),
    "unique_consecutive": lambda S, P: torch.unique_consecutive(S(_runs(N)), return_inverse=True,
                                                                return_counts=True),
    "unique_consecutive_dim": lambda S, P: torch.unique_consecutive(
        S(torch.stack([_runs(N), _runs(N) // 2], 1)), dim=0, return_inverse=True, return_counts=True),
    "searchsorted_values": lambda S, P: torch.searchsorted(_sorted(6), S(_x(N, 2))),
    "searchsorted_right": lambda S, P: torch.searchsorted(_sorted(6), S(_x(N)), right=True, out_int32=True),
    "searchsorted_rows": lambda S, P: torch.searchsorted(torch.sort(_x(3, 6)).values, S(_x(3, N), 1)),
    "searchsorted_sharded_seq": lambda S, P: torch.searchsorted(S(_sorted(N)), _x(7)),
    "searchsorted_both_sharded": lambda S, P: torch.searchsorted(S(_sorted(N)), S(_x(N, seed=9)), side="right"),
    "searchsorted_seq_ties": lambda S, P: torch.searchsorted(S(torch.sort(_ints(N).double()).values),
                                                             torch.arange(6.0)),
    "searchsorted_batch": lambda S, P: torch.searchsorted(S(torch.sort(_x(N, 5)).values), S(_x(N, 3, seed=8))),
    "bucketize": lambda S, P: torch.bucketize(S(_x(N)), _sorted(5)),
    "bucketize_sharded_boundaries": lambda S, P: torch.bucketize(torch.arange(-2.0, 2.0, 0.25),
                                                                 S(_sorted(N)), right=True),
    "histc": lambda S, P: torch.histc(S(_x(N, 2), grad=False), bins=7),
    "histc_range": lambda S, P: torch.histc(S(_x(N), grad=False), bins=4, min=-1, max=1),
    "histc_constant": lambda S, P: torch.histc(S(torch.full((N,), 2.0, dtype=torch.float64), grad=False), bins=3),
    "histogram": lambda S, P: torch.histogram(S(_x(N), grad=False), bins=5),
    "histogram_weight_density": lambda S, P: torch.histogram(
        S(_x(N), grad=False), bins=4, weight=S(_x(N, seed=1).abs(), grad=False), density=True),
    "histogram_edges": lambda S, P: torch.histogram(S(_x(N), grad=False), torch.tensor([-1.0, 0.0, 0.5, 2.0],
                                                                           dtype=torch.float64)),
    "bincount": lambda S, P: torch.bincount(S(_ints(N))),
    "bincount_weights": lambda S, P: torch.bincount(S(_ints(N)), S(_x(N), grad=False), minlength=9),
}


def _run(names):
    return run_cases(CASES, names)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_selection_matches_single_process(world_size):
    res = check(run_distributed(_run, world_size, sorted(CASES), timeout=600))
    assert res["unique_all"][4] == "tuple"
    if world_size > 1:
        assert res["searchsorted_values"][2] == {}
        assert set(res["histc"][2]) == {"all_reduce"}


def _types(_):
    mesh = ms.init_mesh()
    world = torch.distributed.get_world_size()
    x = ms.ShardTensor.from_local(torch.arange(3) + 3 * torch.distributed.get_rank(), mesh, sizes=[3] * world)
    values, inverse, counts = torch.unique(x, return_inverse=True, return_counts=True)
    hist = torch.histc(x.double(), bins=3)
    return [type(values).__name__, type(inverse).__name__, inverse.sharding_sizes == x.sharding_sizes,
            type(counts).__name__, type(hist).__name__]


def test_result_types():
    got = run_distributed(_types, 2, None)
    assert got[0] == ["ReplicatedTensor", "ShardTensor", True, "ReplicatedTensor", "ReplicatedTensor"]
    assert got[0] == got[1]


def _bad(kind):
    mesh = ms.init_mesh()
    rank = torch.distributed.get_rank()
    x = ms.ShardTensor.from_local(torch.tensor([rank - 1, 2]), mesh, sizes=[2, 2])
    if kind == "negative_bincount":  # only rank 0 holds the negative value
        return raises_everywhere(torch.bincount, x)
    s = ms.ShardTensor.from_local(torch.tensor([0.0, 1.0]) + 2 * rank, mesh, sizes=[2, 2])
    return raises_everywhere(lambda: torch.searchsorted(s, torch.zeros(2), sorter=torch.arange(4)))


@pytest.mark.parametrize("kind,err", [("negative_bincount", "RuntimeError"), ("sorter", "UnsupportedOpError")])
def test_bad_input_raises_on_every_rank(kind, err):
    assert run_distributed(_bad, 2, kind) == [err, err]
