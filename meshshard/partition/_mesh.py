"""Partition meshes: cells by centroid, then each mesh point follows one of its cells."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ._cells import cell_centres, mesh_arrays
from ._core import part_boxes, partition
from ._partition import Partition
from ._validate import as_points

__all__ = ["MeshPartition", "partition_mesh"]


@dataclass(frozen=True, eq=False)
class MeshPartition:
    """The partition of a mesh: of its cells, and the induced partition of its points.

    Attributes
    ----------
    cells : Partition
        Partition of the cells (made from their centroids); what VTK writers and cell data use.
    points : Partition
        Partition of the mesh points: a point belongs to the part of the **lowest-index cell that
        uses it**; a point used by no cell goes to the part of the nearest cell centroid. Within a
        part, points keep their original order.
    centroids : Tensor
        ``(C, D)`` cell centroids (mean of each cell's vertices) the cells were partitioned by.
    """

    cells: Partition
    points: Partition
    centroids: torch.Tensor

    @property
    def num_parts(self) -> int:
        """Number of parts ``P``."""
        return self.cells.num_parts


def partition_mesh(
    mesh: Any,
    num_parts: int,
    method: str = "rcb",
    weights: torch.Tensor | np.ndarray | None = None,
    fractions: torch.Tensor | np.ndarray | list[float] | None = None,
) -> MeshPartition:
    """Partition the cells of a mesh by their centroids, and its points by their cells.

    Cells are partitioned with :func:`partition` on their centroids (mean of the cell's
    vertices). Each mesh point then takes the part of the lowest-index cell that uses it, so every
    cell's points mostly live with it and the rule is deterministic; points used by no cell take
    the part of the nearest centroid. A dataset without cells (a bare point set, or a
    ``Data`` without ``face``) is partitioned point by point, and then ``cells`` and ``points``
    are the same partition.

    Parameters
    ----------
    mesh : pyvista.DataSet, vtkDataSet, torch_geometric.data.Data or trimesh.Trimesh
        The mesh. A ``Data`` uses ``pos`` and, if present, ``face`` (``(K, F)`` corner indices).
    num_parts, method, fractions
        As for :func:`partition`.
    weights : Tensor or ndarray, optional
        ``(C,)`` per-cell cost (``(N,)`` per-point for a mesh without cells).

    Returns
    -------
    MeshPartition
        ``cells`` and ``points`` partitions, and the cell ``centroids`` (CPU, float64).

    **Shapes**: ``centroids`` ``(C, D)``; ``cells.perm`` ``(C,)``; ``points.perm`` ``(N,)``.
    """
    arrays = mesh_arrays(mesh)
    if arrays.num_cells == 0:
        pts = as_points(arrays.points, "mesh points")
        part = partition(pts, num_parts, method=method, weights=weights, fractions=fractions)
        return MeshPartition(cells=part, points=part, centroids=pts)
    pos = as_points(arrays.points, arrays.points_name).detach().cpu().numpy()
    point_of, offsets = arrays.connectivity, arrays.offsets
    num_points, num_cells = pos.shape[0], arrays.num_cells
    if point_of.size and (point_of.min() < 0 or point_of.max() >= num_points):
        raise ValueError(f"mesh connectivity must index its {num_points} points (found {int(point_of.max())})")
    cell_of = np.repeat(np.arange(num_cells, dtype=np.int64), np.diff(offsets))
    centroids = cell_centres(pos, point_of, offsets)
    centroids_t = torch.from_numpy(centroids)
    cells = partition(centroids_t, num_parts, method=method, weights=weights, fractions=fractions)

    # Lowest-index cell of every point: entries come in cell order, so a stable sort by point puts
    # each point's lowest cell first.
    first_cell = np.full(num_points, num_cells, dtype=np.int64)
    order = np.argsort(point_of, kind="stable")
    by_point = point_of[order]
    leading = np.concatenate([[True], by_point[1:] != by_point[:-1]]) if by_point.size else by_point.astype(bool)
    first_cell[by_point[leading]] = cell_of[order][leading]
    orphan = first_cell == num_cells
    if orphan.any():
        from scipy.spatial import cKDTree

        _, nearest = cKDTree(centroids).query(pos[orphan], k=1)
        first_cell[orphan] = nearest
    cell_owner = cells.owner.cpu().numpy()
    point_owner = torch.from_numpy(cell_owner[first_cell])
    points = Partition.from_owner(
        point_owner,
        num_parts,
        method=f"{cells.method}-cells",
        params={"rule": "lowest-index cell"},
        boxes=part_boxes(torch.from_numpy(pos), point_owner, num_parts),
    )
    return MeshPartition(cells=cells, points=points, centroids=centroids_t)
