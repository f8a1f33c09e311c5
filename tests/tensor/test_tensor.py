"""``meshshard/tensor/_tensor.py``: ShardTensor and ReplicatedTensor against a single-process reference.

* Construction, round trips, reshard, errors, and gradients.
* torch.autograd.grad with respect to sharded coordinates (create_graph=True): PDE residuals, sharded.
* Opt-in cross-rank validation (``MESHSHARD_VALIDATE=1`` or ``validate=True``).

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
from meshshard.partition import Partition
from meshshard.tensor import ShardSpec
from meshshard.tensor._tensor import wrap_shard
from meshshard.testing import DistributedError, run_distributed

from ._serial import split

# -- Construction, round trips, reshard, errors, gradients -----------------------------------------------
SIZES = {1: [9], 2: [7, 0], 3: [5, 0, 8], 4: [7, 0, 13, 2]}


def _global(n, c=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, generator=g, dtype=dtype)


def _rows(sizes, rank):
    off = sum(sizes[:rank])
    return slice(off, off + sizes[rank])


def _round_trips(sizes):
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    g = _global(sum(sizes))
    x = ms.ShardTensor.from_local(g[_rows(sizes, rank)].clone(), mesh, sizes=sizes)
    inferred = ms.ShardTensor.from_local(g[_rows(sizes, rank)].clone(), mesh)  # sizes by all-gather
    with ms.CommCounter() as free:
        ms.ShardTensor.from_local(g[_rows(sizes, rank)].clone(), mesh, sizes=sizes)
    part = Partition(torch.randperm(sum(sizes), generator=torch.Generator().manual_seed(1)), torch.tensor(sizes))
    scattered = ms.scatter(g, part, mesh)
    new_sizes = list(reversed(sizes))
    resharded = x.reshard(new_sizes)
    return {
        "local_shape": tuple(x.local_shape),
        "global_shape": tuple(x.global_shape),
        "sizes": x.sharding_sizes,
        "inferred_sizes": inferred.sharding_sizes,
        "offsets": x.offsets,
        "free_collectives": free.total,
        "full_ok": torch.equal(x.full_tensor(), g),
        "scatter_ok": torch.equal(scattered.to_local(), g[part.perm[_rows(sizes, rank)]]),
        "scatter_full_ok": torch.equal(scattered.full_tensor(), g[part.perm]),
        "reshard_sizes": resharded.sharding_sizes,
        "reshard_local_ok": torch.equal(resharded.to_local(), g[_rows(new_sizes, rank)]),
        "is_plain": type(x.to_local()) is torch.Tensor,
    }


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_construction_round_trips(world_size):
    sizes = SIZES[world_size]
    for rank, out in enumerate(run_distributed(_round_trips, world_size, sizes)):
        assert out["local_shape"] == (sizes[rank], 4)
        assert out["global_shape"] == (sum(sizes), 4)
        assert out["sizes"] == out["inferred_sizes"] == tuple(sizes)
        assert out["offsets"][-1] == sum(sizes) and len(out["offsets"]) == world_size + 1
        assert out["free_collectives"] == 0
        assert out["reshard_sizes"] == tuple(reversed(sizes))
        for key in ("full_ok", "scatter_ok", "scatter_full_ok", "reshard_local_ok", "is_plain"):
            assert out[key], (rank, key)


def _gradients_through_full_and_reshard(sizes):
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    g = _global(sum(sizes)).requires_grad_()
    w = torch.linspace(-1, 1, sum(sizes), dtype=torch.float64)[:, None]
    x = ms.scatter(g, sizes, mesh)
    # full_tensor: partial gradients reduce-scattered back to the owner
    loss = (x.full_tensor() ** 3 * w).sum()
    loss.backward()
    ref = (3 * g.detach() ** 2 * w)[_rows(sizes, rank)]
    ok_full = torch.allclose(g.grad[_rows(sizes, rank)], ref)
    g.grad = None
    y = x.reshard(list(reversed(sizes)))
    (y.to_local() ** 2).sum().backward()
    ok_reshard = torch.allclose(g.grad[_rows(sizes, rank)], 2 * g.detach()[_rows(sizes, rank)])
    return ok_full, ok_reshard


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_full_tensor_and_reshard_backward(world_size):
    for ok_full, ok_reshard in run_distributed(_gradients_through_full_and_reshard, world_size, SIZES[world_size]):
        assert ok_full and ok_reshard


def _batch_dim(sizes):
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    g = torch.randn(2, sum(sizes), 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    x = ms.ShardTensor.from_local(g[:, _rows(sizes, rank)], mesh, sizes=sizes, dim=1)
    return (
        torch.allclose(x.mean(dim=1), g.mean(dim=1)),
        torch.equal(x.full_tensor(), g),
        x.softmax(dim=1).shard_dim,
        torch.allclose((x * 2).sum(dim=(1, 2)), (g * 2).sum(dim=(1, 2))),
    )


def test_leading_batch_dimension():
    for mean_ok, full_ok, sm_dim, sum_ok in run_distributed(_batch_dim, 3, SIZES[3]):
        assert mean_ok and full_ok and sum_ok and sm_dim == 1


def _bad_sizes(kind):
    mesh = ms.init_mesh()
    local = torch.zeros(3, 2)
    if kind == "length":
        ms.ShardTensor.from_local(local, mesh, sizes=[3])
    elif kind == "mismatch":
        ms.ShardTensor.from_local(local, mesh, sizes=[2, 3])
    elif kind == "negative":
        ms.ShardTensor.from_local(local, mesh, sizes=[3, -1])
    elif kind == "disagree":  # each rank claims a different split: caught by validate=True
        sizes = [3, 3] if dist.get_rank() == 0 else [1, 3]
        ms.ShardTensor.from_local(local, mesh, sizes=sizes, validate=True)
    elif kind == "dim":
        ms.ShardTensor.from_local(local, mesh, dim=2)
    elif kind == "type":
        ms.ShardTensor.from_local(local.numpy(), mesh)


@pytest.mark.parametrize(
    "kind, match",
    [
        ("length", "sizes must have one entry per rank"),
        ("mismatch", r"sizes\[0\] = 2 but the local tensor has 3"),
        ("negative", "sizes must be non-negative"),
        ("disagree", "sharding sizes disagree between ranks"),
        ("dim", r"dim must be in \[-2, 2\)"),
        ("type", "Expected 'local' to be a torch.Tensor"),
    ],
)
def test_bad_construction_raises_clear_errors(kind, match):
    with pytest.raises(DistributedError, match=match):
        run_distributed(_bad_sizes, 2, kind, timeout=10)


def _reshard_errors():
    mesh = ms.init_mesh()
    x = ms.ShardTensor.from_local(torch.zeros(2, 1), mesh, sizes=[2, 2])
    msgs = []
    for new in ([1, 1], [4], [5, -1]):
        try:
            x.reshard(new)
        except ValueError as e:
            msgs.append(str(e))
    return msgs


def test_reshard_rejects_bad_sizes():
    msgs = run_distributed(_reshard_errors, 2)[0]
    assert "must sum to N_global = 4" in msgs[0]
    assert "new_sizes must be 2 non-negative ints (got (4,))" in msgs[1]
    assert "new_sizes must be 2 non-negative ints (got (5, -1))" in msgs[2]


# -- Derivatives with respect to sharded coordinates (create_graph=True) ---------------------------------
N = 17


def _field(xyz, net):
    """A smooth predicted field (u, v, w, p) of the coordinates: an MLP, as a PINN would use."""
    return net(xyz)


def _d(y, xyz, form):
    """d(y)/d(xyz) per point: ``grad(y.sum(), x)`` (an all-reduce and its backward) or with ``grad_outputs``."""
    if form == "sum":
        return torch.autograd.grad(y.sum(), xyz, create_graph=True)[0]
    return torch.autograd.grad(y, xyz, grad_outputs=torch.ones_like(y), create_graph=True)[0]


def _residuals(xyz, net, form):
    """Gradient of p, divergence of (u, v, w), Laplacian of p, and a loss on them (second derivatives)."""
    out = _field(xyz, net)
    p = out[:, 3]
    grad_p = _d(p, xyz, form)
    div = 0
    for i in range(3):
        div = div + _d(out[:, i], xyz, form)[:, i]
    lap = 0
    for i in range(3):
        lap = lap + _d(grad_p[:, i], xyz, form)[:, i]
    loss = (div**2).mean() + ((lap - 1.0) ** 2).mean()
    return grad_p, div, lap, loss


def _check(form):
    mesh = ms.init_mesh()
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()
    coords = torch.rand(N, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ref_x = coords.clone().requires_grad_()
    ref = _residuals(ref_x, net, form)
    ref[3].backward()
    ref_grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    sizes = split(N, world)
    off = sum(sizes[:rank])
    local = coords[off : off + sizes[rank]].clone().requires_grad_()
    x = ms.ShardTensor.from_local(local, mesh, sizes=sizes)
    with ms.CommCounter() as cc:
        got = _residuals(x, net, form)
    got[3].backward()
    ms.nn.sync_gradients(net, mesh)
    rows = slice(off, off + sizes[rank])
    ok = [isinstance(g, ms.ShardTensor) for g in got[:3]]
    ok += [torch.allclose(g.to_local(), r[rows], rtol=1e-10, atol=1e-12) for g, r in zip(got[:3], ref[:3])]
    ok.append(torch.allclose(got[3].to_plain(), ref[3], rtol=1e-10))
    ok += [torch.allclose(torch.zeros_like(p) if p.grad is None else p.grad, r, rtol=1e-9, atol=1e-12)
           for p, r in zip(net.parameters(), ref_grads)]
    return all(ok), dict(cc.counts)


@pytest.mark.parametrize("form", ["grad_outputs", "sum"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_pde_residuals_wrt_sharded_coordinates(world_size, form):
    for ok, counts in run_distributed(_check, world_size, form):
        assert ok
        if world_size > 1:
            # grad_outputs: no communication for the derivatives, only the loss's two means; y.sum(): one
            # all-reduce per sum and one in each grad's backward through it (7 derivatives)
            assert counts == {"all_reduce": 2 if form == "grad_outputs" else 2 + 2 * 7}


# -- Opt-in cross-rank validation ------------------------------------------------------------------------
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
    lying = wrap_shard(torch.zeros(good[rank] + (rank == 0), 4), x.spec)
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
        # one per all_to_all of the build (3: split sizes), one for the plan itself, one for the
        # points' values (the finiteness verdict agreed across ranks)
        assert out["extra_all_gathers"] == 5
        # every rank names the failing rank and what it found
        assert out["broken"] == f"[rank {rank}] inconsistent on rank(s) [1]: rank 1: send_index must lie in [0, 10)"
