"""Scatter and segment reductions with sharded points (meshshard/tensor/_rules/_scatter.py) vs single-process."""

# ruff: noqa: B023  (each case lambda is bound to its loop value by an outer lambda)
from __future__ import annotations

import pytest
import torch

import meshshard as ms
from meshshard.testing import run_distributed

from .._serial import check, run_cases

N, C, G = 13, 3, 4  # points, channels, groups (graphs / regions / parts)


def _x(*shape, seed=4):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _groups(n=N, g=G):
    idx = torch.randint(0, g, (n,), generator=torch.Generator().manual_seed(8))
    idx[0] = idx[1]  # a tie of two points in one group; group g-1 may stay empty
    return idx


def _idx2(n=N, c=C):
    return _groups(n).unsqueeze(1).expand(n, c).contiguous()


def _tgt(seed=7):
    return _x(G, C, seed=seed)


CASES = {
    "index_add": lambda S, P: torch.index_add(P(_tgt()), 0, S(_groups()), S(_x(N, C)), alpha=2.0),
    "index_add_method": lambda S, P: P(_tgt()).index_add(0, S(_groups()), S(_x(N, C))),
    "scatter_add": lambda S, P: torch.scatter_add(P(_tgt()), 0, S(_idx2()), S(_x(N, C))),
    "scatter_add_zeros_target": lambda S, P: torch.zeros(G, C, dtype=torch.float64).scatter_add(
        0, S(_idx2()), S(_x(N, C))),
    "index_add_int": lambda S, P: torch.zeros(G, 2, dtype=torch.long).index_add(0, S(_groups()),
                                                                                 S(torch.arange(2 * N).view(N, 2))),
}
for red in ("sum", "mean", "amax", "amin", "prod"):
    for inc in (True, False):
        CASES[f"scatter_reduce_{red}_{inc}"] = (lambda red, inc: lambda S, P: torch.scatter_reduce(
            P(_tgt()), 0, S(_idx2()), S(_x(N, C)), red, include_self=inc))(red, inc)
    if red != "sum":
        CASES[f"index_reduce_{red}"] = (lambda red: lambda S, P: torch.index_reduce(
            P(_tgt()), 0, S(_groups()), S(_x(N, C)), red, include_self=False))(red)
CASES.update({
    # local: scatter along the channels of a sharded target
    "local_scatter_add_channels": lambda S, P: torch.scatter_add(
        S(_x(N, 4)), 1, S(torch.randint(0, 4, (N, 2), generator=torch.Generator().manual_seed(2))), S(_x(N, 2))),
    "local_index_add_channels": lambda S, P: S(_x(N, 4)).index_add(1, P(torch.tensor([3, 0])), S(_x(N, 2))),
    "local_scatter_reduce_amax": lambda S, P: torch.scatter_reduce(
        S(_x(N, 4)), 1, S(torch.randint(0, 4, (N, 3), generator=torch.Generator().manual_seed(2))), S(_x(N, 3)),
        "amax"),
    "local_scatter_value": lambda S, P: torch.scatter(
        S(_x(N, 4)), 1, S(torch.randint(0, 4, (N, 1), generator=torch.Generator().manual_seed(2))), 5.0),
})
# into a target sharded along the scatter dim (nodes), contributions sharded otherwise (edges): routed to owners
M = 11  # target rows; N contributions with global row indices


def _rows(seed=3, n=N):
    return torch.randint(0, M, (n,), generator=torch.Generator().manual_seed(seed))


def _rows2(c=C):
    return _rows().view(-1, 1).expand(N, c).contiguous()


CASES.update({
    "sharded_index_add": lambda S, P: torch.index_add(S(_x(M, C, seed=1)), 0, S(_rows()), S(_x(N, C)), alpha=2.0),
    "sharded_index_add_inplace": lambda S, P: (S(_x(M, C, seed=1)) * 1).index_add_(0, S(_rows()), S(_x(N, C))),
    "sharded_scatter_add": lambda S, P: torch.scatter_add(S(_x(M, C, seed=1)), 0, S(_rows2()), S(_x(N, C))),
    "sharded_scatter_add_inplace": lambda S, P: (S(_x(M, C, seed=1)) * 1).scatter_add_(0, S(_rows2()), S(_x(N, C))),
    # an index that differs along the channels: single elements are routed
    "sharded_scatter_add_ragged": lambda S, P: torch.scatter_add(S(_x(M, C, seed=1)), 0, S(torch.randint(
        0, M, (N, 2), generator=torch.Generator().manual_seed(5))), S(_x(N, 2))),
    "sharded_scatter_amax_ragged_inplace": lambda S, P: (S(_x(M, C, seed=1)) * 1).scatter_reduce_(0, S(torch.randint(
        0, M, (N, 2), generator=torch.Generator().manual_seed(5))), S(_x(N, 2)), "amax", include_self=False),
    "sharded_scatter_value": lambda S, P: torch.scatter(S(_x(M, C, seed=1)), 0, S(torch.randperm(
        M, generator=torch.Generator().manual_seed(2))[:4].view(4, 1).expand(4, C).contiguous()), 2.5),
    "sharded_scatter_assign": lambda S, P: torch.scatter(S(_x(M, C, seed=1)), 0, S(torch.randperm(
        M, generator=torch.Generator().manual_seed(2))[:6].view(6, 1).expand(6, C).contiguous()), S(_x(6, C))),
    # replicated contributions (plain index and source): each rank applies the ones that hit its rows
    "sharded_index_add_plain": lambda S, P: torch.index_add(S(_x(M, C, seed=1)), 0, P(_rows()), P(_x(N, C))),
    "sharded_index_put_accumulate": lambda S, P: torch.index_put(S(_x(M, C, seed=1)), (S(_rows()),), S(_x(N, C)),
                                                                 accumulate=True),
    "sharded_index_put_accumulate_inplace": lambda S, P: (S(_x(M, C, seed=1)) * 1).index_put_(
        (S(_rows()),), S(_x(N, C)), accumulate=True),
    "replicated_index_put_accumulate": lambda S, P: torch.index_put(P(_tgt()), (S(_groups()),), S(_x(N, C)),
                                                                    accumulate=True),
})
for red in ("sum", "mean", "amax", "amin", "prod"):
    for inc in (True, False):
        CASES[f"sharded_scatter_reduce_{red}_{inc}"] = (lambda red, inc: lambda S, P: torch.scatter_reduce(
            S(_x(M, C, seed=1)), 0, S(_rows2()), S(_x(N, C)), red, include_self=inc))(red, inc)
        if red != "sum":
            CASES[f"sharded_index_reduce_{red}_{inc}"] = (lambda red, inc: lambda S, P: torch.index_reduce(
                S(_x(M, C, seed=1)), 0, S(_rows()), S(_x(N, C)), red, include_self=inc))(red, inc)
