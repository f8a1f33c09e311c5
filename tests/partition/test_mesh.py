"""meshshard.partition._mesh: partition_mesh() splits cells by centroid, points by their lowest-index cell."""

from __future__ import annotations

import numpy as np
import pytest
import pyvista as pv
import torch
import torch_geometric as tg
import trimesh

from meshshard.partition import partition, partition_mesh


def _lowest_cells(num_points: int, cells: list[list[int]]) -> np.ndarray:
    first = np.full(num_points, -1)
    for c, ids in enumerate(cells):
        for i in ids:
            if first[i] < 0:
                first[i] = c
    return first


def test_triangle_strip_exact():
    # 4 triangles in a row along x; points 0..5 on two rows
    pts = np.array([[0, 0, 0], [1, 0, 0], [2, 0, 0], [0, 1, 0], [1, 1, 0], [2, 1, 0]], dtype=float)
    faces = [[0, 1, 3], [1, 4, 3], [1, 2, 4], [2, 5, 4]]
    mesh = pv.PolyData(pts, np.hstack([[3, *f] for f in faces]))
    mp = partition_mesh(mesh, 2)
    assert mp.cells.owner.tolist() == [0, 0, 1, 1]
    # point 1 is used by cells 0, 1, 2: lowest is 0 -> part 0; point 4: cells 1, 2, 3 -> part 0
    assert mp.points.owner.tolist() == [0, 0, 1, 0, 0, 1]
    assert mp.centroids[0].tolist() == pytest.approx([1 / 3, 1 / 3, 0])
    assert mp.num_parts == 2 and mp.points.method == "rcb-cells"


def test_sphere_rule_and_balance():
    mesh = pv.Sphere(theta_resolution=24, phi_resolution=16)
    mp = partition_mesh(mesh, 5, method="hilbert")
    assert float((mp.cells.sizes.double() - mesh.n_cells / 5).abs().max()) <= 1
    faces = mesh.regular_faces
    first = _lowest_cells(mesh.n_points, faces.tolist())
    assert mp.points.owner.tolist() == mp.cells.owner[torch.from_numpy(first)].tolist()
    ref = partition(torch.from_numpy(np.asarray(mesh.cell_centers().points)), 5, method="hilbert")
    assert torch.equal(ref.owner, mp.cells.owner)


def test_unstructured_grid_and_image_data():
    grid = pv.ImageData(dimensions=(5, 4, 3))
    mp = partition_mesh(grid, 3)
    assert mp.cells.num_points == grid.n_cells and mp.points.num_points == grid.n_points
    ugrid = grid.cast_to_unstructured_grid()
    mp2 = partition_mesh(ugrid, 3)
    assert torch.equal(mp.cells.owner, mp2.cells.owner) and torch.equal(mp.points.owner, mp2.points.owner)
    from vtkmodules.vtkCommonDataModel import vtkUnstructuredGrid

    raw = vtkUnstructuredGrid()  # a plain VTK object is wrapped by pyvista
    raw.DeepCopy(ugrid)
    assert torch.equal(partition_mesh(raw, 3).points.owner, mp2.points.owner)


def test_orphan_point_takes_nearest_centroid():
    pts = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [10, 0, 0], [11, 0, 0], [10, 1, 0], [10.2, 0.2, 0]])
    mesh = pv.PolyData(pts.astype(float), np.hstack([[3, 0, 1, 2], [3, 3, 4, 5]]))
    mp = partition_mesh(mesh, 2)
    assert mp.cells.owner.tolist() == [0, 1]
    assert mp.points.owner.tolist() == [0, 0, 0, 1, 1, 1, 1]


def test_point_set_without_cells():
    cloud = pv.PolyData()
    cloud.points = np.random.default_rng(0).random((40, 3))
    mp = partition_mesh(cloud, 4)
    assert mp.cells is mp.points and mp.cells.num_points == 40


def test_torch_geometric_data_and_trimesh():
    mesh = pv.Sphere(theta_resolution=12, phi_resolution=8)
    ref = partition_mesh(mesh, 3)
    data = tg.data.Data(pos=torch.from_numpy(np.asarray(mesh.points)), face=torch.from_numpy(mesh.regular_faces.T))
    mp = partition_mesh(data, 3)
    assert torch.equal(mp.cells.owner, ref.cells.owner) and torch.equal(mp.points.owner, ref.points.owner)
    cloud = partition_mesh(tg.data.Data(pos=torch.rand(30, 3)), 3)
    assert cloud.cells is cloud.points
    tm = trimesh.Trimesh(vertices=np.asarray(mesh.points), faces=mesh.regular_faces, process=False)
    mp = partition_mesh(tm, 3)
    assert torch.equal(mp.points.owner, ref.points.owner)


def test_weights_and_errors():
    mesh = pv.Sphere(theta_resolution=12, phi_resolution=8)
    w = np.ones(mesh.n_cells)
    w[: mesh.n_cells // 2] = 3.0
    mp = partition_mesh(mesh, 2, weights=w)
    load = np.bincount(mp.cells.owner.numpy(), weights=w)
    assert abs(load[0] - load[1]) <= 3.0
    with pytest.raises(TypeError, match=r"mesh must be a pyvista/VTK dataset.*\(got str\)"):
        partition_mesh("mesh.vtp", 2)
    with pytest.raises(ValueError, match=r"weights must have shape"):
        partition_mesh(mesh, 2, weights=np.ones(3))
