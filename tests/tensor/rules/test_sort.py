"""Sorting and selection along the sharded dim (meshshard/tensor/_rules/_sort.py) vs single-process torch."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

import meshshard as ms
from meshshard.testing import run_distributed

from .._serial import check, raises_everywhere, run_cases, split

N, C = 13, 3


def _x(*shape, seed=4):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _ties(*shape):
    return torch.randint(0, 3, shape, generator=torch.Generator().manual_seed(2)).to(torch.float64)


def _with(t, value, every=4, start=0):
    t = t.clone()
    t.view(-1)[start::every] = value
    return t


def _q(*values):
    return torch.tensor(values, dtype=torch.float64)


_SPECIAL = _with(_with(_ties(N, C), math.nan, 5), -0.0, 7, 1)

CASES = {
    "sort": lambda S, P: torch.sort(S(_x(N, C)), 0),
    "sort_descending": lambda S, P: S(_x(N, C)).sort(dim=0, descending=True),
    "sort_batched": lambda S, P: torch.sort(S(_x(2, N, C), 1), dim=1),
    "sort_ties_stable": lambda S, P: torch.sort(S(_ties(N, C)), dim=0, stable=True),
    "sort_ties_descending_stable": lambda S, P: torch.sort(S(_ties(N, C)), dim=0, descending=True, stable=True),
    "sort_nan_negzero_stable": lambda S, P: torch.sort(S(_SPECIAL), dim=0, stable=True),
    "sort_nan_descending_stable": lambda S, P: torch.sort(S(_SPECIAL), dim=0, stable=True, descending=True),
    "sort_int": lambda S, P: torch.sort(S(torch.arange(N * 2).reshape(N, 2) * 7 % 11), dim=0, stable=True),
    "sort_bool": lambda S, P: torch.sort(S(torch.arange(N) % 3 == 0), dim=0, stable=True),
    "sort_1d": lambda S, P: torch.sort(S(_x(N)), -1),
    "sort_other_dim": lambda S, P: torch.sort(S(_x(N, C)), 1),
    "argsort": lambda S, P: torch.argsort(S(_x(N, C)), 0),
    "argsort_ties_stable": lambda S, P: S(_ties(C, N), 1).argsort(dim=1, stable=True, descending=True),
    "msort": lambda S, P: torch.msort(S(_x(N, C))),
    "topk": lambda S, P: torch.topk(S(_x(N, C)), 4, 0),
    "topk_smallest": lambda S, P: S(_x(N, C)).topk(5, dim=0, largest=False),
    "topk_all": lambda S, P: torch.topk(S(_x(N)), N),
    "topk_nan": lambda S, P: torch.topk(S(_with(_x(N, C), math.nan, 17)), 3, 0),  # one NaN per column
    "topk_batched": lambda S, P: torch.topk(S(_x(2, N, C), 1), 2, 1),
    "kthvalue": lambda S, P: torch.kthvalue(S(_x(N, C)), 4, 0),
    "kthvalue_last_keepdim": lambda S, P: S(_x(N, C)).kthvalue(N, 0, keepdim=True),
    "kthvalue_first_batched": lambda S, P: torch.kthvalue(S(_x(2, N), 1), 1, 1),
    "median_dim": lambda S, P: torch.median(S(_x(N, C)), 0),
    "median_nan": lambda S, P: torch.median(S(_with(_x(N, C), math.nan, 7)), 0, keepdim=True),
    "median_all": lambda S, P: torch.median(S(_x(N, C))),
    "median_all_nan": lambda S, P: S(_with(_x(N, C), math.nan, 11)).median(),
    "nanmedian": lambda S, P: torch.nanmedian(S(_with(_x(N, C), math.nan, 4)), 0),
    "nanmedian_all": lambda S, P: torch.nanmedian(S(_with(_x(N, C), math.nan, 4))),
    # an all-NaN column: torch returns an implementation-defined index (and sends the gradient there)
    "nanmedian_all_nan_column": lambda S, P: torch.nanmedian(
        S(torch.cat([_x(N, 2), torch.full((N, 1), math.nan, dtype=torch.float64)], 1)), 0).values.detach(),
    "median_all_ties": lambda S, P: torch.median(S(_ties(N, C))),
    "quantile": lambda S, P: torch.quantile(S(_x(N, C)), 0.3, dim=0),
    "quantile_q_tensor": lambda S, P: torch.quantile(S(_x(N, C)), _q(0.0, 0.25, 0.5, 0.9, 1.0), dim=0),
    "quantile_lower": lambda S, P: torch.quantile(S(_x(N, C)), _q(0.2, 0.7), 0, interpolation="lower"),
    "quantile_higher": lambda S, P: torch.quantile(S(_x(N, C)), _q(0.2, 0.7), 0, interpolation="higher"),
    "quantile_midpoint": lambda S, P: torch.quantile(S(_x(N, C)), _q(0.2, 0.7), 0, True, interpolation="midpoint"),
    "quantile_nearest": lambda S, P: torch.quantile(S(_x(N, C)), _q(0.125, 0.375, 0.5), 0,
                                                    interpolation="nearest"),
    "quantile_all": lambda S, P: torch.quantile(S(_x(N, C)), _q(0.1, 0.5)),
    "quantile_all_keepdim": lambda S, P: S(_x(N, C)).quantile(0.6, keepdim=True),
    "quantile_nan": lambda S, P: torch.quantile(S(_with(_x(N, C), math.nan, 7)), 0.5, 0),
    "nanquantile": lambda S, P: torch.nanquantile(S(_with(_x(N, C), math.nan, 4)), _q(0.3, 0.8), 0),
    "quantile_other_dim": lambda S, P: torch.quantile(S(_x(N, C)), _q(0.3, 0.8), 1),
}


def _run(names):
    return run_cases(CASES, names)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_sorting_and_selection_match_single_process(world_size):
    res = check(run_distributed(_run, world_size, sorted(CASES), timeout=900))
    if world_size > 1:
        assert res["argsort"][2] == {"all_gather": 2, "all_to_all": 4}, res["argsort"]
        assert res["topk"][2] == {"all_to_all": 2}, res["topk"]
        assert res["sort_other_dim"][2] == {}


def _topk_ties(world):
    """topk over tied values: torch picks an implementation-defined index among equals; ours is the
    stable order (ties by global index), and the values agree."""
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    g = _ties(N, C)
    sizes = split(N, world)
    off = sum(sizes[:rank])
    x = ms.ShardTensor.from_local(g[off : off + sizes[rank]], mesh, sizes=sizes)
    got = torch.topk(x, 5, 0)
    ref = torch.sort(g, dim=0, descending=True, stable=True)
    return (torch.equal(got.values.to_plain(), torch.topk(g, 5, 0).values)
            and torch.equal(got.indices.to_plain(), ref.indices[:5]))


@pytest.mark.parametrize("world_size", [2, 4])
def test_topk_ties_follow_the_stable_order(world_size):
    assert all(run_distributed(_topk_ties, world_size, world_size))


def _bad(kind):
    mesh = ms.init_mesh()
    x = ms.ShardTensor.from_local(torch.arange(2.0), mesh, sizes=[2] * dist.get_world_size())
    if kind == "k":
        return raises_everywhere(torch.kthvalue, x, 5, 0)
    if kind == "topk":
        return raises_everywhere(torch.topk, x, 5, 0)
    if kind == "q":
        return raises_everywhere(torch.quantile, x, 1.5)
    return raises_everywhere(torch.sort, x.to(torch.complex64), 0)


@pytest.mark.parametrize("kind,err", [("k", "IndexError"), ("topk", "RuntimeError"), ("q", "RuntimeError"),
                                      ("complex", "UnsupportedOpError")])
def test_bad_selection_raises_on_every_rank(kind, err):
    assert run_distributed(_bad, 2, kind) == [err, err]
