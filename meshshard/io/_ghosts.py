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
    One ``query_pairs`` over all items finds every close pair once; a pair across two parts makes
    each item a ghost of the other's part.

    **Shapes**: ``centres`` (N, 3); ``owner`` (N,) part of each item; returns ``num_parts`` arrays.
    """
    from scipy.spatial import cKDTree

    n = centres.shape[0]
    if n == 0:
        return [np.zeros(0, dtype=np.int64) for _ in range(num_parts)]
    pairs = cKDTree(centres).query_pairs(radius, output_type="ndarray").astype(np.int64)
    i, j = pairs[:, 0], pairs[:, 1]
    cross = owner[i] != owner[j]
    i, j = i[cross], j[cross]
    keys = np.unique(np.concatenate([owner[i] * n + j, owner[j] * n + i]))
    parts, items = keys // n, keys % n
    bounds = np.searchsorted(parts, np.arange(num_parts + 1))
    return [items[bounds[r]:bounds[r + 1]] for r in range(num_parts)]
