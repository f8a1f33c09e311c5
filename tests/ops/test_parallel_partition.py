"""repartition equals the serial partition of the gathered cloud: world sizes 1-4, uneven and empty chunks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

import meshshard as ms
from meshshard.ops.parallel_partition import GATHER_LIMIT, repartition_with_payload
from meshshard.partition import partition
from meshshard.testing import run_distributed

METHODS = ("rcb", "rcb-longest", "morton", "hilbert")


def _cloud(seed: int) -> tuple[torch.Tensor, torch.Tensor | None, list[float]]:
    """A random cloud with duplicates, flat axes and clusters, optional weights, and chunk shares."""
    rng = np.random.default_rng(seed)
    n = int(rng.choice([0, 1, 5, 40, 300, 2000]))
    dim = int(rng.choice([2, 3]))
    levels = int(rng.choice([1, 3, 50, 10**6]))  # few levels: many ties and duplicate points
    pts = rng.integers(0, levels, size=(n, dim)).astype(np.float64) * rng.uniform(0.01, 100.0, size=dim)
    if n and rng.random() < 0.3:
        pts[:, rng.integers(0, dim)] = 0.0
    dtype = torch.float32 if rng.random() < 0.5 else torch.float64
    weights = None
    if rng.random() < 0.5:
        kind = rng.integers(0, 3)
        w = rng.uniform(0.0, 5.0, size=n) if kind == 0 else rng.integers(0, 4, size=n).astype(np.float64)
        if kind == 2:
            w = rng.exponential(1.0, size=n) ** 3
        if n:
            w[0] = max(w[0], 1.0)  # a positive sum
        weights = torch.from_numpy(w)
    shares = rng.dirichlet(np.ones(4)).tolist()
    return torch.from_numpy(pts).to(dtype), weights, shares


def _chunks(n: int, shares: list[float], world: int, empty: int) -> list[int]:
    s = np.asarray(shares[:world], dtype=np.float64)
    s[empty % world] = 0.0 if world > 1 else s[0]
    sizes = np.floor(n * s / s.sum()).astype(int) if s.sum() else np.zeros(world, int)
    sizes[int(np.argmax(s))] += n - int(sizes.sum())
    return sizes.tolist()


def _compare(seeds: list[int]) -> list[str]:
    mesh = ms.init_mesh()
    rank, world = dist.get_rank(), dist.get_world_size()
    failures = []
    for seed in seeds:
        pts, w, shares = _cloud(seed)
        sizes = _chunks(pts.shape[0], shares, world, seed)
        lo = sum(sizes[:rank])
        x = ms.ShardTensor.from_local(pts[lo : lo + sizes[rank]].clone(), mesh, sizes=sizes)
        sw = None if w is None else ms.ShardTensor.from_local(w[lo : lo + sizes[rank]].clone(), mesh, sizes=sizes)
        for name in METHODS:
            method, rule = ("rcb", "longest") if name == "rcb-longest" else (name, "density")
            ref = partition(pts, world, method=method, weights=w, axis_rule=rule)
            points, ids = ms.partition.repartition(x, method, sw, axis_rule=rule)
            full_ids = ids.full_tensor()
            ok = (
                torch.equal(full_ids, ref.perm)
                and list(ids.sharding_sizes) == ref.sizes.tolist()
                and list(points.sharding_sizes) == ref.sizes.tolist()
                and torch.equal(points.to_local(), pts[ids.to_local()])
                and points.to_local().dtype == pts.dtype
            )
            if not ok:
                failures.append(f"seed {seed} {name} n={pts.shape[0]} chunks={sizes} weighted={w is not None}")
    return failures


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_repartition_equals_serial_partition(world_size):
    seeds = list(range(100 * world_size, 100 * world_size + 16))
    for failures in run_distributed(_compare, world_size, seeds, timeout=600):
        assert failures == []


def _refinement(method: str) -> dict:
    """Median buckets far larger than GATHER_LIMIT: a narrow dense cluster, duplicates, and ties."""
    mesh = ms.init_mesh()
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(7)
    n = 6000
    pts = torch.rand(n, 3, generator=g, dtype=torch.float64)
    pts[: n // 2] = pts[: n // 2] * 1e-9 + 0.5  # a cluster inside one histogram bucket
    pts[n // 2 : n // 2 + 1500] = 0.25  # 1500 identical points: refined by original index
    w = torch.randint(0, 3, (n,), generator=g).double()
    sizes = [n // world] * world
    sizes[-1] += n - sum(sizes)
    lo = sum(sizes[:rank])
    x = ms.ShardTensor.from_local(pts[lo : lo + sizes[rank]].clone(), mesh, sizes=sizes)
    out = {}
    for weighted in (False, True):
        sw = ms.ShardTensor.from_local(w[lo : lo + sizes[rank]].clone(), mesh, sizes=sizes) if weighted else None
        ref = partition(pts, world, method=method, weights=w if weighted else None)
        with ms.CommCounter() as cc:
            _, ids = ms.partition.repartition(x, method, sw)
        out[weighted] = (torch.equal(ids.full_tensor(), ref.perm), dict(cc.counts))
    return out


@pytest.mark.parametrize("method", ["rcb", "hilbert"])
def test_repartition_refines_crowded_median_buckets(method):
    assert GATHER_LIMIT < 1500
    for out in run_distributed(_refinement, 4, method, timeout=600):
        for weighted, (ok, counts) in out.items():
            assert ok, (method, weighted)
            # The points move once; curves also move (key, id, weight) to the sorters and parts back.
            assert counts["all_to_all"] == (1 if method == "rcb" else 3)


def _counts(method: str) -> dict:
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    pts = torch.rand(400, 3, generator=torch.Generator().manual_seed(3))
    sizes = [100, 0, 300]
    lo = sum(sizes[:rank])
    x = ms.ShardTensor.from_local(pts[lo : lo + sizes[rank]].clone(), mesh, sizes=sizes)
    with ms.CommCounter() as cc:
        ms.partition.repartition(x, method)
    return dict(cc.counts)


def test_repartition_collective_counts():
    # 3 ranks, 400 uniform points: 2 tree levels; median buckets stay below GATHER_LIMIT.
    for counts in run_distributed(_counts, 3, "rcb"):
        # flags + final sizes + per level (sizes, rows) of the gathered windows
        assert counts["all_gather"] == 2 + 2 * 2
        assert counts["all_to_all"] == 1
        # per level: boxes, histograms, window count/weight, window bounds; plus the last box
        assert counts["all_reduce"] == 2 * 4 + 1
    for counts in run_distributed(_counts, 3, "morton"):
        assert counts == {"all_gather": 2 + 3, "all_reduce": 3, "all_to_all": 3}


def _bad(kind: str) -> str:
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    pts = torch.rand(4, 3)
    if kind == "nan" and rank == 1:
        pts[2, 0] = float("nan")
    w = torch.ones(4)
    if kind == "negative" and rank == 0:
        w[1] = -1.0
    if kind == "zeros":
        w.zero_()
    x = ms.ShardTensor.from_local(pts, mesh, sizes=[4, 4])
    sw = ms.ShardTensor.from_local(w, mesh, sizes=[4, 4])
    try:
        ms.partition.repartition(x, "rcb", sw)
    except ValueError as exc:
        return str(exc)
    return "no error"


@pytest.mark.parametrize("kind", ["nan", "negative", "zeros"])
def test_repartition_bad_input_raises_on_every_rank(kind):
    messages = run_distributed(_bad, 2, kind)
    for msg in messages:
        assert "repartition" in msg
        assert ("rank(s) [1]" in msg) if kind == "nan" else True
        assert ("rank(s) [0]" in msg) if kind == "negative" else True
        assert ("positive sum" in msg) if kind == "zeros" else True


def test_repartition_type_errors():
    with pytest.raises(TypeError, match="ShardTensor"):
        ms.partition.repartition(torch.zeros(3, 3))


def _more_parts(num_parts: int) -> list[bool]:
    mesh = ms.init_mesh()
    rank, world = dist.get_rank(), dist.get_world_size()
    pts = torch.rand(500, 3, generator=torch.Generator().manual_seed(num_parts), dtype=torch.float64)
    sizes = [500, 0] if world == 2 else [500]
    lo = sum(sizes[:rank])
    x = ms.ShardTensor.from_local(pts[lo : lo + sizes[rank]].clone(), mesh, sizes=sizes)
    ok = []
    for method in ("rcb", "morton", "hilbert"):
        ref = partition(pts, num_parts, method=method)
        payload = (torch.arange(sizes[rank]) + lo).view(torch.uint8).reshape(-1, 8) if sizes[rank] else None
        if payload is None:
            payload = torch.zeros((0, 8), dtype=torch.uint8)
        points, ids, moved, part_sizes = repartition_with_payload(x, method, num_parts=num_parts, payload=payload)
        rank_of = [p * world // num_parts for p in range(num_parts)]
        blocks = [sum(int(ref.sizes[p]) for p in range(num_parts) if rank_of[p] == r) for r in range(world)]
        ok.append(
            torch.equal(ids.full_tensor(), ref.perm)
            and part_sizes == ref.sizes.tolist()
            and list(ids.sharding_sizes) == blocks
            and torch.equal(moved.clone().view(torch.long).reshape(-1), ids.to_local())
            and torch.equal(points.to_local(), pts[ids.to_local()])
        )
    return ok


@pytest.mark.parametrize(("world_size", "num_parts"), [(1, 4), (2, 5), (2, 8)])
def test_repartition_more_parts_than_ranks_and_payload(world_size, num_parts):
    for ok in run_distributed(_more_parts, world_size, num_parts):
        assert all(ok)


def test_quantized_weights_make_sums_exact_in_any_grouping():
    from meshshard.partition._validate import quantize_weights

    g = torch.Generator().manual_seed(0)
    w = torch.rand(10_000, generator=g, dtype=torch.float64) * 3.7
    q = quantize_weights(w, w.numel())
    assert torch.equal(q, q.floor()) and float(q.sum()) < 2**53
    assert float(q.sum()) == float(q.flip(0).sum()) == float(q.view(100, 100).sum(1).sum())
    ints = torch.randint(0, 5, (1000,), generator=g).double()
    qi = quantize_weights(ints, 1000)
    assert torch.equal(qi / (qi.max() / ints.max()), ints)  # integer weights only change scale
    pts = torch.rand(1000, 3, generator=g)
    for method in ("rcb", "hilbert"):
        assert torch.equal(partition(pts, 7, method, ints).perm, partition(pts, 7, method, ints * 8).perm)
