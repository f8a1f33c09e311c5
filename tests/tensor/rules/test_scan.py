"""Scans along the sharded dim (meshshard/tensor/_rules/_scan.py) vs single-process torch, world sizes 1-4."""

from __future__ import annotations

import math

import pytest
import torch

import meshshard as ms
from meshshard.testing import run_distributed

from .._serial import check, raises_everywhere, run_cases

N, C = 11, 3


def _x(*shape, seed=4):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _ties(*shape):
    """Few distinct values: ties everywhere (cummax's latest-index rule)."""
    return torch.randint(0, 3, shape, generator=torch.Generator().manual_seed(2)).to(torch.float64)


def _with(t, value, every=4):
    t = t.clone()
    t.view(-1)[::every] = value
    return t


CASES = {
    "cumsum": lambda S, P: torch.cumsum(S(_x(N, C)), 0),
    "cumsum_method_neg_dim": lambda S, P: S(_x(C, N), 1).cumsum(-1),
    "cumsum_batched": lambda S, P: torch.cumsum(S(_x(2, N, C), 1), dim=1),
    "cumsum_int": lambda S, P: torch.cumsum(S(torch.arange(N * C).reshape(N, C) % 5), 0),
    "cumsum_dtype": lambda S, P: torch.cumsum(S(torch.arange(N) % 3 == 0), 0, dtype=torch.float64),
    "cumsum_other_dim": lambda S, P: torch.cumsum(S(_x(N, C)), 1),
    "cumprod": lambda S, P: torch.cumprod(S(_x(N, C) * 0.5 + 1), 0),
    "cumprod_zeros": lambda S, P: torch.cumprod(S(_with(_x(N, C), 0.0, 5)), 0),
    "cummax": lambda S, P: torch.cummax(S(_x(N, C)), 0),
    "cummin_ties": lambda S, P: torch.cummin(S(_ties(N, C)), 0),
    "cummax_ties": lambda S, P: S(_ties(C, N), 1).cummax(1),
    "cummax_nan": lambda S, P: torch.cummax(S(_with(_x(N, C), math.nan, 7)), 0),
    "cummin_int": lambda S, P: torch.cummin(S(torch.arange(N * 2).reshape(N, 2) * 7 % 5), 0),
    "logcumsumexp": lambda S, P: torch.logcumsumexp(S(_x(N, C)), 0),
    "logcumsumexp_neg_inf": lambda S, P: torch.logcumsumexp(S(_with(_x(N, C), -math.inf, 2)), 0),
    "logcumsumexp_all_neg_inf_head": lambda S, P: torch.logcumsumexp(
        S(torch.cat([torch.full((N // 2, C), -math.inf, dtype=torch.float64), _x(N - N // 2, C)])), 0),
}


def _run(names):
    return run_cases(CASES, names)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_scans_match_single_process(world_size):
    res = check(run_distributed(_run, world_size, sorted(CASES), timeout=600))
    if world_size > 1:
        assert res["cumsum"][2] == {"all_to_all": 1}, res["cumsum"]
        assert res["cummax"][2] == {"all_to_all": 1, "all_gather": 1}, res["cummax"]
        assert res["cumsum_other_dim"][2] == {}


def _bad(kind):
    mesh = ms.init_mesh()
    x = ms.ShardTensor.from_local(torch.arange(2), mesh, sizes=[2] * torch.distributed.get_world_size())
    if kind == "int_logcumsumexp":
        return raises_everywhere(torch.logcumsumexp, x, 0)
    return raises_everywhere(torch.cumsum, x, 3)


@pytest.mark.parametrize("kind,err", [("int_logcumsumexp", "NotImplementedError"), ("bad_dim", "IndexError")])
def test_bad_scans_raise_on_every_rank(kind, err):
    assert run_distributed(_bad, 2, kind) == [err, err]  # torch's own error for an integer logcumsumexp
