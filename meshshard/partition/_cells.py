"""Meshes from other libraries as plain arrays, and the vertex-mean centroids of their cells.

:func:`mesh_arrays` is the one adapter of foreign meshes (a pyvista/VTK dataset, a
``torch_geometric`` ``Data`` with ``pos`` and ``face``, a ``trimesh.Trimesh``): points and cells in
VTK's offsets + connectivity layout. :func:`partition_mesh` partitions what it returns, and
:mod:`meshshard.io` builds its :class:`~meshshard.io._data.Cells` from it. :func:`cell_centres` is
the one vertex-mean centroid, used by both and by :mod:`meshshard.datasets`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

__all__ = ["POLY_SECTIONS", "MeshArrays", "cell_centres", "mesh_arrays"]

#: ``MeshArrays.types`` of a PolyData: the four sections of vtkPolyData, which VTK numbers in this order.
POLY_SECTIONS = ("verts", "lines", "polys", "strips")


class MeshArrays(NamedTuple):
    """A foreign mesh as numpy arrays (what :func:`mesh_arrays` returns).

    **Shapes**: ``points`` (N, D), as the mesh stores them (a tensor for ``torch_geometric``, not
    yet checked); ``types`` (C,) uint8, VTK cell types (``kind="ugrid"``) or the PolyData section
    0-3 of :data:`POLY_SECTIONS` (``kind="poly"``); ``offsets`` (C + 1,) int64; ``connectivity``
    (offsets[-1],) int64 point indices; ``point_data[name]`` (N, ...) and ``cell_data[name]``
    (C, ...), the named arrays of a pyvista/VTK dataset (or a trimesh's attributes).
    """

    points: Any
    points_name: str  # how error messages call ``points`` ("mesh.points", "data.pos", ...)
    kind: str  # "poly" | "ugrid"
    types: np.ndarray
    offsets: np.ndarray
    connectivity: np.ndarray
    point_data: dict[str, np.ndarray]
    cell_data: dict[str, np.ndarray]

    @property
    def num_cells(self) -> int:
        return int(self.offsets.shape[0]) - 1


def cell_centres(points: Any, connectivity: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Vertex-mean centre of every cell (a point listed twice by a cell counts twice).

    Sums run in float64 in connectivity order; a cell without vertices gets the origin.

    **Shapes**: ``points`` (V, D), ``connectivity`` (K,), ``offsets`` (C + 1,) -> (C, D) float64.
    """
    points = np.asarray(points)
    counts = np.diff(offsets)
    num_cells = counts.shape[0]
    cell_of = np.repeat(np.arange(num_cells, dtype=np.int64), counts)
    centres = np.empty((num_cells, points.shape[1]), dtype=np.float64)
    for axis in range(points.shape[1]):  # one axis at a time: no (K, D) float64 temporary
        centres[:, axis] = np.bincount(cell_of, weights=points[connectivity, axis], minlength=num_cells)
    centres /= np.maximum(counts, 1)[:, None]
    return centres


def _int64(array: Any) -> np.ndarray:
    from vtkmodules.util.numpy_support import vtk_to_numpy

    return vtk_to_numpy(array).astype(np.int64, copy=False)


def _poly_cells(mesh: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sections = (mesh.GetVerts(), mesh.GetLines(), mesh.GetPolys(), mesh.GetStrips())
    types, offsets, connectivity, base = [], [], [], 0
    for k, cell_array in enumerate(sections):
        if cell_array is None or cell_array.GetNumberOfCells() == 0:
            continue
        off = _int64(cell_array.GetOffsetsArray())
        types.append(np.full(off.shape[0] - 1, k, dtype=np.uint8))
        offsets.append(off[:-1] + base)
        connectivity.append(_int64(cell_array.GetConnectivityArray()))
        base += int(off[-1])
    if not types:
        return np.zeros(0, np.uint8), np.zeros(1, np.int64), np.zeros(0, np.int64)
    return (
        np.concatenate(types),
        np.concatenate([*offsets, np.array([base], dtype=np.int64)]),
        np.concatenate(connectivity),
    )


def _ugrid_cells(grid: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cell_array = grid.GetCells()
    types = np.asarray(grid.celltypes).astype(np.uint8)  # pyvista hides VTK's API churn here
    return types, _int64(cell_array.GetOffsetsArray()), _int64(cell_array.GetConnectivityArray())


def _from_torch_geometric(data: Any, name: str) -> MeshArrays:
    face = getattr(data, "face", None)
    if face is None:
        num_corners, num_cells, connectivity = 0, 0, np.zeros(0, dtype=np.int64)
    else:
        face = torch.as_tensor(face).detach().cpu()
        if face.ndim != 2 or face.numel() == 0:
            raise ValueError(f"{name}.face must have shape (K, F) with F >= 1 (got {tuple(face.shape)})")
        num_corners, num_cells = face.shape
        connectivity = face.t().reshape(-1).numpy().astype(np.int64)
    section = min(num_corners, 3) - 1  # a vertex, a line or a polygon per column of ``face``
    types = np.full(num_cells, max(section, 0), dtype=np.uint8)
    offsets = np.arange(num_cells + 1, dtype=np.int64) * num_corners
    return MeshArrays(data.pos, f"{name}.pos", "poly", types, offsets, connectivity, {}, {})


def mesh_arrays(mesh: Any, name: str = "mesh") -> MeshArrays:
    """Points, cells and named arrays of a pyvista/VTK dataset, ``torch_geometric`` ``Data`` or trimesh.

    A ``PolyData`` (and a trimesh, converted by pyvista with its vertex and face attributes) gives
    ``kind="poly"`` with its cells in VTK's section order (verts, lines, polys, strips); any other
    VTK dataset is cast to an unstructured grid (``kind="ugrid"``). A ``Data`` gives the columns of
    ``face`` as cells (none without ``face``). A mesh without cells gives ``num_cells == 0``.
    ``name`` is the argument's name in error messages.

    Raises
    ------
    TypeError
        ``mesh`` is none of these, or a composite dataset (``MultiBlock``).
    ValueError
        A ``Data``'s ``face`` is not a non-empty 2-D tensor.
    """
    if (type(mesh).__module__ or "").startswith("torch_geometric"):
        return _from_torch_geometric(mesh, name)
    import pyvista as pv

    wrapped = mesh
    if not isinstance(mesh, pv.DataSet):
        try:
            wrapped = pv.wrap(mesh)
        except (NotImplementedError, TypeError):
            wrapped = None
    if isinstance(wrapped, pv.DataObject) and not isinstance(wrapped, pv.DataSet):
        raise TypeError(
            f"{name} must be a single pyvista/VTK dataset (got {type(wrapped).__name__}; combine blocks first)"
        )
    if not isinstance(wrapped, pv.DataSet):
        raise TypeError(
            f"{name} must be a pyvista/VTK dataset, a torch_geometric Data (pos, optional face) or a "
            f"trimesh.Trimesh (got {type(mesh).__name__})"
        )
    if not isinstance(wrapped, pv.PolyData | pv.UnstructuredGrid):
        wrapped = wrapped.cast_to_unstructured_grid()
    is_poly = isinstance(wrapped, pv.PolyData)
    types, offsets, connectivity = _poly_cells(wrapped) if is_poly else _ugrid_cells(wrapped)
    return MeshArrays(
        np.asarray(wrapped.points),
        f"{name}.points",
        "poly" if is_poly else "ugrid",
        types,
        offsets,
        connectivity,
        {k: np.asarray(v) for k, v in wrapped.point_data.items()},
        {k: np.asarray(v) for k, v in wrapped.cell_data.items()},
    )
