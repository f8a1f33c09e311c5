"""Argument checks shared by the partitioners: each names the argument and what was found."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .._checks import check_choice, check_finite_points, check_nonnegative, check_points
from .._config import PARTITION_METHODS

__all__ = [
    "as_points",
    "check_fractions",
    "check_method",
    "check_weights",
    "quantize_weights",
]

METHODS = PARTITION_METHODS


def _type_name(x: Any) -> str:
    return type(x).__name__


def as_points(points: Any, name: str = "points") -> torch.Tensor:
    """Return ``points`` as a finite floating ``(N, 2)`` or ``(N, 3)`` tensor (no copy if possible).

    Accepts a :class:`torch.Tensor`, a :class:`numpy.ndarray`, or an object with a ``pos`` tensor
    (``torch_geometric.data.Data``). Integer coordinates are converted to ``float64``. The checks
    and their messages are :func:`meshshard._checks.check_points` and ``check_finite_points``.
    """
    if not isinstance(points, torch.Tensor | np.ndarray) and hasattr(points, "pos"):
        points = points.pos
        name = f"{name}.pos"
    points = check_points(points, name, dims=(2, 3), arrays=True, integers=True)
    return check_finite_points(points, name)


def check_method(method: Any) -> str:
    """Return ``method`` if it names a known partitioner."""
    return check_choice(method, "method", METHODS, strings=True)


def _as_vector(x: Any, name: str) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "fiub":
            raise TypeError(f"{name} must hold real numbers (got numpy dtype {x.dtype})")
        return torch.from_numpy(np.ascontiguousarray(x))
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, list | tuple):
        try:
            return torch.as_tensor(x, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"{name} must be a sequence of numbers (got {x!r})") from None
    raise TypeError(f"{name} must be a torch.Tensor, numpy.ndarray or sequence (got {_type_name(x)})")


def check_weights(weights: Any, num_points: int, device: torch.device) -> torch.Tensor:
    """Return per-point weights as a ``float64`` tensor of shape ``(N,)`` on ``device``."""
    w = _as_vector(weights, "weights")
    if w.is_complex():
        raise TypeError(f"weights must hold real numbers (got {w.dtype})")
    if w.ndim != 1 or w.shape[0] != num_points:
        raise ValueError(f"weights must have shape ({num_points},) like points (got {tuple(w.shape)})")
    w = check_nonnegative(w.detach().to(device=device, dtype=torch.float64), "weights")
    if num_points > 0 and not bool(w.sum() > 0):
        raise ValueError("weights must have a positive sum (got all zeros)")
    return w


def check_fractions(fractions: Any, num_parts: int, device: torch.device, tol: float = 1e-6) -> torch.Tensor:
    """Return per-part target shares as a ``float64`` tensor of shape ``(P,)`` summing to exactly 1."""
    f = _as_vector(fractions, "fractions")
    if f.is_complex() or f.dtype == torch.bool:
        raise TypeError(f"fractions must hold real numbers (got {f.dtype})")
    if f.ndim != 1 or f.shape[0] != num_parts:
        raise ValueError(f"fractions must have shape ({num_parts},) = (num_parts,) (got {tuple(f.shape)})")
    f = check_nonnegative(f.to(dtype=torch.float64), "fractions")
    total = float(f.sum())
    if abs(total - 1.0) > tol:
        raise ValueError(f"fractions must sum to 1 (got sum {total:.9g})")
    return (f / total).to(device)


def quantize_weights(weights: torch.Tensor, num_points: int, max_weight: float | None = None) -> torch.Tensor:
    """Round weights down to integer multiples of one power-of-two quantum, so every sum is exact.

    The weights are scaled by ``S = 2**k`` (the largest power of two with
    ``num_points * max(weights) * S < 2**53``) and floored: the result holds integers below
    ``2**53 / num_points`` as ``float64``, so every partial sum of them, in any order, is exact.
    That is the tie rule that makes a partition independent of how its sums are grouped: the
    serial partitioners and :func:`~meshshard.partition.repartition` (which adds the same
    weights across ranks) see bit-identical prefix weights. Integer weights with
    ``num_points * max <= 2**52`` only change scale (their balance is unchanged); fractional
    weights are rounded down by at most ``num_points * max / 2**53`` of the largest weight.

    ``max_weight``: the global maximum when ``weights`` is one rank's chunk (all-reduced by the
    caller); defaults to ``weights.max()``.
    """
    if max_weight is None:
        max_weight = float(weights.max()) if weights.numel() else 0.0
    if num_points == 0 or max_weight <= 0.0:
        return weights
    _, exp = math.frexp(max_weight)  # max_weight < 2**exp
    shift = 53 - exp - max(1, int(num_points).bit_length())  # num_points < 2**bit_length
    half = shift // 2  # two exact power-of-two factors: 2**shift alone may overflow float64
    return (weights.to(torch.float64) * math.ldexp(1.0, half) * math.ldexp(1.0, shift - half)).floor_()
