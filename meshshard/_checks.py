"""Argument validators shared by every layer: one implementation each, messages that name the argument.

Each takes ``name=`` so the error says which argument was wrong and what was found, e.g.
``radius must be positive and finite (got -1.0)`` or ``num_parts must be at least 1 (got 0)``.
This module imports nothing from meshshard, so the lowest layer (the partitioner) can use it, and
neither torch nor numpy at import time (numpy's scalars are ``numbers.Real``/``__index__``; a tensor
or an array can only be passed once its library is imported), so the CLI's ``--help`` stays light.

Points: :func:`check_points` decides from metadata (type, dtype, shape, allowed ``D``), the same on
every rank of a ShardTensor; :func:`points_problem` is the verdict on the values of one shard (no
data, NaN/Inf rows), which :func:`check_finite_points` raises and :func:`meshshard.halo.check_coordinates`
agrees across ranks.
"""

from __future__ import annotations

import math
import numbers
import operator
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = [
    "check_choice",
    "check_finite_points",
    "check_int_sequence",
    "check_nonnegative",
    "check_points",
    "check_positive_int",
    "check_positive_real",
    "check_radius",
    "nonfinite_message",
    "nonfinite_rows",
    "nonnegative_problem",
    "points_problem",
]


def check_positive_real(value: object, name: str, *, zero: bool = False) -> float:
    """``value`` as a positive (``zero``: non-negative) finite float, else an error naming ``name``.

    Accepts Python and numpy real numbers and one-element real tensors; ``bool`` is refused.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number (got {type(value).__name__})")
    number = float(value)
    if not (math.isfinite(number) and (number >= 0 if zero else number > 0)):
        raise ValueError(f"{name} must be {'non-negative' if zero else 'positive'} and finite (got {number})")
    return number


def check_radius(radius: object, name: str = "radius") -> float:
    """``radius`` as a positive finite float (:func:`check_positive_real`), else an error naming ``name``."""
    return check_positive_real(radius, name)


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


def _shape_text(dims: tuple[int, ...] | None) -> str:
    return "(N, D)" if dims is None else " or ".join(f"(N, {d})" for d in dims)


def _tensor_of(points: object, name: str, what: str, arrays: bool) -> torch.Tensor:
    """``points`` as a tensor (a numpy array, when ``arrays``, without a copy), else a ``TypeError``."""
    import torch

    np = sys.modules.get("numpy")
    if arrays and np is not None and isinstance(points, np.ndarray):
        if points.dtype.kind not in "fiu":
            raise TypeError(f"{name} must hold real numbers (got numpy dtype {points.dtype})")
        return torch.from_numpy(np.ascontiguousarray(points))
    if not isinstance(points, torch.Tensor):
        raise TypeError(f"{name} must be a {what} (got {type(points).__name__})")
    return points


def check_points(
    points: object,
    name: str = "points",
    *,
    dims: tuple[int, ...] | None = None,
    arrays: bool = False,
    integers: bool = False,
    sharded: bool = False,
) -> torch.Tensor:
    """``points`` if it is an ``(N, D)`` tensor of real coordinates, else an error naming ``name``.

    Metadata only (type, dtype, shape; values are :func:`check_finite_points`), so a ShardTensor
    (a ``torch.Tensor`` whose shape is global) is decided alike on every rank.

    Parameters
    ----------
    dims:
        The allowed ``D`` (e.g. ``(2, 3)``); ``None``: any.
    arrays:
        Also accept a ``numpy.ndarray`` (returned as a tensor sharing its memory).
    integers:
        Convert integer coordinates to ``float64``; otherwise they are refused. ``bool`` and
        complex values are always refused.
    sharded:
        Only for the message: the caller accepts ShardTensors.
    """
    import torch

    kinds = "torch.Tensor or numpy.ndarray" if arrays else "torch.Tensor or ShardTensor" if sharded else "torch.Tensor"
    shape = _shape_text(dims)
    points = _tensor_of(points, name, f"{kinds} of shape {shape}", arrays)
    if not points.is_floating_point():
        if not integers:
            raise TypeError(f"{name} must hold floating-point coordinates (got {points.dtype})")
        if points.is_complex() or points.dtype == torch.bool:
            raise TypeError(f"{name} must hold real numbers (got {points.dtype})")
        points = points.to(torch.float64)
    if points.dim() != 2 or (dims is not None and points.shape[1] not in dims):
        raise ValueError(f"{name} must have shape {shape} (got {tuple(points.shape)})")
    return points


def points_problem(local: torch.Tensor, name: str = "points", *, first_row: int = 0) -> str | None:
    """What is wrong with the values of ``(N, D)`` coordinates, or ``None``: data-less or non-finite.

    The verdict for one rank's shard (``first_row``: the shard's first global row, so the message
    numbers rows as the global tensor does); :func:`check_finite_points` raises it. One reduction,
    which on CUDA costs one host sync.
    """
    if local.device.type == "meta":
        return f"{name} must hold data on a real device such as cpu or cuda (got a tensor on the 'meta' device)"
    count, first = nonfinite_rows(local)
    return None if count == 0 else nonfinite_message(name, count, first + first_row)


def nonfinite_rows(local: torch.Tensor) -> tuple[int, int]:
    """``(rows holding NaN/Inf, the first of them or -1)`` of ``(N, D)`` values (not on 'meta')."""
    import torch

    finite = torch.isfinite(local.detach()).all(dim=1)
    if bool(finite.all()):
        return 0, -1
    bad = (~finite).nonzero()
    return bad.numel(), int(bad[0])


def nonfinite_message(name: str, count: int, first_row: int, ranks: Sequence[int] | None = None) -> str:
    """The one wording of "``count`` rows of ``name`` hold NaN/Inf, the first at global row ``first_row``"."""
    rows = "row" if count == 1 else "rows"
    where = "" if ranks is None else f", on rank{'' if len(ranks) == 1 else 's'} {', '.join(map(str, ranks))}"
    return f"{name} must be finite (found {count} {rows} with NaN/Inf, first at row {first_row}{where})"


def check_finite_points(points: torch.Tensor, name: str = "points") -> torch.Tensor:
    """``points`` (``(N, D)``, as :func:`check_points` returns) if its values are finite, else a ``ValueError``."""
    problem = points_problem(points, name)
    if problem is not None:
        raise ValueError(problem)
    return points


def check_int_sequence(
    value: object, name: str, *, minimum: int | None = 0, nonempty: bool = False
) -> tuple[int, ...]:
    """``value`` (a sequence, array or 1-D tensor of ints) as a tuple of ints, else an error naming ``name``.

    Integral floats (``2.0``) pass; ``bool``, strings and fractional values are refused. ``minimum``:
    the smallest allowed entry (``0``: sizes, ``1``: part counts, ``None``: no bound, for a caller
    that words its own range check); ``nonempty``: refuse an empty sequence.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise TypeError(
                f"{name} must be a 1-D integer tensor or a sequence of ints (got {value.dtype} "
                f"of shape {tuple(value.shape)})"
            )
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) and not hasattr(value, "__array__"):
        raise TypeError(f"{name} must be a sequence of ints (got {type(value).__name__})")
    items = list(value)
    if nonempty and not items:
        raise TypeError(f"{name} must be a non-empty sequence of ints (got {value!r})")
    out = []
    for v in items:
        if isinstance(v, bool) or not isinstance(v, numbers.Real) and not hasattr(v, "__index__"):
            raise TypeError(f"{name} must hold ints (got {type(v).__name__} in {items!r})")
        if not hasattr(v, "__index__") and not float(v).is_integer():
            raise TypeError(f"{name} must hold ints (got {v!r})")
        out.append(int(v))
    if minimum is not None and any(v < minimum for v in out):
        bound = {0: "non-negative", 1: "positive"}.get(minimum, f"at least {minimum}")
        raise ValueError(f"{name} must be {bound} (got {tuple(out)})")
    return tuple(out)


