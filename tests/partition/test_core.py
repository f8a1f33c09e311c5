"""``meshshard/partition/_core.py``: ``partition()`` with every method.

* partition(): exact small cases, invariants, balance, weights, fractions, edge cases, bad input.
* Property tests (hypothesis) over random clouds, part counts, weights and fractions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshshard.partition import partition

from ._helpers import check_invariants

# -- Exact small cases, invariants, balance, weights, fractions, edge cases ------------------------------
METHODS = ["rcb", "morton", "hilbert"]


def _cloud(n: int, dim: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, dim, generator=torch.Generator().manual_seed(seed))


def _line(n: int) -> torch.Tensor:
    return torch.stack([torch.arange(n, dtype=torch.float32), torch.zeros(n)], dim=1)


# ---------------------------------------------------------------- exact small cases
def test_rcb_line_two_parts_exact():
    pts = torch.tensor([[0.0, 0.0], [3.0, 0.0], [1.0, 0.0], [2.0, 0.0]])
    part = partition(pts, 2)
    assert part.owner.tolist() == [0, 1, 0, 1]
    assert part.perm.tolist() == [0, 2, 1, 3]
    assert part.sizes.tolist() == [2, 2] and part.offsets.tolist() == [0, 2, 4]
    assert part.regions.tolist() == [
        [[-np.inf, -np.inf], [1.5, np.inf]],
        [[1.5, -np.inf], [np.inf, np.inf]],
    ]
    assert part.boxes.tolist() == [[[0.0, 0.0], [1.0, 0.0]], [[2.0, 0.0], [3.0, 0.0]]]
    assert part.method == "rcb" and part.params["dim"] == 2 and part.params["weighted"] is False


def test_rcb_grid_quadrants_exact():
    # 4 x 4 grid, longer x extent first: cut x at 1.5, then each half cut in y at 1.5
    xs, ys = torch.meshgrid(
        torch.arange(4.0, dtype=torch.float64), torch.arange(4.0, dtype=torch.float64), indexing="ij"
    )
    pts = torch.stack([xs.reshape(-1) * 1.01, ys.reshape(-1)], 1)
    part = partition(pts, 4)
    expected = (pts[:, 0] > 1.6).long() * 2 + (pts[:, 1] > 1.5).long()
    assert part.owner.tolist() == expected.tolist()
    assert part.regions[0].tolist() == [[-np.inf, -np.inf], [1.5 * 1.01, 1.5]]
    assert part.regions[3].tolist() == [[1.5 * 1.01, 1.5], [np.inf, np.inf]]


def test_rcb_three_parts_splits_ceil_then_floor():
    # root: parts {0, 1} get 6 of 9 points, part {2} gets 3; then 3 / 3
    part = partition(_line(9), 3)
    assert part.owner.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert part.regions[:, :, 0].tolist() == [[-np.inf, 2.5], [2.5, 5.5], [5.5, np.inf]]


def test_rcb_weighted_median_exact():
    part = partition(_line(4), 2, weights=torch.tensor([3.0, 1.0, 1.0, 1.0]))
    assert part.owner.tolist() == [0, 1, 1, 1]
    assert part.params["weighted"] is True


@pytest.mark.parametrize("method", METHODS)
def test_fractions_exact(method):
    part = partition(_line(8), 2, method=method, fractions=[0.25, 0.75])
    assert part.sizes.tolist() == [2, 6]
    assert part.params["fractions"] == [0.25, 0.75]


def test_nearest_boundary_rounds_each_cut():
    # 10 points, 3 parts: boundaries at 3.33 -> 3 and 6.67 -> 7
    for method in METHODS:
        assert partition(_line(10), 3, method=method).sizes.tolist() == [3, 4, 3]


@pytest.mark.parametrize("method", ["morton", "hilbert"])
def test_curve_methods_on_a_line_cut_in_order(method):
    part = partition(_line(6), 3, method=method)
    assert part.owner.tolist() == [0, 0, 1, 1, 2, 2]
    assert torch.equal(part.regions, part.boxes)
    assert part.params["bits"] == 31


# ---------------------------------------------------------------- invariants and balance
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("num_parts", [1, 2, 3, 5, 8, 13])
def test_invariants_random_cloud(method, dim, num_parts):
    pts = _cloud(997, dim, seed=num_parts)
    check_invariants(pts, partition(pts, num_parts, method=method))


@pytest.mark.parametrize("method", METHODS)
def test_unweighted_balance_within_one_point_large(method):
    pts = _cloud(30_011, seed=1)
    part = partition(pts, 24, method=method)
    assert float((part.sizes.double() - 30_011 / 24).abs().max()) <= 1.0


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("num_parts", [2, 7, 16])
def test_weighted_balance_within_5_percent(method, num_parts):
    pts = _cloud(5000, seed=2)
    w = torch.rand(5000, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 10 + 0.5
    part = partition(pts, num_parts, method=method, weights=w)
    load = torch.zeros(num_parts, dtype=torch.float64).index_add_(0, part.owner, w)
    target = w.sum() / num_parts
    assert float((load - target).abs().max()) <= float(w.max())  # within one point weight
    assert float((load / target - 1).abs().max()) < 0.05


@pytest.mark.parametrize("method", METHODS)
def test_weighted_with_fractions(method):
    pts = _cloud(4000, seed=4)
    w = torch.rand(4000, generator=torch.Generator().manual_seed(5)) + 0.1
    fractions = [0.1, 0.2, 0.3, 0.4]
    part = partition(pts, 4, method=method, weights=w, fractions=fractions)
    load = torch.zeros(4, dtype=torch.float64).index_add_(0, part.owner, w.double())
    target = w.double().sum() * torch.tensor(fractions, dtype=torch.float64)
    assert float((load / target - 1).abs().max()) < 0.05


@pytest.mark.parametrize("method", METHODS)
def test_uneven_fractions_honoured(method):
    pts = _cloud(3001, seed=6)
    fractions = [0.5, 0.125, 0.125, 0.25]
    part = partition(pts, 4, method=method, fractions=fractions)
    check_invariants(pts, part, fractions)


@pytest.mark.parametrize("method", METHODS)
def test_zero_fraction_gives_empty_part(method):
    pts = _cloud(100, seed=7)
    part = partition(pts, 3, method=method, fractions=[0.5, 0.0, 0.5])
    assert part.sizes.tolist() == [50, 0, 50]
    check_invariants(pts, part, [0.5, 0.0, 0.5])


def test_weighted_zero_weight_points_are_assigned():
    pts = _cloud(200, seed=8)
    w = torch.zeros(200)
    w[::10] = 1.0
    for method in METHODS:
        part = partition(pts, 4, method=method, weights=w)
        assert int(part.sizes.sum()) == 200
        load = torch.zeros(4).index_add_(0, part.owner, w)
        assert load.tolist() == [5.0, 5.0, 5.0, 5.0]


def test_rcb_regions_tile_the_cut_tree():
    pts = _cloud(2000, seed=9)
    part = partition(pts, 6)
    inf = part.regions.isinf()
    # every region is unbounded on at least one outer face, and regions do not overlap in volume
    assert bool(inf.any(dim=(1, 2)).all())
    probe = _cloud(5000, seed=10) * 1.2 - 0.1
    inside = (probe[:, None, :] > part.regions[None, :, 0]) & (probe[:, None, :] < part.regions[None, :, 1])
    assert bool((inside.all(dim=2).sum(dim=1) <= 1).all())
    assert bool(
        ((probe[:, None, :] >= part.regions[None, :, 0]) & (probe[:, None, :] <= part.regions[None, :, 1]))
        .all(2)
        .any(1)
        .all()
    )


def test_rcb_cuts_longest_axis_first():
    pts = _cloud(1000, seed=11) * torch.tensor([1.0, 5.0, 2.0])
    part = partition(pts, 2)
    left_hi = part.regions[0, 1]
    assert torch.isfinite(left_hi).tolist() == [False, True, False]


# ---------------------------------------------------------------- determinism, dtypes, inputs
@pytest.mark.parametrize("method", METHODS)
def test_deterministic_bit_for_bit(method):
    pts = _cloud(3000, seed=12)
    pts[100:200] = pts[0]  # duplicates make ties
    w = torch.rand(3000, generator=torch.Generator().manual_seed(13))
    a = partition(pts, 7, method=method, weights=w)
    b = partition(pts.clone(), 7, method=method, weights=w.clone())
    assert torch.equal(a.perm, b.perm) and torch.equal(a.sizes, b.sizes)
    assert torch.equal(a.regions, b.regions) and torch.equal(a.boxes, b.boxes)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("method", METHODS)
def test_float_dtypes(dtype, method):
    pts = _cloud(500, seed=14).to(dtype)
    part = partition(pts, 5, method=method)
    assert part.boxes.dtype == dtype and part.regions.dtype == dtype
    check_invariants(pts, part)


def test_numpy_and_integer_and_data_inputs():
    pts = _cloud(300, seed=15)
    ref = partition(pts, 4)
    assert torch.equal(partition(pts.numpy(), 4).perm, ref.perm)
    grid = torch.randint(0, 50, (300, 3), generator=torch.Generator().manual_seed(16))
    check_invariants(grid.double(), partition(grid, 4))
    import torch_geometric
    data = torch_geometric.data.Data(pos=pts)
    assert torch.equal(partition(data, 4).perm, ref.perm)


# ---------------------------------------------------------------- edge cases
@pytest.mark.parametrize("method", METHODS)
def test_all_duplicate_points(method):
    pts = torch.full((101, 3), 0.5)
    part = partition(pts, 4, method=method)
    check_invariants(pts, part)
    assert part.sizes.tolist() in ([25, 25, 26, 25], [25, 26, 25, 25], [25, 25, 25, 26], [26, 25, 25, 25])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("flat_axes", [(2,), (0, 2)])
def test_points_on_a_plane_or_line(method, flat_axes):
    pts = _cloud(400, seed=17)
    pts[:, list(flat_axes)] = 1.0
    part = partition(pts, 6, method=method)
    check_invariants(pts, part)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("n", [0, 1, 3])
def test_fewer_points_than_parts(method, n):
    pts = _cloud(n, seed=18)
    part = partition(pts, 8, method=method)
    assert part.num_parts == 8 and int(part.sizes.sum()) == n
    assert int((part.sizes == 0).sum()) == 8 - n
    check_invariants(pts, part)


@pytest.mark.parametrize("method", METHODS)
def test_one_part(method):
    pts = _cloud(50, seed=19)
    part = partition(pts, 1, method=method)
    assert part.sizes.tolist() == [50] and part.perm.tolist() == list(range(50))
    if method == "rcb":
        assert bool(part.regions.isinf().all())


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"points": torch.tensor([[0.0, float("nan"), 0.0]])}, ValueError, r"points must be finite .*row 0"),
        ({"points": torch.tensor([[0.0, 0.0, 0.0], [float("inf"), 0, 0]])}, ValueError, r"first at row 1"),
        (
            {"points": torch.zeros(4, 4)},
            ValueError,
            r"points must have shape \(N, 2\) or \(N, 3\) \(got \(4, 4\)\)",
        ),
        ({"points": torch.zeros(4)}, ValueError, r"got \(4,\)"),
        (
            {"points": [[0.0, 0.0, 0.0]]},
            TypeError,
            r"points must be a torch.Tensor or numpy.ndarray .*got list",
        ),
        ({"points": torch.zeros(3, 3, dtype=torch.bool)}, TypeError, r"real numbers \(got torch.bool\)"),
        ({"num_parts": 0}, ValueError, r"num_parts must be at least 1 \(got 0\)"),
        ({"num_parts": -2}, ValueError, r"num_parts must be at least 1 \(got -2\)"),
        ({"num_parts": 2.5}, TypeError, r"num_parts must be an integer \(got float\)"),
        ({"num_parts": True}, TypeError, r"num_parts must be an integer \(got bool\)"),
        ({"method": "kd"}, ValueError, r"method must be one of \('rcb', 'morton', 'hilbert'\) \(got 'kd'\)"),
        ({"method": 3}, TypeError, r"method must be a string \(got int\)"),
        ({"weights": -torch.ones(10)}, ValueError, r"weights must be non-negative \(found 10 negative"),
        (
            {"weights": torch.ones(9)},
            ValueError,
            r"weights must have shape \(10,\) like points \(got \(9,\)\)",
        ),
        ({"weights": torch.full((10,), float("nan"))}, ValueError, r"weights must be finite"),
        ({"weights": torch.zeros(10)}, ValueError, r"weights must have a positive sum"),
        ({"weights": "heavy"}, TypeError, r"weights must be a torch.Tensor"),
        ({"fractions": [0.5, 0.4]}, ValueError, r"fractions must sum to 1 \(got sum 0.9\)"),
        ({"fractions": [0.5, 0.25, 0.25]}, ValueError, r"fractions must have shape \(2,\) = \(num_parts,\)"),
        ({"fractions": [1.5, -0.5]}, ValueError, r"fractions must be non-negative"),
        ({"fractions": [float("nan"), 1.0]}, ValueError, r"fractions must be finite"),
    ],
)
def test_bad_input(kwargs, error, match):
    args = {"points": _cloud(10, seed=20), "num_parts": 2, **kwargs}
    with pytest.raises(error, match=match):
        partition(**args)


def test_pyvista_dataset_points_to_partition_mesh():
    import pyvista as pv
    with pytest.raises(TypeError, match="use meshshard.partition.partition_mesh"):
        partition(pv.Sphere(), 2)


def test_rcb_cuts_through_the_sparsest_median_plane():
    # two bands along x (extent 2) separated by a gap in y (extent 1): the longest axis is x, but
    # the median plane in y crosses the gap, where a cut costs no ghosts
    gen = torch.Generator().manual_seed(21)
    pts = torch.rand(2000, 2, generator=gen, dtype=torch.float64) * torch.tensor([2.0, 0.3])
    pts[1000:, 1] += 0.7
    part = partition(pts, 2)
    assert torch.isfinite(part.regions[0, 1]).tolist() == [False, True]
    assert part.owner.tolist() == [0] * 1000 + [1] * 1000
    assert 0.3 <= float(part.regions[0, 1, 1]) <= 0.7


def test_axis_rule_longest_is_classic_rcb():
    gen = torch.Generator().manual_seed(21)
    pts = torch.rand(2000, 2, generator=gen, dtype=torch.float64) * torch.tensor([2.0, 0.3])
    pts[1000:, 1] += 0.7
    part = partition(pts, 2, axis_rule="longest")
    assert torch.isfinite(part.regions[0, 1]).tolist() == [True, False]
    assert part.params["axis_rule"] == "longest"
    check_invariants(pts, part)
    with pytest.raises(ValueError, match=r"axis_rule must be 'density' or 'longest' \(got 'x'\)"):
        partition(pts, 2, axis_rule="x")


def test_points_requiring_grad_are_detached():
    pts = torch.rand(50, 3, generator=torch.Generator().manual_seed(22)).requires_grad_()
    part = partition(pts, 3, weights=torch.ones(50, requires_grad=True))
    assert not part.boxes.requires_grad and not part.regions.requires_grad


# -- Properties (hypothesis) -----------------------------------------------------------------------------
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)


@st.composite
def clouds(draw):
    """Random clouds with duplicates, flat axes and clusters: integer grids scaled, N in 0..200."""
    n = draw(st.integers(0, 200))
    dim = draw(st.sampled_from([2, 3]))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    levels = draw(st.sampled_from([1, 3, 50, 10**6]))  # few levels: many ties and duplicates
    pts = rng.integers(0, levels, size=(n, dim)).astype(np.float64)
    pts *= rng.uniform(0.01, 100.0, size=dim)
    if n and draw(st.booleans()):
        pts[:, draw(st.integers(0, dim - 1))] = 0.0  # zero extent on one axis
    return torch.from_numpy(pts), seed


@SETTINGS
@given(clouds(), st.integers(1, 20), st.sampled_from(["rcb", "morton", "hilbert", "rcb-longest"]))
def test_invariants_hold(cloud, num_parts, method):
    pts, _ = cloud
    kwargs = {"method": "rcb", "axis_rule": "longest"} if method == "rcb-longest" else {"method": method}
    part = partition(pts, num_parts, **kwargs)
    check_invariants(pts, part)
    again = partition(pts, num_parts, **kwargs)
    assert torch.equal(again.perm, part.perm) and torch.equal(again.regions, part.regions)


@SETTINGS
@given(clouds(), st.integers(1, 12), st.sampled_from(["rcb", "morton", "hilbert"]))
def test_weighted_parts_within_one_point_weight_of_target(cloud, num_parts, method):
    pts, seed = cloud
    n = pts.shape[0]
    rng = np.random.default_rng(seed + 1)
    w = torch.from_numpy(rng.uniform(0.0, 5.0, size=n))
    if n == 0 or float(w.sum()) == 0.0:
        return
    part = partition(pts, num_parts, method=method, weights=w)
    load = torch.zeros(num_parts, dtype=torch.float64).index_add_(0, part.owner, w)
    target = w.sum() / num_parts
    assert float((load - target).abs().max()) <= float(w.max()) * (1 + 1e-9)
    region = part.regions[part.owner]
    assert bool(((pts >= region[:, 0]) & (pts <= region[:, 1])).all())


@SETTINGS
@given(clouds(), st.lists(st.integers(0, 10), min_size=1, max_size=10), st.sampled_from(["rcb", "hilbert"]))
def test_fractions_honoured(cloud, shares, method):
    pts, _ = cloud
    if sum(shares) == 0:
        shares = [1] * len(shares)
    fractions = [s / sum(shares) for s in shares]
    part = partition(pts, len(shares), method=method, fractions=fractions)
    check_invariants(pts, part, fractions)
