"""Exact ghost sets for the VTK pieces: which items of other parts lie within a radius of a part."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["check_radius", "ghost_items"]


def check_radius(radius: object, name: str = "ghost_radius") -> float:
    """``radius`` as a positive finite float, or a ValueError/TypeError naming ``name``."""
    if isinstance(radius, bool) or not isinstance(radius, int | float | np.floating | np.integer):
        raise TypeError(f"{name} must be a number (got {type(radius).__name__})")
    value = float(radius)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be positive and finite (got {value})")
    return value


def ghost_items(centres: np.ndarray, owner: np.ndarray, radius: float, num_parts: int) -> list[np.ndarray]:
    """For every part, the sorted ids of items owned elsewhere within ``radius`` of one of its items.

    Distances are Euclidean and the ball is closed (``<= radius``), as in ``scipy.spatial.cKDTree``.
    Only items within ``radius`` of another part's bounding box can be in a cross-part pair, so
    those candidates are kept first (a thin shell for compact parts); one ``query_pairs`` over the
    candidates then finds every close pair once, and a pair across two parts makes each item a
    ghost of the other's part.

    **Shapes**: ``centres`` (N, 3); ``owner`` (N,) part of each item; returns ``num_parts`` arrays.
    """
    from scipy.spatial import cKDTree

    n = centres.shape[0]
    empty = [np.zeros(0, dtype=np.int64) for _ in range(num_parts)]
    if n == 0:
        return empty
    candidates = np.flatnonzero(_near_other_box(centres, owner, radius, num_parts))
    if len(candidates) < 2:
        return empty
    pairs = cKDTree(centres[candidates]).query_pairs(radius, output_type="ndarray").astype(np.int64)
    i, j = candidates[pairs[:, 0]], candidates[pairs[:, 1]]
    cross = owner[i] != owner[j]
    i, j = i[cross], j[cross]
    keys = np.unique(np.concatenate([owner[i] * n + j, owner[j] * n + i]))
    parts, items = keys // n, keys % n
    bounds = np.searchsorted(parts, np.arange(num_parts + 1))
    return [items[bounds[r]:bounds[r + 1]] for r in range(num_parts)]


def _near_other_box(centres: np.ndarray, owner: np.ndarray, radius: float, num_parts: int) -> np.ndarray:
    """(N,) bool: is the item within ``radius`` of the bounding box of a part other than its own?"""
    lo = np.full((num_parts, 3), np.inf)
    hi = np.full((num_parts, 3), -np.inf)
    order = np.argsort(owner, kind="stable")
    starts = np.searchsorted(owner[order], np.arange(num_parts))
    full = np.bincount(owner, minlength=num_parts) > 0  # reduceat needs non-empty segments
    lo[full] = np.minimum.reduceat(centres[order], starts[full])
    hi[full] = np.maximum.reduceat(centres[order], starts[full])
    # Widen by the radius (plus rounding slack) and test containment: a superset of "within r".
    slack = radius * (1 + 1e-9) + 1e-12 * (float(np.abs(centres).max()) + 1.0)
    lo, hi = lo - slack, hi + slack
    near = np.zeros(len(centres), dtype=bool)
    block = max(1, 2**24 // max(len(centres), 1))  # bound the (N, block) temporaries
    for start in range(0, num_parts, block):
        box = slice(start, min(start + block, num_parts))
        inside = np.ones((len(centres), box.stop - box.start), dtype=bool)
        for d in range(3):  # one axis at a time: (N, block) temporaries, not (N, block, 3)
            column = centres[:, d : d + 1]
            inside &= (column >= lo[None, box, d]) & (column <= hi[None, box, d])
        rows = np.flatnonzero((owner >= box.start) & (owner < box.stop))
        inside[rows, owner[rows] - start] = False  # its own box does not count
        near |= inside.any(axis=1)
    return near
