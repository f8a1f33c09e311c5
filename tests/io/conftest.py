"""Tiny meshes and clouds for the meshshard.io tests."""

from __future__ import annotations

import os

os.environ.setdefault("VTK_DEFAULT_OPENGL_WINDOW", "vtkEGLRenderWindow")

import numpy as np
import pytest
import pyvista as pv
import torch

from meshshard.partition import Partition


def slab_partition(centres: np.ndarray, num_parts: int) -> Partition:
    """Equal slabs along x: every part is visible from the side, exact and simple."""
    order = np.argsort(centres[:, 0], kind="stable")
    sizes = np.full(num_parts, len(order) // num_parts)
    sizes[: len(order) % num_parts] += 1
    return Partition(perm=torch.as_tensor(order), sizes=torch.as_tensor(sizes))


@pytest.fixture
def cloud() -> torch.Tensor:
    """40 points in the unit cube, float32."""
    return torch.rand(40, 3, generator=torch.Generator().manual_seed(0))


@pytest.fixture
def sphere() -> pv.PolyData:
    """A small triangulated sphere with one point array and one cell array."""
    mesh = pv.Sphere(theta_resolution=10, phi_resolution=8)
    mesh.point_data["q"] = np.arange(mesh.n_points, dtype=np.float64) * 0.5
    mesh.cell_data["c"] = np.arange(mesh.n_cells, dtype=np.int32) * 3
    return mesh


@pytest.fixture
def tets() -> pv.UnstructuredGrid:
    """A tetrahedralised 3x3x3 box with a vector cell array."""
    grid = pv.ImageData(dimensions=(4, 4, 4)).cast_to_unstructured_grid().triangulate()
    grid.cell_data["u"] = np.arange(grid.n_cells * 3, dtype=np.float32).reshape(-1, 3)
    grid.point_data["T"] = np.linspace(0, 1, grid.n_points)
    return grid


@pytest.fixture
def car() -> pv.PolyData:
    """A stretched sphere standing in for a car body (length along x)."""
    mesh = pv.Sphere(theta_resolution=40, phi_resolution=20)
    mesh.points *= np.array([4.0, 1.6, 1.1])
    return mesh
