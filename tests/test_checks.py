"""``meshshard/_checks.py``: the shared argument validators and their messages."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from meshshard._checks import check_finite_points, check_points, check_positive_int, check_radius, points_problem


@pytest.mark.parametrize("value", [0.5, 2, np.float32(0.25), np.int64(3), torch.tensor(0.5), torch.tensor([1.5])])
def test_check_radius_accepts_real_positive_finite_numbers(value):
    assert check_radius(value) == pytest.approx(float(value if not isinstance(value, torch.Tensor) else value.item()))


@pytest.mark.parametrize(
    "value, error, match",
    [
        (-1.0, ValueError, r"radius must be positive and finite \(got -1.0\)"),
        (0, ValueError, r"radius must be positive and finite \(got 0.0\)"),
        (float("nan"), ValueError, r"radius must be positive and finite \(got nan\)"),
        (float("inf"), ValueError, r"radius must be positive and finite \(got inf\)"),
        ("1", TypeError, r"radius must be a real number \(got str\)"),
        (True, TypeError, r"radius must be a real number \(got bool\)"),
        (1j, TypeError, r"radius must be a real number \(got complex\)"),
        (torch.tensor([1.0, 2.0]), TypeError, r"radius must be a real number \(got Tensor\)"),
    ],
)
def test_check_radius_names_the_argument_and_what_it_found(value, error, match):
    with pytest.raises(error, match=match):
        check_radius(value)
    with pytest.raises(error, match=match.replace("radius", "ghost_radius", 1)):
        check_radius(value, "ghost_radius")


@pytest.mark.parametrize("value", [1, 7, np.int32(4), torch.tensor(3)])
def test_check_positive_int_accepts_integers_from_one(value):
    assert check_positive_int(value, "k") == int(value) and type(check_positive_int(value, "k")) is int


@pytest.mark.parametrize(
    "value, error, match",
    [
        (0, ValueError, r"k must be at least 1 \(got 0\)"),
        (-3, ValueError, r"k must be at least 1 \(got -3\)"),
        (2.0, TypeError, r"k must be an integer \(got float\)"),
        ("2", TypeError, r"k must be an integer \(got str\)"),
        (True, TypeError, r"k must be an integer \(got bool\)"),
        (None, TypeError, r"k must be an integer \(got NoneType\)"),
    ],
)
def test_check_positive_int_names_the_argument_and_what_it_found(value, error, match):
    with pytest.raises(error, match=match):
        check_positive_int(value, "k")


def test_check_positive_int_lets_none_through_only_when_asked():
    assert check_positive_int(None, "num_points", allow_none=True) is None
    assert check_positive_int(5, "num_points", allow_none=True) == 5


# -- points ------------------------------------------------------------------------------------------


def test_check_points_returns_the_tensor_and_converts_only_when_asked():
    pts = torch.rand(5, 3)
    assert check_points(pts) is pts
    arr = np.arange(6, dtype=np.float32).reshape(3, 2)
    out = check_points(arr, arrays=True, dims=(2, 3))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.data_ptr() == arr.ctypes.data
    ints = check_points(torch.arange(6).reshape(2, 3), integers=True)
    assert ints.dtype == torch.float64 and ints.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert check_points(np.ones((2, 3), dtype=np.int32), arrays=True, integers=True).dtype == torch.float64
    assert check_points(torch.zeros(0, 7)).shape == (0, 7)  # any D by default, empty is fine


T, V = TypeError, ValueError


@pytest.mark.parametrize(
    "value, options, error, match",
    [
        ("x", {}, T, r"^points must be a torch.Tensor of shape \(N, D\) \(got str\)$"),
        ("x", {"sharded": True}, T, r"^points must be a torch.Tensor or ShardTensor of shape \(N, D\) \(got str\)$"),
        (
            [[0.0, 1.0]],
            {"arrays": True, "dims": (2, 3)},
            T,
            r"^points must be a torch.Tensor or numpy.ndarray of shape \(N, 2\) or \(N, 3\) \(got list\)$",
        ),
        (np.ones((2, 3)), {}, T, r"points must be a torch.Tensor of shape \(N, D\) \(got ndarray\)"),
        (np.array([["a", "b"]]), {"arrays": True}, T, r"^points must hold real numbers \(got numpy dtype <U1\)$"),
        (torch.ones(2, 3).long(), {}, T, r"^points must hold floating-point coordinates \(got torch.int64\)"),
        (torch.ones(2, 3, dtype=torch.bool), {}, T, r"floating-point coordinates \(got torch.bool\)"),
        (torch.ones(2, 3).bool(), {"integers": True}, T, r"^points must hold real numbers \(got torch.bool\)$"),
        (torch.ones(2, 3, dtype=torch.complex64), {"integers": True}, T, r"real numbers \(got torch.complex64\)"),
        (np.ones((2, 3), dtype=np.int64), {"arrays": True}, T, r"floating-point coordinates \(got torch.int64\)"),
        (torch.ones(3), {}, V, r"^points must have shape \(N, D\) \(got \(3,\)\)$"),
        (torch.ones(2, 3, 1), {}, V, r"^points must have shape \(N, D\) \(got \(2, 3, 1\)\)$"),
        (torch.ones(2, 4), {"dims": (2, 3)}, V, r"^points must have shape \(N, 2\) or \(N, 3\) \(got \(2, 4\)\)$"),
        (torch.ones(2, 1), {"dims": (3,)}, V, r"^points must have shape \(N, 3\) \(got \(2, 1\)\)$"),
    ],
)
def test_check_points_names_the_argument_and_what_it_found(value, options, error, match):
    with pytest.raises(error, match=match):
        check_points(value, **options)
    with pytest.raises(error, match=match.replace("points", "queries", 1)):
        check_points(value, "queries", **options)


def test_points_problem_numbers_the_first_bad_row_and_counts_rows_not_values():
    pts = torch.zeros(6, 3)
    assert points_problem(pts) is None
    pts[4] = float("nan")  # three bad values, one row
    assert points_problem(pts) == "points must be finite (found 1 row with NaN/Inf, first at row 4)"
    pts[2, 1] = float("-inf")
    assert points_problem(pts, "x") == "x must be finite (found 2 rows with NaN/Inf, first at row 2)"
    # a shard numbers its rows as the global tensor does
    assert points_problem(pts, first_row=10) == "points must be finite (found 2 rows with NaN/Inf, first at row 12)"
    assert points_problem(torch.zeros(0, 3)) is None


def test_points_problem_refuses_data_less_tensors():
    assert points_problem(torch.empty(4, 3, device="meta")) == (
        "points must hold data on a real device such as cpu or cuda (got a tensor on the 'meta' device)"
    )


def test_check_finite_points_raises_the_problem_or_returns_the_points():
    pts = torch.rand(3, 2)
    assert check_finite_points(pts) is pts
    pts[1, 0] = float("inf")
    with pytest.raises(ValueError, match=r"^weights must be finite \(found 1 row with NaN/Inf, first at row 1\)$"):
        check_finite_points(pts, "weights")


def test_checks_module_imports_neither_torch_nor_numpy():
    code = (
        "import sys; import meshshard._checks; "
        "print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
