"""meshshard.io._data: every accepted input as one Dataset (points, Cells, arrays); partitions checked."""

from __future__ import annotations

import re

import numpy as np
import pytest
import pyvista as pv
import torch
import trimesh
from torch_geometric.data import Data

from meshshard.io._data import Cells, as_dataset, as_numpy, partition_sizes_and_perm
from meshshard.partition import Partition, partition_mesh


def test_cells_gather_and_vertices():
    cells = Cells(np.array([5, 9, 5], np.uint8), np.array([0, 3, 7, 10]), np.array([0, 1, 2, 2, 3, 4, 5, 5, 6, 7]))
    picked = cells.gather(np.array([2, 0]))
    np.testing.assert_array_equal(picked.types, [5, 5])
    np.testing.assert_array_equal(picked.offsets, [0, 3, 6])
    np.testing.assert_array_equal(picked.connectivity, [5, 6, 7, 0, 1, 2])
    vertices = Cells.vertices(3)
    assert len(vertices) == 3 and len(Cells.vertices(0)) == 0
    np.testing.assert_array_equal(vertices.offsets, [0, 1, 2, 3])
    np.testing.assert_array_equal(vertices.connectivity, [0, 1, 2])


def test_polydata_and_its_arrays(sphere):
    ds = as_dataset(sphere)
    assert ds.kind == "poly" and ds.num_items == sphere.n_cells
    np.testing.assert_array_equal(ds.points, sphere.points)
    np.testing.assert_array_equal(ds.cells.connectivity, sphere.regular_faces.ravel())
    assert set(ds.point_data) == {"Normals", "q"} and set(ds.cell_data) == {"c"}
    faces = sphere.regular_faces
    np.testing.assert_array_equal(ds.centres(), sphere.points[faces].astype(np.float64).mean(axis=1))
    geometry = as_dataset(sphere, arrays=False)
    assert geometry.point_data == {} and geometry.cell_data == {}


def test_volume_mesh_cells_keep_vtk_types(tets):
    ds = as_dataset(tets, fields=["u"])
    assert ds.kind == "ugrid" and set(ds.cell_data) == {"u"} and ds.point_data == {}
    np.testing.assert_array_equal(ds.cells.types, tets.celltypes)
    with pytest.raises(ValueError, match=re.escape("fields ['nope'] not found in data")):
        as_dataset(tets, fields=["nope"])
    extra = as_dataset(tets, fields={"w": np.zeros(tets.n_points)})
    assert "w" in extra.point_data and "u" in extra.cell_data


def test_trimesh_reads_as_pyvista_reads_it(sphere):
    tri = trimesh.Trimesh(np.asarray(sphere.points), sphere.regular_faces, process=False)
    ds, ref = as_dataset(tri), as_dataset(pv.wrap(tri))
    assert ds.kind == ref.kind == "poly"
    np.testing.assert_array_equal(ds.cells.connectivity, ref.cells.connectivity)
    np.testing.assert_array_equal(ds.points, ref.points)


def test_clouds_tensors_dicts_and_pyg_data(cloud):
    assert as_dataset(cloud).kind == "points" and as_dataset(cloud).cells is None
    np.testing.assert_array_equal(as_dataset(cloud).centres(), cloud.numpy())
    ds = as_dataset({"pos": cloud, "p": torch.arange(40.0), "name": "run"})
    assert set(ds.point_data) == {"p"}
    ds = as_dataset(Data(pos=cloud, x=torch.zeros(40, 2)))
    assert ds.kind == "points" and set(ds.point_data) == {"x"}
    empty = pv.PolyData(np.asarray(cloud, dtype=np.float64))
    empty.verts = np.zeros(0, dtype=np.int64)
    empty.point_data["t"] = np.arange(40)
    ds = as_dataset(empty)
    assert ds.kind == "points" and set(ds.point_data) == {"t"}


def test_as_numpy_converts_what_vtk_cannot_store():
    assert as_numpy(torch.ones(2, dtype=torch.bfloat16), "x").dtype == np.float32
    assert as_numpy(np.ones(2, dtype=np.float16), "x").dtype == np.float32
    assert as_numpy(torch.tensor([True, False]), "x").dtype == np.uint8
    with pytest.raises(TypeError, match=r"x must hold real numbers \(got dtype <U1\)"):
        as_numpy(np.array(["a"]), "x")


def test_refused_meshes():
    with pytest.raises(TypeError, match=r"data must be a single pyvista/VTK dataset \(got MultiBlock"):
        as_dataset(pv.MultiBlock([pv.Sphere()]))
    message = "data.points must be finite (found 1 row with NaN/Inf, first at row 0)"
    with pytest.raises(ValueError, match=re.escape(message)):
        as_dataset(pv.PolyData(np.full((1, 3), np.nan), faces=[1, 0]))


def test_partition_sizes_and_perm(sphere, cloud):
    mesh_part = partition_mesh(sphere, 3)
    perm, sizes = partition_sizes_and_perm(mesh_part, as_dataset(sphere))
    np.testing.assert_array_equal(perm, mesh_part.cells.perm.numpy())
    perm, sizes = partition_sizes_and_perm(mesh_part, as_dataset(np.asarray(sphere.points)))
    np.testing.assert_array_equal(perm, mesh_part.points.perm.numpy())
    assert perm.dtype == sizes.dtype == np.int64
    with pytest.raises(TypeError, match=r"partition must be a meshshard Partition .*\(got Tensor\)"):
        partition_sizes_and_perm(torch.zeros(40), as_dataset(cloud))
    with pytest.raises(ValueError, match="partition covers 40 items but data has 80 cells"):
        partition_sizes_and_perm(Partition.from_owner(torch.arange(40) % 2, 2),
                                 as_dataset(pv.Sphere(theta_resolution=10, phi_resolution=6)))
