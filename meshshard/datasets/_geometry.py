"""Geometry of polygonal surface cells as numpy arrays (float64, vectorised): vector areas, normals.

A cell is given by its vertex ids in a flat ``connectivity`` array and ``offsets`` (``C + 1``
entries, VTK's layout): cell ``c`` has vertices ``connectivity[offsets[c]:offsets[c + 1]]``. Cell
centres are :func:`meshshard.partition._cells.cell_centres`.
"""

from __future__ import annotations

import numpy as np

from ..partition import cell_centres

__all__ = ["polygon_vector_areas", "polygon_normals_areas"]


def _cell_index(offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    counts = np.diff(offsets)
    if counts.size and counts.min() < 1:
        raise ValueError(f"every cell must have at least one vertex (got a cell with {counts.min()})")
    return counts, offsets[:-1]


def polygon_vector_areas(points: np.ndarray, connectivity: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Vector area of every polygon (Newell's formula): area times unit normal.

    The normal follows the right-hand rule of the vertex order. Coordinates are taken relative
    to each polygon's centre so that float32 inputs far from the origin lose no precision.

    **Shapes**: ``points`` (V, 3), ``connectivity`` (K,), ``offsets`` (C + 1,) -> (C, 3) float64.
    """
    counts, starts = _cell_index(offsets)
    if counts.size == 0:
        return np.zeros((0, 3))
    centres = cell_centres(points, connectivity, offsets)
    if np.all(counts == 3):
        tri = points[connectivity.reshape(-1, 3)].astype(np.float64)
        return 0.5 * np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    cell_of = np.repeat(np.arange(counts.size), counts)
    rel = points[connectivity].astype(np.float64) - centres[cell_of]
    nxt = np.arange(connectivity.size) + 1
    nxt[offsets[1:] - 1] = starts  # the last vertex of each polygon wraps to its first
    return 0.5 * np.add.reduceat(np.cross(rel, rel[nxt]), starts, axis=0)


def polygon_normals_areas(
    points: np.ndarray, connectivity: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Unit normals (C, 3) and areas (C,) of polygons; degenerate polygons get a zero normal."""
    vec = polygon_vector_areas(points, connectivity, offsets)
    areas = np.linalg.norm(vec, axis=1)
    normals = np.divide(vec, areas[:, None], out=np.zeros_like(vec), where=areas[:, None] > 0)
    return normals, areas
