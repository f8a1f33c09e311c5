"""ball_query and knn: exact semantics, backend agreement, and partition invariance at P = 1..4."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import meshshard as ms
from meshshard.errors import ShardingError
from meshshard.ops import Neighbors, ball_query, knn
from meshshard.partition import partition
from meshshard.testing import run_distributed

from ..kernels._helpers import BACKENDS, OWN_BACKENDS, grid_cloud, needs_torch_cluster


# -- reference: brute force on the gathered points ----------------------------------------------------
def reference(points, queries, radius=None, k=None, ids=None):
    """(M, K) global indices, -1 padded: float64 distances summed x, y, z; sorted (d2, id).

    ``ids`` (default: the index) break ties; the result holds indices, not ids.
    """
    p = np.asarray(points, dtype=np.float64)
    q = np.asarray(queries, dtype=np.float64)
    diff = q[:, None, :] - p[None, :, :]
    sq = diff * diff
    d2 = sq[..., 0]
    for c in range(1, sq.shape[-1]):
        d2 = d2 + sq[..., c]
    width = k if k is not None else None
    rows = []
    for i in range(q.shape[0]):
        order = np.lexsort((np.arange(p.shape[0]) if ids is None else np.asarray(ids), d2[i]))
        if radius is not None:
            order = order[d2[i][order] <= radius * radius]
        rows.append(order)
    if width is None:
        width = max([len(r) for r in rows] + [1])
    out = np.full((q.shape[0], width), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        r = r[:width]
        out[i, : len(r)] = r
    return out


# -- single process ------------------------------------------------------------------------------------
def test_tiny_exact_1d():
    pts = torch.tensor([[0.0], [1.0], [3.0], [1.0], [2.0]])
    nbr = ball_query(pts, None, 1.0, 3, return_distances=True)
    assert isinstance(nbr, Neighbors)
    # query 0 (x=0): 0 (d 0), then 1 and 3 (both d 1: ties by index), truncated to 3.
    assert nbr.index.tolist() == [[0, 1, 3], [1, 3, 0], [2, 4, -1], [1, 3, 0], [4, 1, 2]]
    assert nbr.count.tolist() == [3, 3, 2, 3, 3]
    assert torch.equal(nbr.global_index(), nbr.index)
    assert nbr.distances[2].tolist() == [0.0, 1.0, float("inf")]
    edge = nbr.to_edge_index()
    assert edge.shape == (2, 14) and edge[1].tolist() == [0] * 3 + [1] * 3 + [2] * 2 + [3] * 3 + [4] * 3
    rowptr, col = nbr.to_csr()
    assert rowptr.tolist() == [0, 3, 6, 8, 11, 14] and torch.equal(col, edge[0])


def test_closed_ball_boundary_and_other_queries():
    pts = torch.tensor([[0.0, 0.0], [0.3, 0.4], [0.6, 0.8], [0.0, 0.0]])
    q = torch.tensor([[0.0, 0.0], [5.0, 5.0]])
    nbr = ball_query(pts, q, 0.5, 8)  # |(0.3, 0.4)| == 0.5 in float64 of the float32 values? check ref
    assert nbr.index.tolist() == reference(pts, q, radius=0.5, k=8).tolist()
    assert nbr.count.tolist()[1] == 0


def test_knn_tiny():
    pts = torch.tensor([[0.0], [2.0], [1.0], [1.0]])
    nbr = knn(pts, torch.tensor([[1.0], [10.0]]), 3, return_distances=True)
    assert nbr.index.tolist() == [[2, 3, 0], [1, 2, 3]]
    assert nbr.distances.tolist() == [[0.0, 0.0, 1.0], [8.0, 9.0, 9.0]]
    few = knn(pts, None, 6)
    assert few.count.tolist() == [4, 4, 4, 4] and (few.index[:, 4:] == -1).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_backends_match_reference(backend):
    pts = grid_cloud(300, 1)
    q = grid_cloud(60, 2)
    for radius, k in [(0.25, 5), (0.5, 40), (3.0, 7)]:
        got = ball_query(pts, q, radius, k, backend=backend)
        assert got.index.tolist() == reference(pts, q, radius=radius, k=k).tolist()
        self_q = ball_query(pts, None, radius, k, backend=backend)
        assert self_q.index.tolist() == reference(pts, pts, radius=radius, k=k).tolist()
    assert knn(pts, q, 9, backend=backend).index.tolist() == reference(pts, q, k=9).tolist()


@pytest.mark.parametrize("backend", ["numba", "scipy", "grid"])
def test_random_cloud_matches_reference(backend):
    # Generic float coordinates (few exact ties): exercises the fast paths rather than the tie fix-ups.
    g = torch.Generator().manual_seed(11)
    pts, q = torch.rand(400, 3, generator=g), torch.rand(70, 3, generator=g)
    assert knn(pts, q, 8, backend=backend).index.tolist() == reference(pts, q, k=8).tolist()
    assert knn(pts, None, 3, backend=backend).index.tolist() == reference(pts, pts, k=3).tolist()
    got = ball_query(pts, None, 0.15, 6, backend=backend, return_distances=True)
    want = reference(pts, pts, radius=0.15, k=6)
    assert got.index.tolist() == want.tolist()
    ref_d = torch.where(got.index >= 0, (pts[got.index.clamp(min=0)] - pts[:, None]).double().norm(dim=-1), torch.inf)
    torch.testing.assert_close(got.distances.double(), ref_d, rtol=1e-6, atol=1e-7)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 60),
    m=st.integers(0, 20),
    seed=st.integers(0, 10_000),
    radius=st.sampled_from([0.25, 0.5, 0.8, 2.0]),
    k=st.integers(1, 12),
    dim=st.sampled_from([1, 2, 3]),
    shuffled_ids=st.booleans(),
)
def test_property_matches_brute_force(n, m, seed, radius, k, dim, shuffled_ids):
    # lattice points (every distance tied many times) with duplicates; ties broken by ids
    pts = grid_cloud(n, seed, dim=dim, span=5)
    q = grid_cloud(m, seed + 1, dim=dim, span=5) if m else pts[:0]
    ids = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) * 3 + 7 if shuffled_ids else None
    expected = reference(pts, q, radius=radius, k=k, ids=ids).tolist()
    expected_knn = reference(pts, q, k=k, ids=ids).tolist()
    expected_self = reference(pts, pts, radius=radius, k=k, ids=ids).tolist()
    for backend in OWN_BACKENDS:
        assert ball_query(pts, q, radius, k, backend=backend, ids=ids).index.tolist() == expected, backend
        assert ball_query(pts, None, radius, k, backend=backend, ids=ids).index.tolist() == expected_self, backend
        if m:
            assert knn(pts, q, k, backend=backend, ids=ids).index.tolist() == expected_knn, backend


def test_numba_high_dimension_falls_back_exactly():
    g = torch.Generator().manual_seed(3)
    pts, q = torch.randint(0, 4, (120, 5), generator=g).float(), torch.randint(0, 4, (20, 5), generator=g).float()
    got = ball_query(pts, q, 1.5, 9, backend="numba")
    assert got.index.tolist() == reference(pts, q, radius=1.5, k=9).tolist()
    assert knn(pts, q, 4, backend="numba").index.tolist() == reference(pts, q, k=4).tolist()


def test_ids_order_ties_and_global_ids():
    pts = torch.tensor([[0.0], [1.0], [-1.0], [1.0]])
    ids = torch.tensor([40, 30, 20, 10])
    nbr = ball_query(pts, pts[:1], 1.0, 3, ids=ids)
    assert nbr.index.tolist() == [[0, 3, 2]]  # d 0, then the three at d 1 by id: 10, 20 (30 cut)
    assert nbr.global_ids().tolist() == [[40, 10, 20]]
    assert knn(pts, pts[:1], 2, ids=ids).global_ids().tolist() == [[40, 10]]
    assert ball_query(pts, pts[:1], 1.0, 3).global_ids().tolist() == [[0, 1, 2]]


@pytest.mark.parametrize(
    ("ids", "error", "match"),
    [
        (torch.arange(3), ValueError, r"ids must have shape \(4,\), one per point \(got \(3,\)\)"),
        (torch.zeros(4), TypeError, r"ids must hold integers \(got torch.float32\)"),
        ([0, 1, 2, 3], TypeError, r"ids must be a torch.Tensor or ShardTensor of point ids \(got list\)"),
    ],
)
def test_bad_ids(ids, error, match):
    with pytest.raises(error, match=match):
        ball_query(torch.zeros(4, 3), None, 1.0, 2, ids=ids)
    with pytest.raises(error, match=match):
        knn(torch.zeros(4, 3), None, 2, ids=ids)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"radius": -1.0}, ValueError, r"radius must be positive and finite \(got -1.0\)"),
        ({"radius": float("nan")}, ValueError, r"radius must be positive and finite \(got nan\)"),
        ({"radius": 0.0}, ValueError, r"radius must be positive"),
        ({"radius": "1"}, TypeError, r"radius must be a real number \(got str\)"),
        ({"max_neighbors": 0}, ValueError, r"max_neighbors must be at least 1 \(got 0\)"),
        ({"max_neighbors": 2.0}, TypeError, r"max_neighbors must be an integer \(got float\)"),
        ({"queries": torch.zeros(3, 2)}, ValueError, r"same dimension D \(got 3 and 2\)"),
        ({"queries": torch.zeros(3, dtype=torch.long)}, TypeError, r"queries must hold floating-point"),
        ({"points": torch.zeros(4)}, ValueError, r"points must have shape \(N, D\) \(got \(4,\)\)"),
        ({"backend": "cuml"}, ValueError, r"backend must be one of"),
    ],
)
def test_bad_inputs(kwargs, error, match):
    args = {"points": torch.zeros(4, 3), "queries": None, "radius": 1.0, "max_neighbors": 2}
    args.update(kwargs)
    backend = args.pop("backend", None)
    with pytest.raises(error, match=match):
        ball_query(args["points"], args["queries"], args["radius"], args["max_neighbors"], backend=backend)


def test_knn_bad_k():
    with pytest.raises(ValueError, match=r"k must be at least 1 \(got 0\)"):
        knn(torch.zeros(3, 3), None, 0)


@needs_torch_cluster
def test_torch_cluster_backend_truncation_normalised():
    pts = grid_cloud(200, 5)
    got = ball_query(pts, None, 0.5, 3, backend="torch_cluster").index
    assert got.tolist() == reference(pts, pts, radius=0.5, k=3).tolist()


# -- distributed ---------------------------------------------------------------------------------------
CASES = [
    # (seed, layout, radius, k, self_query)
    (0, "rcb", 0.25, 6, True),
    (1, "hilbert", 0.5, 12, True),
    (2, "rcb", 0.5, 5, False),
    (3, "uneven", 0.25, 8, True),
    (4, "hilbert", 5.0, 9, False),  # radius larger than a whole part
    (5, "uneven", 0.75, 4, False),
]


def _layout(cloud, world, layout, rank_sizes_seed):
    if layout in ("rcb", "hilbert"):
        part = partition(cloud, world, method=layout)
        return part, part.perm
    # Contiguous rows of a shuffled cloud: overlapping boxes, uneven and empty shards.
    n = cloud.shape[0]
    pattern = [7, 0, 13, 2][:world]
    base = [round(n * w / sum(pattern)) for w in pattern]
    base[-1] = n - sum(base[:-1])
    return base, torch.arange(n)


def _check_cases(cases):
    mesh = ms.init_mesh()
    world, rank = dist.get_world_size(), dist.get_rank()
    failures = []
    for seed, layout, radius, k, self_query in cases:
        pts = grid_cloud(240, seed)
        lay, perm = _layout(pts, world, layout, seed)
        points = ms.scatter(pts, lay, mesh)
        full = pts[perm]
        if self_query:
            queries, qfull = points, full
        else:
            qcloud = grid_cloud(90, seed + 100)
            qlay, qperm = _layout(qcloud, world, "hilbert" if layout == "rcb" else "rcb", seed)
            queries, qfull = ms.scatter(qcloud, qlay, mesh), qcloud[qperm]
        lo, hi = queries.offsets[rank], queries.offsets[rank + 1]
        with ms.CommCounter() as cc:
            nbr = ball_query(points, queries, radius, k)
        want = reference(full, qfull[lo:hi], radius=radius, k=k)
        if nbr.global_index().tolist() != want.tolist():
            failures.append(("ball_query", seed, layout))
        if cc.counts["all_to_all"] != (3 if world > 1 else 0) or cc.counts["all_gather"] != (world > 1):
            failures.append(("collectives", seed, dict(cc.counts)))
        # index addresses the exchanged tensor
        ext = nbr.plan.exchange(points)
        valid = nbr.index >= 0
        if not torch.equal(ext[nbr.index[valid]], full[nbr.global_index()[valid]]):
            failures.append(("exchange", seed, layout))
        kn = knn(points, queries, k)
        if kn.global_index().tolist() != reference(full, qfull[lo:hi], k=k).tolist():
            failures.append(("knn", seed, layout))
    return failures


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_sharded_equals_single_process(world_size):
    results = run_distributed(_check_cases, world_size, CASES)
    assert results == [[]] * world_size


IDS_CASES = [
    # (seed, partition method, radius, k, self_query): a lattice with duplicates, so that many
    # neighbours tie exactly at the truncation boundary
    (10, "rcb", 0.25, 5, True),
    (11, "hilbert", 0.5, 9, True),
    (12, "morton", 0.25, 3, False),
    (13, "rcb", 0.75, 14, False),
]


def _ids_invariance(cases):
    mesh = ms.init_mesh()
    world, rank = dist.get_world_size(), dist.get_rank()
    failures = []
    for seed, method, radius, k, self_query in cases:
        cloud = grid_cloud(220, seed, span=5)
        part = partition(cloud, world, method=method)
        points = ms.scatter(cloud, part, mesh)
        ids = ms.scatter(torch.arange(cloud.shape[0]), part, mesh)  # each point's row in the cloud
        if self_query:
            queries, qrows = points, part.perm
        else:
            qcloud = grid_cloud(70, seed + 50, span=5)
            qpart = partition(qcloud, world, method="hilbert" if method != "hilbert" else "rcb")
            queries, qrows = ms.scatter(qcloud, qpart, mesh), qpart.perm
        qlocal = (cloud if self_query else qcloud)[qrows[queries.offsets[rank] : queries.offsets[rank + 1]]]
        with ms.CommCounter() as cc:
            nbr = ball_query(points, queries, radius, k, ids=ids)
        # the reference runs on the unpartitioned cloud: its index is the id
        if nbr.global_ids().tolist() != reference(cloud, qlocal, radius=radius, k=k).tolist():
            failures.append(("ball_query", seed, method))
        if cc.counts["all_to_all"] != (4 if world > 1 else 0):
            failures.append(("collectives", seed, dict(cc.counts)))
        got = knn(points, queries, k, ids=ids).global_ids()
        if got.tolist() != reference(cloud, qlocal, k=k).tolist():
            failures.append(("knn", seed, method))
    return failures


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_ids_make_ties_partition_invariant(world_size):
    results = run_distributed(_ids_invariance, world_size, IDS_CASES)
    assert results == [[]] * world_size


def _bad_sharded_ids():
    mesh = ms.init_mesh()
    world = dist.get_world_size()
    pts = ms.ShardTensor.from_local(torch.zeros(3, 3), mesh, sizes=[3] * world)
    ids = ms.ShardTensor.from_local(torch.arange(2), mesh, sizes=[2] * world)
    msgs = []
    for bad in (ids, torch.arange(3)):
        try:
            ball_query(pts, None, 1.0, 2, ids=bad)
        except (TypeError, ValueError) as e:
            msgs.append(str(e))
    return msgs


def test_bad_sharded_ids_raise_on_every_rank():
    results = run_distributed(_bad_sharded_ids, 2)
    for msgs in results:
        assert len(msgs) == 2
        assert "ids must be a 1-d ShardTensor with the points' sharding sizes (3, 3)" in msgs[0]
        assert "both ShardTensors or both plain tensors" in msgs[1]


def _nan_on_rank_one(backend):
    """ball_query and knn by default (no MESHSHARD_VALIDATE) with a NaN row on rank 1 only."""
    mesh = ms.init_mesh()
    world = dist.get_world_size()
    sizes = [4, 4, 1] if world == 3 else [5, 4]
    pts = torch.rand(9, 3, generator=torch.Generator().manual_seed(0))
    bad = pts.clone()
    bad[6, 0] = float("nan")  # rank 1 either way
    x, y = ms.scatter(pts, sizes, mesh), ms.scatter(bad, sizes, mesh)
    calls = {
        "ball_query points": lambda: ball_query(y, None, 0.5, 4, backend=backend),
        "ball_query queries": lambda: ball_query(x, y, 0.5, 4, backend=backend),
        "knn points": lambda: knn(y, None, 3, backend=backend),
        "knn queries": lambda: knn(x, y, 3, backend=backend),
    }
    found = {}
    for name, call in calls.items():
        try:
            call()
        except ValueError as exc:
            found[name] = str(exc)
    return found


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("backend", OWN_BACKENDS)
def test_nan_on_one_rank_raises_the_same_error_on_every_rank(world_size, backend):
    # no rank runs a kernel on the NaN shard, and none is left waiting in a collective
    for rank, found in enumerate(run_distributed(_nan_on_rank_one, world_size, backend)):
        assert found == {
            f"{op} {name}": f"[rank {rank}] {name} must be finite (found 1 row with NaN/Inf, first at row 6, on rank 1)"
            for op in ("ball_query", "knn")
            for name in ("points", "queries")
        }, found


def _mesh_errors():
    mesh = ms.init_mesh()
    other = ms.init_mesh()
    pts = ms.ShardTensor.from_local(torch.zeros(3, 3), mesh, sizes=[3] * dist.get_world_size())
    q_other = ms.ShardTensor.from_local(torch.zeros(2, 3), other, sizes=[2] * dist.get_world_size())
    msgs = []
    for queries, exc in [(q_other, ShardingError), (torch.zeros(2, 3), TypeError)]:
        try:
            ball_query(pts, queries, 1.0, 2)
        except exc as e:
            msgs.append(str(e))
    return msgs


def test_different_meshes_raise():
    (msgs,) = run_distributed(_mesh_errors, 1)
    assert len(msgs) == 2
    assert "same mesh axis" in msgs[0] and "both be ShardTensors" in msgs[1]