try:
    from torch_geometric.utils import scatter as pyg_scatter

    for red in ("sum", "mean", "max", "min", "mul"):
        CASES[f"pyg_{red}"] = (lambda red: lambda S, P: pyg_scatter(S(_x(N, C)), S(_groups()), 0, G, red))(red)
    CASES["pyg_sum_dim_size_from_index"] = lambda S, P: pyg_scatter(S(_x(N, C)), S(_groups()), 0)
except ImportError:  # torch_geometric is optional
    pass


def _run(names):
    return run_cases(CASES, names)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_scatter_matches_single_process(world_size):
    res = check(run_distributed(_run, world_size, sorted(CASES), timeout=600))
    for name in ("local_scatter_add_channels", "local_index_add_channels", "local_scatter_reduce_amax",
                 "local_scatter_value"):
        assert res[name][2] == {} and res[name][4] == "ShardTensor", (name, res[name])
    if world_size > 1:
        for name in ("index_add", "scatter_add", "scatter_reduce_sum_True", "scatter_reduce_mean_True",
                     "scatter_reduce_mean_False", "scatter_reduce_sum_False"):
            assert res[name][2] == {"all_reduce": 1} and res[name][3] == {"all_reduce": 1}, (name, res[name])
            assert res[name][4] == "ReplicatedTensor"
        for name in ("scatter_reduce_amax_True", "scatter_reduce_prod_False", "index_reduce_amin"):
            assert res[name][2] == {"all_to_all": 2}, (name, res[name])
        # sharded target: one all_reduce of three flags, then counts, indices and rows to their owners
        for name in ("sharded_index_add", "sharded_scatter_add", "sharded_scatter_reduce_amax_False",
                     "sharded_index_put_accumulate"):
            assert res[name][2] == {"all_reduce": 1, "all_to_all": 3}, (name, res[name])
            assert res[name][3] == {"all_reduce": 1, "all_to_all": 1} and res[name][4] == "ShardTensor"
        assert res["sharded_index_add_plain"][2] == {"all_reduce": 1}, res["sharded_index_add_plain"]
    for name in CASES:
        if name.startswith("sharded_"):
            assert res[name][4] == "ShardTensor", (name, res[name])


def _bad(kind):
    mesh = ms.init_mesh()
    rank = ms.init_mesh().get_local_rank()
    x = ms.ShardTensor.from_local(torch.ones(3, 2), mesh, sizes=[3, 3])
    idx = ms.ShardTensor.from_local(torch.tensor([0, 1, 9 if rank == 1 else 0]), mesh, sizes=[3, 3])
    try:
        if kind == "out_of_range":
            torch.index_add(torch.zeros(4, 2), 0, idx, x)
        elif kind == "sharded_out_of_range":  # into a sharded target: the same IndexError on every rank
            torch.index_add(x, 0, idx, x)
        elif kind == "sharded_plain_index":
            torch.index_add(x, 0, torch.tensor([0, 1, 2, 3, 4, 5]), x)
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__
    return None


@pytest.mark.parametrize("kind,err", [("out_of_range", "IndexError"), ("sharded_out_of_range", "IndexError"),
                                      ("sharded_plain_index", "UnsupportedOpError")])
def test_bad_scatter_raises_on_every_rank(kind, err):
    assert run_distributed(_bad, 2, kind) == [err, err]


if __name__ == "__main__":
    import sys

    for r, res in enumerate(run_distributed(_run, int(sys.argv[1]), sorted(CASES))):
        print(r, {k: v for k, v in res.items() if not (v[0] and v[1])})
    print(res)
