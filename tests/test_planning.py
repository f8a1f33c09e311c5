"""The planner (meshshard/planning.py): its ghost estimate against the exact simulation, exact part sizes,
a cloud without gaps, the model it sizes, its argument checks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from meshshard.nn import TransolverConfig
from meshshard.partition import partition
from meshshard.planning import activation_bytes_per_point, car_cloud, fit_ghost_model, part_sizes, plan


@pytest.mark.parametrize(("kind", "num_points", "parts"), [("surface", 160_000, 8), ("volume", 160_000, 16)])
def test_estimate_within_ten_percent_of_exact(kind, num_points, parts):
    exact = plan(num_points=num_points, parts=parts, kind=kind, sample=num_points)
    est = plan(num_points=num_points, parts=parts, kind=kind, sample=num_points // 5)
    assert exact["exact"] and not est["exact"]
    assert [r["points"] for r in est["ranks"]] == [r["points"] for r in exact["ranks"]]
    ghosts_exact = sum(r["ghosts"] for r in exact["ranks"])
    ghosts_est = sum(r["ghosts"] for r in est["ranks"])
    assert abs(ghosts_est / ghosts_exact - 1) < 0.10, (ghosts_est, ghosts_exact)
    halo_exact = exact["total_halo_bytes_per_exchange"]
    assert abs(est["total_halo_bytes_per_exchange"] / halo_exact - 1) < 0.10
    assert abs(est["radius"] / exact["radius"] - 1) < 0.05
    e = est["estimate"]
    assert 0.03 <= e["error_bound"] < 0.2 and e["samples"] == [num_points // 20, num_points // 5]
    assert e["alpha"] == pytest.approx(0.5 if kind == "surface" else 2 / 3)


@pytest.mark.parametrize(("num_points", "parts"), [(10, 3), (1000, 7), (12345, 64), (5, 8)])
def test_part_sizes_are_the_partition_sizes(num_points, parts):
    pts = torch.rand(num_points, 3, generator=torch.Generator().manual_seed(num_points))
    for method in ("rcb", "hilbert"):
        assert part_sizes(num_points, parts) == partition(pts, parts, method=method).sizes.tolist()


def test_fit_ghost_model_recovers_its_coefficients():
    g = lambda n: 3.0 * n**0.5 + 7.0  # noqa: E731
    a, b, alpha = fit_ghost_model(100.0, g(100.0), 400.0, g(400.0), 2)
    assert (a, b, alpha) == (pytest.approx(3.0), pytest.approx(7.0), 0.5)


@pytest.mark.parametrize("kind", ["surface", "volume"])
def test_car_cloud_has_no_empty_planes(kind):
    pts = car_cloud(200_000, kind, seed=1).numpy()
    assert pts.shape == (200_000, 3) and pts.dtype == np.float32
    for axis in range(3):
        lo, hi = np.percentile(pts[:, axis], [5, 95])
        hist, _ = np.histogram(pts[:, axis], bins=64, range=(lo, hi))
        # A smooth density: no bin far emptier than its neighbours (the old cloud's centre planes were 100x).
        assert hist.min() > 0.2 * np.median(hist), (axis, hist.min(), np.median(hist))
    assert torch.equal(car_cloud(1000, kind, seed=1), car_cloud(1000, kind, seed=1))  # reproducible


def test_the_default_model_is_the_transolver_default():
    report = plan(num_points=500, parts=2)
    assert report["model"] == {"n_hidden": 256, "n_layers": 8, "n_head": 8, "slice_num": 32, "mlp_ratio": 2}
    assert report["model"] == TransolverConfig().__dict__
    # per block (9 + 2 * 2) * 256 + 2 * 8 * 32 floats, 8 blocks, plus 4 * 256 for the lifting MLP and head
    assert report["activation_bytes_per_point"] == activation_bytes_per_point(256, 8, 8, 32, 2) == 4 * (
        8 * (13 * 256 + 512) + 1024)
    small = plan(num_points=500, parts=2, model=TransolverConfig(n_hidden=16, n_layers=1, n_head=2, slice_num=4))
    assert small["activation_bytes_per_point"] == 4 * (1 * (13 * 16 + 16) + 64)


def test_plan_api_radius_check():
    with pytest.raises(ValueError, match=r"^radius must be positive and finite \(got -1.0\)"):
        plan(num_points=100, parts=2, radius=-1.0)


@pytest.mark.parametrize("parts", [0, -3])
def test_plan_api_parts_check(parts):
    """The library raises a ValueError in API terms (no command name, no flag); ``except Exception`` catches it."""
    with pytest.raises(ValueError, match=rf"^parts must be at least 1 \(got {parts}\)$"):
        plan(num_points=100, parts=parts)


def test_plan_is_a_typed_report_that_reads_like_a_dict():
    report = plan(num_points=400, parts=3)
    assert report.ranks[1].points == report["ranks"][1]["points"]
    assert report.estimate is None and report["exact"]
    assert json.loads(json.dumps(report.to_dict()))["ranks"][0]["rank"] == 0
    with pytest.raises(KeyError):
        report["no such field"]