def check_choice(value: object, name: str, choices: Sequence[object], *, strings: bool = False) -> object:
    """``value`` if it is one of ``choices``, else ``name must be one of (...) (got ...)``.

    ``strings``: a non-string is a ``TypeError`` (``name must be a string``) rather than a wrong choice.
    """
    if strings and not isinstance(value, str):
        raise TypeError(f"{name} must be a string (got {type(value).__name__})")
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)} (got {value!r})")
    return value


def nonnegative_problem(values: torch.Tensor, name: str, *, first_index: int = 0) -> str | None:
    """What is wrong with real values that must be finite and non-negative (weights, shares), or ``None``.

    ``values``: a real tensor of any shape (counted and indexed flat); ``first_index``: the global
    index of its first entry when it is one rank's shard. One reduction each (a host sync on CUDA).
    """
    import torch

    flat = values.detach().reshape(-1)
    bad = (~torch.isfinite(flat)).nonzero()
    if bad.numel():
        return f"{name} must be finite (found {bad.numel()} NaN/Inf values, first at index {int(bad[0]) + first_index})"
    neg = (flat < 0).nonzero()
    if neg.numel():
        first = int(neg[0])
        return (
            f"{name} must be non-negative (found {neg.numel()} negative values, "
            f"first {float(flat[first])} at index {first + first_index})"
        )
    return None


def check_nonnegative(values: torch.Tensor, name: str) -> torch.Tensor:
    """``values`` if finite and non-negative (:func:`nonnegative_problem`), else a ``ValueError``."""
    problem = nonnegative_problem(values, name)
    if problem is not None:
        raise ValueError(problem)
    return values
