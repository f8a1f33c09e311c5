"""Ops written as other ops, tril/triu/trace/prod (meshshard/tensor/_rules/_compose.py) and the extra pointwise
ops (_pointwise.py) vs single process, world sizes 1-4."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import meshshard as ms
from meshshard.testing import run_distributed

from .._serial import check, raises_everywhere, run_cases

N, C = 9, 3


def _x(*shape, seed=4):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _with_zeros(t):
    t = t.clone()
    t.view(-1)[::5] = 0.0
    return t


CASES = {
    "transpose_copy": lambda S, P: torch.transpose_copy(S(_x(N, C)), 0, 1),
    "unsqueeze_copy": lambda S, P: torch.unsqueeze_copy(S(_x(N, C)), 1),
    "unbind_copy_other_dim": lambda S, P: torch.unbind_copy(S(_x(N, C)), 1),
    "aminmax": lambda S, P: torch.aminmax(S(_x(N, C))),
    "aminmax_dim": lambda S, P: torch.aminmax(S(_x(N, C)), dim=0, keepdim=True),
    "std_mean": lambda S, P: torch.std_mean(S(_x(N, C)), 0),
    "var_mean_all": lambda S, P: torch.var_mean(S(_x(N, C)), correction=0),
    "softmin": lambda S, P: F.softmin(S(_x(N, C)), dim=0),
    "ravel": lambda S, P: torch.ravel(S(_x(N, C))),
    "unsafe_split": lambda S, P: torch.unsafe_split(S(_x(N, C)), 4),
    "vsplit": lambda S, P: torch.vsplit(S(_x(N, C)), [2, 5]),
    "atleast_3d": lambda S, P: torch.atleast_3d(S(_x(N))),
    "broadcast_tensors": lambda S, P: torch.broadcast_tensors(S(_x(N, 1)), P(_x(1, C))),
    "dist": lambda S, P: torch.dist(S(_x(N, C)), S(_x(N, C, seed=2)), 3),
    "vecdot": lambda S, P: torch.linalg.vecdot(S(_x(N, C)), S(_x(N, C, seed=2)), dim=0),
    "tril_rows": lambda S, P: torch.tril(S(_x(N, N))),
    "triu_cols_offset": lambda S, P: torch.triu(S(_x(N, N), 1), 2),
    "tril_batch": lambda S, P: S(_x(N, 4, 4)).tril(-1),
    "trace_rows": lambda S, P: torch.trace(S(_x(N, N))),
    "trace_cols": lambda S, P: torch.trace(S(_x(4, N), 1)),
    "prod_all": lambda S, P: torch.prod(S(_x(N, C) * 0.5 + 1)),
    "prod_dim_zeros": lambda S, P: torch.prod(S(_with_zeros(_x(N, C))), 0),
    "prod_other_dim": lambda S, P: torch.prod(S(_x(N, C)), 1, keepdim=True),
    "prod_int": lambda S, P: torch.prod(S(torch.arange(N) % 3 + 1), 0),
    "special_i1": lambda S, P: torch.special.i1(S(_x(N, C))),
    "polygamma": lambda S, P: torch.polygamma(2, S(_x(N, C).abs() + 1)),
    "xlog1py_sharded": lambda S, P: torch.special.xlog1py(S(_x(N, C)), S(_x(N, C, seed=2).abs())),
    "logaddexp": lambda S, P: torch.logaddexp(S(_x(N, C)), P(_x(C))),
    "frexp": lambda S, P: torch.frexp(S(_x(N, C), grad=False)),
    "glu": lambda S, P: F.glu(S(_x(N, 4)), dim=1),
    "prelu": lambda S, P: F.prelu(S(_x(N, C)), P(_x(C).abs())),
    "dot_sharded": lambda S, P: torch.dot(S(_x(N)), S(_x(N, seed=2))),
    "vdot": lambda S, P: torch.vdot(S(_x(N)), S(_x(N, seed=2))),
    "mv_rows": lambda S, P: torch.mv(S(_x(N, C)), P(_x(C))),
    "outer": lambda S, P: torch.outer(S(_x(N)), P(_x(C))),
    "inner": lambda S, P: torch.inner(S(_x(N, C)), P(_x(2, C))),
    "tensordot_contract_points": lambda S, P: torch.tensordot(S(_x(N, C)), S(_x(N, 2, seed=2)), ([0], [0])),
    "addmm": lambda S, P: torch.addmm(S(_x(N, 2)), S(_x(N, C)), P(_x(C, 2)), beta=0.5, alpha=2.0),
    "addmm_beta0_nan": lambda S, P: torch.addmm(S(torch.full((N, 2), float("nan"), dtype=torch.float64)),
                                                S(_x(N, C)), P(_x(C, 2)), beta=0),
    "baddbmm": lambda S, P: torch.baddbmm(S(_x(N, 2, 2)), S(_x(N, 2, C)), S(_x(N, C, 2, seed=3))),
    "addbmm_over_points": lambda S, P: torch.addbmm(P(_x(2, 2)), S(_x(N, 2, C)), S(_x(N, C, 2, seed=3))),
    "bilinear": lambda S, P: F.bilinear(S(_x(N, C)), S(_x(N, 2, seed=2)), P(_x(4, C, 2)), P(_x(4))),
    "complex_polar": lambda S, P: torch.polar(S(_x(N, C).abs()), S(_x(N, C, seed=2))).real,
}


def _run(names):
    return run_cases(CASES, names)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_composed_ops_match_single_process(world_size):
    res = check(run_distributed(_run, world_size, sorted(CASES), timeout=600))
    if world_size > 1:
        assert res["tril_rows"][2] == {}
        assert res["special_i1"][2] == {}
        assert res["trace_rows"][2] == {"all_reduce": 1}
        assert res["dot_sharded"][2] == {"all_reduce": 1} and res["mv_rows"][2] == {}


def _bad(kind):
    mesh = ms.init_mesh()
    x = ms.ShardTensor.from_local(torch.ones(2, 4), mesh, sizes=[2] * torch.distributed.get_world_size())
    if kind == "glu_sharded_dim":
        return raises_everywhere(F.glu, x, 0)
    return raises_everywhere(F.prelu, x.T, torch.ones(x.shape[0]))  # channels (dim 1) sharded, per-channel weight


@pytest.mark.parametrize("kind", ["glu_sharded_dim", "prelu_channels"])
def test_refusals_on_every_rank(kind):
    assert run_distributed(_bad, 2, kind) == ["UnsupportedOpError"] * 2
