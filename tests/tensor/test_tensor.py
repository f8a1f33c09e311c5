"""ShardTensor construction, round trips, reshard, errors, and gradients vs a single-process reference."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import meshshard as ms
from meshshard.testing import DistributedError, run_distributed

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
    part = _FakePartition(torch.randperm(sum(sizes), generator=torch.Generator().manual_seed(1)), sizes)
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


class _FakePartition:
    """Just what scatter reads of a Partition."""

    def __init__(self, perm, sizes):
        self.perm, self.sizes = perm, torch.tensor(sizes)


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
