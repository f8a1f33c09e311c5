"""``meshshard/_checks.py``: the shared argument validators and their messages."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from meshshard._checks import (
    check_choice,
    check_finite_points,
    check_int_sequence,
    check_nonnegative,
    check_points,
    check_positive_int,
    check_positive_real,
    check_radius,
    nonfinite_message,
    nonfinite_rows,
    nonnegative_problem,
    points_problem,
)


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


def test_nonfinite_rows_and_message_are_the_parts_of_points_problem():
    pts = torch.zeros(5, 2)
    assert nonfinite_rows(pts) == (0, -1)
    pts[3, 0], pts[4, 1] = float("inf"), float("nan")
    assert nonfinite_rows(pts) == (2, 3)
    # the message agreed over ranks names them
    assert nonfinite_message("points", 1, 7, [1]) == (
        "points must be finite (found 1 row with NaN/Inf, first at row 7, on rank 1)"
    )
    assert nonfinite_message("queries", 3, 0, [0, 2]).endswith("first at row 0, on ranks 0, 2)")


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


# -- sequences of ints, choices ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [([3, 0, 2], (3, 0, 2)), ((1,), (1,)), (torch.tensor([4, 5]), (4, 5)), (np.array([2, 2]), (2, 2)), ([2.0], (2,))],
)
def test_check_int_sequence_returns_a_tuple_of_python_ints(value, expected):
    out = check_int_sequence(value, "sizes")
    assert out == expected and all(type(v) is int for v in out)


@pytest.mark.parametrize(
    "value, options, error, match",
    [
        ("12", {}, T, r"^sizes must be a sequence of ints \(got str\)$"),
        (3, {}, T, r"^sizes must be a sequence of ints \(got int\)$"),
        (torch.tensor([1.0]), {}, T, r"^sizes must be a 1-D integer tensor or a sequence of ints \(got torch.float32"),
        (torch.ones(2, 2, dtype=torch.long), {}, T, r"1-D integer tensor .*of shape \(2, 2\)\)$"),
        ([1, True], {}, T, r"^sizes must hold ints \(got bool in \[1, True\]\)$"),
        ([1, 2.5], {}, T, r"^sizes must hold ints \(got 2.5\)$"),
        ([1, "2"], {}, T, r"^sizes must hold ints \(got str in \[1, '2'\]\)$"),
        ([], {"nonempty": True}, T, r"^sizes must be a non-empty sequence of ints \(got \[\]\)$"),
        ([2, -1], {}, V, r"^sizes must be non-negative \(got \(2, -1\)\)$"),
        ([2, 0], {"minimum": 1}, V, r"^sizes must be positive \(got \(2, 0\)\)$"),
        ([2, 3], {"minimum": 4}, V, r"^sizes must be at least 4 \(got \(2, 3\)\)$"),
    ],
)
def test_check_int_sequence_names_the_argument_and_what_it_found(value, options, error, match):
    with pytest.raises(error, match=match):
        check_int_sequence(value, "sizes", **options)


def test_check_int_sequence_without_a_minimum_leaves_the_range_to_the_caller():
    assert check_int_sequence([-1, 5], "new_sizes", minimum=None) == (-1, 5)
    assert check_int_sequence([], "sizes") == ()


def test_check_choice_names_the_choices():
    assert check_choice("rcb", "method", ("rcb", "morton")) == "rcb"
    assert check_choice(None, "compression", (None, "zlib")) is None
    with pytest.raises(ValueError, match=r"^method must be one of \('rcb', 'morton'\) \(got 'kd'\)$"):
        check_choice("kd", "method", ("rcb", "morton"))
    with pytest.raises(ValueError, match=r"^method must be one of \('rcb',\) \(got 3\)$"):
        check_choice(3, "method", ["rcb"])
    with pytest.raises(TypeError, match=r"^method must be a string \(got int\)$"):
        check_choice(3, "method", ("rcb",), strings=True)


def test_nonnegative_problem_counts_and_locates_the_first_bad_value():
    assert nonnegative_problem(torch.tensor([0.0, 2.0]), "weights") is None
    w = torch.tensor([1.0, -2.0, float("nan"), -3.0])
    assert nonnegative_problem(w, "weights") == "weights must be finite (found 1 NaN/Inf values, first at index 2)"
    w[2] = 0.0
    assert nonnegative_problem(w, "weights", first_index=10) == (
        "weights must be non-negative (found 2 negative values, first -2.0 at index 11)"
    )
    with pytest.raises(ValueError, match=r"^fractions must be non-negative \(found 1 negative values, first -0.5 at"):
        check_nonnegative(torch.tensor([1.5, -0.5]), "fractions")
    ok = torch.tensor([0.5, 0.5])
    assert check_nonnegative(ok, "fractions") is ok


def test_check_positive_real_with_and_without_zero():
    assert check_positive_real(2, "lr") == 2.0 and type(check_positive_real(2, "lr")) is float
    assert check_positive_real(0, "weight_decay", zero=True) == 0.0
    with pytest.raises(ValueError, match=r"^lr must be positive and finite \(got 0.0\)$"):
        check_positive_real(0, "lr")
    with pytest.raises(ValueError, match=r"^weight_decay must be non-negative and finite \(got -1.0\)$"):
        check_positive_real(-1, "weight_decay", zero=True)
    with pytest.raises(ValueError, match=r"^weight_decay must be non-negative and finite \(got inf\)$"):
        check_positive_real(float("inf"), "weight_decay", zero=True)
    with pytest.raises(TypeError, match=r"^timeout must be a real number \(got str\)$"):
        check_positive_real("5", "timeout")
