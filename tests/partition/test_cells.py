"""meshshard.partition._cells: foreign meshes as plain arrays, and vertex-mean cell centres."""

from __future__ import annotations

import numpy as np
import pytest
import pyvista as pv
import torch
import trimesh
from torch_geometric.data import Data

from meshshard.partition._cells import POLY_SECTIONS, cell_centres, mesh_arrays


def test_cell_centres_exact_on_mixed_cells():
    points = np.array([[0, 0, 0], [2, 0, 0], [2, 2, 0], [0, 2, 0], [0, 0, 6]], dtype=np.float32)
    connectivity = np.array([0, 1, 2, 3, 0, 1, 4, 4, 4, 0])
    offsets = np.array([0, 4, 7, 7, 10])  # a quad, a triangle, an empty cell, a cell listing 4 twice
    centres = cell_centres(points, connectivity, offsets)
    assert centres.dtype == np.float64 and centres.shape == (4, 3)
    np.testing.assert_array_equal(centres, [[1, 1, 0], [2 / 3, 0, 2], [0, 0, 0], [0, 0, 4]])


def test_cell_centres_in_two_dimensions_and_without_cells():
    points = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    np.testing.assert_array_equal(cell_centres(points, np.array([0, 1, 2]), np.array([0, 3])), [[1 / 3, 1 / 3]])
    assert cell_centres(points, np.zeros(0, np.int64), np.zeros(1, np.int64)).shape == (0, 2)


def test_polydata_sections_in_vtk_order():
    mesh = pv.PolyData(
        np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0], [2, 0, 0]], dtype=np.float32),
        faces=[3, 0, 1, 2, 4, 0, 2, 3, 4],
        lines=[2, 1, 4],
        verts=[1, 4],
    )
    mesh.cell_data["c"] = np.arange(4)
    mesh.point_data["q"] = np.arange(5.0)
    found = mesh_arrays(mesh)
    assert found.kind == "poly" and found.num_cells == 4 and found.points_name == "mesh.points"
    np.testing.assert_array_equal(found.types, [POLY_SECTIONS.index(s) for s in ("verts", "lines", "polys", "polys")])
    np.testing.assert_array_equal(found.offsets, [0, 1, 3, 6, 10])
    np.testing.assert_array_equal(found.connectivity, [4, 1, 4, 0, 1, 2, 0, 2, 3, 4])
    np.testing.assert_array_equal(found.points, mesh.points)
    assert set(found.cell_data) == {"c"} and set(found.point_data) == {"q"}


def test_other_vtk_datasets_become_unstructured_grids():
    image = pv.ImageData(dimensions=(3, 2, 2))
    found = mesh_arrays(image)
    grid = image.cast_to_unstructured_grid()
    assert found.kind == "ugrid" and found.num_cells == 2
    np.testing.assert_array_equal(found.types, grid.celltypes)
    np.testing.assert_array_equal(found.offsets, [0, 8, 16])
    np.testing.assert_array_equal(found.points, grid.points)


def test_trimesh_and_torch_geometric_give_the_same_cells_as_pyvista():
    sphere = pv.Sphere(theta_resolution=8, phi_resolution=6)
    faces = sphere.regular_faces
    ref = mesh_arrays(sphere)
    tri = mesh_arrays(trimesh.Trimesh(np.asarray(sphere.points), faces, process=False))
    pyg = mesh_arrays(Data(pos=torch.from_numpy(np.asarray(sphere.points)), face=torch.from_numpy(faces.T)))
    for found in (tri, pyg):
        assert found.kind == "poly"
        np.testing.assert_array_equal(found.types, ref.types)
        np.testing.assert_array_equal(found.offsets, ref.offsets)
        np.testing.assert_array_equal(found.connectivity, ref.connectivity)
        np.testing.assert_array_equal(np.asarray(found.points), ref.points)
    assert isinstance(pyg.points, torch.Tensor) and pyg.points_name == "mesh.pos"


def test_meshes_without_cells():
    assert mesh_arrays(Data(pos=torch.rand(5, 3))).num_cells == 0
    cloud = pv.PolyData(np.random.default_rng(0).random((6, 3)))
    cloud.verts = np.zeros(0, dtype=np.int64)
    assert mesh_arrays(cloud).num_cells == 0 and mesh_arrays(cloud).points.shape == (6, 3)


def test_errors_name_the_argument():
    with pytest.raises(TypeError, match=r"data must be a pyvista/VTK dataset, a torch_geometric Data .*\(got str\)"):
        mesh_arrays("mesh.vtp", "data")
    with pytest.raises(TypeError, match=r"mesh must be a single pyvista/VTK dataset \(got MultiBlock"):
        mesh_arrays(pv.MultiBlock([pv.Sphere()]))
    with pytest.raises(ValueError, match=r"mesh\.face must have shape \(K, F\) with F >= 1 \(got \(3, 0\)\)"):
        mesh_arrays(Data(pos=torch.rand(4, 3), face=torch.zeros(3, 0, dtype=torch.long)))
