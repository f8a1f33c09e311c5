"""meshshard.datasets._geometry: vector areas and unit normals of polygons, exact on hand-made cells."""

from __future__ import annotations

import numpy as np
import pytest

from meshshard.datasets._geometry import polygon_normals_areas, polygon_vector_areas

# A unit square in z=0 (counter-clockwise seen from +z), a right triangle in x=0, a degenerate triangle.
POINTS = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 1]], dtype=np.float32)
CONNECTIVITY = np.array([0, 1, 2, 3, 0, 3, 4, 0, 1, 1])
OFFSETS = np.array([0, 4, 7, 10])


def test_vector_areas_and_normals_exact():
    np.testing.assert_allclose(
        polygon_vector_areas(POINTS, CONNECTIVITY, OFFSETS), [[0, 0, 1], [0.5, 0, 0], [0, 0, 0]], atol=1e-15
    )
    normals, areas = polygon_normals_areas(POINTS, CONNECTIVITY, OFFSETS)
    np.testing.assert_allclose(normals, [[0, 0, 1], [1, 0, 0], [0, 0, 0]], atol=1e-15)  # degenerate: zero normal
    np.testing.assert_allclose(areas, [1.0, 0.5, 0.0], atol=1e-15)


def test_triangles_only_and_far_from_the_origin():
    tri = np.array([[0, 0, 0], [2, 0, 0], [0, 2, 0]], dtype=np.float64) + 1e6
    np.testing.assert_array_equal(polygon_vector_areas(tri, np.array([0, 1, 2]), np.array([0, 3])), [[0, 0, 2]])
    assert polygon_vector_areas(tri, np.zeros(0, np.int64), np.zeros(1, np.int64)).shape == (0, 3)


def test_a_cell_without_vertices_is_refused():
    with pytest.raises(ValueError, match=r"every cell must have at least one vertex \(got a cell with 0\)"):
        polygon_vector_areas(POINTS, CONNECTIVITY, np.array([0, 4, 4, 10]))
