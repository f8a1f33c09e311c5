"""Argument validators shared by every layer: one implementation each, messages that name the argument.

Each takes ``name=`` so the error says which argument was wrong and what was found, e.g.
``radius must be positive and finite (got -1.0)`` or ``num_parts must be at least 1 (got 0)``.
This module imports nothing from meshshard, so the lowest layer (the partitioner) can use it, and
neither torch nor numpy (numpy's scalars are ``numbers.Real``/``__index__``; a tensor can only be
passed once torch is imported), so the CLI's ``--help`` stays light.
"""

from __future__ import annotations

import math
import numbers
import operator
import sys

__all__ = ["check_positive_int", "check_radius"]


def check_radius(radius: object, name: str = "radius") -> float:
    """``radius`` as a positive finite float, else a ``TypeError``/``ValueError`` naming ``name``.

    Accepts Python and numpy real numbers and one-element real tensors; ``bool`` is refused.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(radius, torch.Tensor) and radius.numel() == 1 and not radius.is_complex():
        radius = radius.item()
    if isinstance(radius, bool) or not isinstance(radius, numbers.Real):
        raise TypeError(f"{name} must be a real number (got {type(radius).__name__})")
    value = float(radius)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be positive and finite (got {value})")
    return value


def check_positive_int(value: object, name: str, *, allow_none: bool = False) -> int | None:
    """``value`` as an ``int >= 1`` (``None`` passes when ``allow_none``), else an error naming ``name``.

    Accepts anything with ``__index__`` (Python and numpy integers); ``bool`` and floats are refused.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer (got bool)")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer (got {type(value).__name__})") from None
    if number < 1:
        raise ValueError(f"{name} must be at least 1 (got {number})")
    return number
