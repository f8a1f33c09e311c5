"""Opt-in cross-rank validation (``MESHSHARD_VALIDATE=1`` or ``validate=True``).

Checked: sharding sizes agree on all ranks (``from_local``), global shapes agree, a ShardTensor's
local length matches its spec (``ShardTensor.validate``), and every uneven all-to-all (halo plan
build, halo exchange, reshard) sends each peer what it expects (``comm.check_split_sizes``). A
mismatch raises :class:`~meshshard.ShardingError` on every rank, naming the ranks. Off, the checks
cost nothing.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
import torch.distributed as dist

import meshshard as ms
from meshshard import comm
from meshshard.tensor import ShardSpec
from meshshard.tensor._tensor import _wrap
from meshshard.testing import run_distributed


@contextlib.contextmanager
def _validate_env(value: str | None):
    old = os.environ.get("MESHSHARD_VALIDATE")
    if value is None:
        os.environ.pop("MESHSHARD_VALIDATE", None)
    else:
        os.environ["MESHSHARD_VALIDATE"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MESHSHARD_VALIDATE", None)
        else:
            os.environ["MESHSHARD_VALIDATE"] = old


def _error(fn, *args, **kwargs) -> str | None:
    try:
        fn(*args, **kwargs)
    except ms.ShardingError as exc:
        return str(exc)
    return None


def _sizes_checks(_: int):
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    good = [2, 3, 1]
    bad = [2, 3, 1] if rank != 1 else [2, 1, 3]  # rank 1 believes the others hold different rows
    local = torch.zeros(good[rank] if rank != 1 else bad[1], 4)
    out = {}
    with _validate_env(None), ms.CommCounter() as off:
        ms.ShardTensor.from_local(torch.zeros(good[rank], 4), mesh, sizes=good)
    out["off_collectives"] = off.total
    out["explicit"] = _error(ms.ShardTensor.from_local, local, mesh, sizes=bad, validate=True)
    with _validate_env("1"):
        out["env"] = _error(ms.ShardTensor.from_local, local, mesh, sizes=bad)
        with ms.CommCounter() as on:
            x = ms.ShardTensor.from_local(torch.zeros(good[rank], 4), mesh, sizes=good)
        out["on_collectives"] = dict(on.counts)
        channels = 4 if rank != 2 else 5
        out["shape"] = _error(ms.ShardTensor.from_local, torch.zeros(good[rank], channels), mesh, sizes=good)
    out["validate_ok"] = x.validate() is x
    # A spec that lies about the local length (as a buggy rule could produce).
    lying = _wrap(torch.zeros(good[rank] + (rank == 0), 4), x.spec)
    out["local_length"] = _error(lying.validate)
    return out


def test_sharding_sizes_shapes_and_local_length_are_checked_across_ranks():
    results = run_distributed(_sizes_checks, 3, 0)
    for rank, out in enumerate(results):
        assert out["off_collectives"] == 0  # off by default: no communication
        assert out["on_collectives"] == {"all_gather": 1}
        for key in ("explicit", "env"):
            assert out[key].startswith(f"[rank {rank}] sharding sizes disagree between ranks"), out[key]
            assert "rank 1 has (2, 1, 3)" in out[key] and "rank 0 has (2, 3, 1)" in out[key]
        assert f"[rank {rank}] global shapes disagree between ranks" in out["shape"], out["shape"]
        assert "rank 2 has (2, 3, 1) shape (6, 5)" in out["shape"]
        assert out["validate_ok"]
        assert out["local_length"] == (
            f"[rank {rank}] local shard lengths do not match the spec on ranks [0]: "
            "rank 0 holds 3 (sharding_sizes[0] = 2)"
        )


def _split_checks(_: int):
    rank = dist.get_rank()
    out = {}
    # Rank 0 sends 2 rows to rank 1, but rank 1 expects 3: without validation gloo would fail or hang.
    send = [[1, 2], [1, 1]][rank]
    recv = [[1, 1], [3, 1]][rank]
    with _validate_env("1"):
        out["mismatch"] = _error(comm.all_to_all, torch.zeros(sum(send), 2), send, recv)
        out["match"] = comm.all_to_all(torch.full((2, 2), float(rank)), [1, 1], [1, 1]).tolist()
    return out


def test_all_to_all_split_sizes_are_checked_on_every_rank():
    results = run_distributed(_split_checks, 2, 0)
    for rank, out in enumerate(results):
        assert out["mismatch"] == (
            f"[rank {rank}] all_to_all split sizes disagree between ranks: "
            "rank 0 sends 2 rows to rank 1, which expects 3"
        )
        assert out["match"] == [[0.0, 0.0], [1.0, 1.0]]


def _halo_checks(_: int):
    """A halo plan with asymmetric counts (a corrupted plan) is caught at its exchange."""
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(0)
    pts = torch.rand(30, 3, generator=g)
    x = ms.scatter(pts, [10, 10, 10], mesh)
    plan = ms.HaloPlan.build(x, 0.3)
    with _validate_env("1"):
        with ms.CommCounter() as cc:
            ok = plan.exchange(x).shape[0] == 10 + plan.num_ghosts
        if rank == 2 and plan.recv_counts[0]:
            counts = list(plan.recv_counts)
            counts[0] -= 1
            plan.recv_counts = tuple(counts)
            plan.ghost_global_index = plan.ghost_global_index[1:]
        broken = _error(plan.exchange, x)
    return ok, dict(cc.counts), broken, plan.recv_counts


def test_asymmetric_halo_plan_is_named():
    results = run_distributed(_halo_checks, 3, 0)
    for rank, (ok, counts, broken, _) in enumerate(results):
        assert ok and counts == {"all_gather": 1, "all_to_all": 1}
        assert broken is not None and broken.startswith(f"[rank {rank}] all_to_all split sizes disagree"), broken
        assert "to rank 2, which expects" in broken


def test_check_split_sizes_needs_one_entry_per_rank():
    with pytest.raises(ValueError, match=r"send_sizes and recv_sizes must have one entry per rank \(1\)"):
        comm.check_split_sizes([1, 2], [1], None)


def test_validate_flag_spellings(monkeypatch):
    for value, expected in [("1", True), ("true", True), ("0", False), ("", False), ("false", False)]:
        monkeypatch.setenv("MESHSHARD_VALIDATE", value)
        assert comm.validate_enabled() is expected
    monkeypatch.delenv("MESHSHARD_VALIDATE")
    assert not ms.tensor.validate_enabled()
    assert isinstance(ShardSpec, type)


def _halo_validate(_: int):
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    pts = torch.rand(30, 3, generator=torch.Generator().manual_seed(0))
    x = ms.scatter(pts, [10, 10, 10], mesh)
    plan = ms.HaloPlan.build(x, 0.3)
    out = {"ok": plan.validate() is plan, "sent": plan.num_sent}
    with _validate_env(None), ms.CommCounter() as off:
        ms.HaloPlan.build(x, 0.3)
    with _validate_env("1"), ms.CommCounter() as on:
        ms.HaloPlan.build(x, 0.3)
    out["extra_all_gathers"] = on.counts["all_gather"] - off.counts["all_gather"]
    if rank == 1:
        plan.send_index = plan.send_index + 100  # rows this rank does not own
    out["broken"] = _error(plan.validate)
    single = ms.HaloPlan.build(pts, 0.3)  # a plain tensor: the single-process plan, no communication
    out["single_ok"] = single.validate() is single
    return out


def test_halo_plan_validate_checks_itself_and_symmetry_on_every_rank():
    results = run_distributed(_halo_validate, 3, 0)
    assert results[1]["sent"] > 0
    for rank, out in enumerate(results):
        assert out["ok"] and out["single_ok"]
        # one per all_to_all of the build (3: split sizes), one for the plan itself
        assert out["extra_all_gathers"] == 4
        own = ": send_index must lie in [0, 10)" if rank == 1 else ""
        assert out["broken"] == f"[rank {rank}] inconsistent on rank(s) [1]{own}"
