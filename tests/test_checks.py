"""``meshshard/_checks.py``: the shared argument validators and their messages."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from meshshard._checks import check_positive_int, check_radius


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
