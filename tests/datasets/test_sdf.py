from __future__ import annotations

import numpy as np
import pytest
import trimesh

from meshshard.datasets._sdf import resolve_backend, signed_distance

POINTS = np.array([[0.5, 0.5, 0.5], [2.0, 0.5, 0.5], [0.5, 0.5, -0.25], [1.5, 1.5, 0.5], [0.9, 0.5, 0.5]])
EXPECTED = np.array([-0.5, 1.0, 0.25, np.sqrt(0.5), -0.1])


def _unit_cube() -> tuple[np.ndarray, np.ndarray]:
    box = trimesh.creation.box(extents=(1, 1, 1))
    return np.asarray(box.vertices) + 0.5, np.asarray(box.faces)


@pytest.mark.parametrize("backend", ["igl", "warp"])
def test_unit_cube(backend: str) -> None:
    if backend == "warp":
        pytest.importorskip("warp")
    vertices, faces = _unit_cube()
    got = signed_distance(POINTS, vertices, faces, backend=backend, chunk_size=2)
    np.testing.assert_allclose(got, EXPECTED, atol=1e-6)


def test_backend_choice() -> None:
    assert resolve_backend("igl") == "igl"
    assert resolve_backend("auto") in ("igl", "warp")
    with pytest.raises(ValueError, match=r"sdf_backend must be one of \('auto', 'igl', 'warp'\) \(got 'cgal'\)"):
        resolve_backend("cgal")
    vertices, faces = _unit_cube()
    with pytest.raises(ValueError, match=r"chunk_size must be at least 1 \(got 0\)"):
        signed_distance(POINTS, vertices, faces, backend="igl", chunk_size=0)
