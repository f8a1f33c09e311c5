"""One plain description of every input :mod:`meshshard.io` accepts: points, cells and named arrays.

A point cloud (tensor, array, ``torch_geometric`` ``Data``, sample dict) becomes ``kind="points"``
and is partitioned over its points. A pyvista/VTK mesh becomes ``kind="poly"`` (``PolyData``) or
``kind="ugrid"`` (everything else) and is partitioned over its cells.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._checks import check_finite_points, check_points
from ..partition import MeshPartition, Partition, cell_centres, mesh_arrays
from ..tensor import ShardTensor

__all__ = ["Cells", "Dataset", "as_dataset", "as_numpy", "partition_sizes_and_perm"]

# Arrays meshshard.io writes itself; an input array of the same name would be ambiguous.
RESERVED_NAMES = frozenset(
    {"vtkProcessId", "vtkGhostType", "GlobalPointIds", "GlobalCellIds", "vtkOriginalPointIds",
     "vtkOriginalCellIds"}
)

VTK_POLYHEDRON = 42


@dataclass
class Cells:
    """Cells in VTK's offsets + connectivity layout.

    **Shapes**: ``types`` (C,) uint8, VTK cell types (``ugrid``) or the PolyData section 0-3
    (``poly``, :data:`~meshshard.partition._cells.POLY_SECTIONS`); ``offsets`` (C + 1,) int64;
    ``connectivity`` (offsets[-1],) int64 point indices.
    """

    types: np.ndarray
    offsets: np.ndarray
    connectivity: np.ndarray

    def __len__(self) -> int:
        return int(self.types.shape[0])

    @classmethod
    def vertices(cls, n: int) -> Cells:
        """One vertex cell per point ``0 .. n-1`` (ParaView draws cells, so a cloud needs them)."""
        return cls(np.zeros(n, np.uint8), np.arange(n + 1, dtype=np.int64), np.arange(n, dtype=np.int64))

    def gather(self, ids: np.ndarray) -> Cells:
        """The cells ``ids`` in that order (vectorised; no loop over cells)."""
        starts = self.offsets[ids]
        lengths = self.offsets[ids + 1] - starts
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        index = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
        return Cells(self.types[ids], offsets, self.connectivity[index])


@dataclass
class Dataset:
    """Points, optional cells and the arrays to write.

    **Shapes**: ``points`` (N_points, 3); ``point_data[name]`` (N_points, ...);
    ``cell_data[name]`` (N_cells, ...).
    """

    kind: str  # "points" | "poly" | "ugrid"
    points: np.ndarray
    point_data: dict[str, np.ndarray]
    cell_data: dict[str, np.ndarray]
    cells: Cells | None = None

    @property
    def num_items(self) -> int:
        """What a partition of this dataset counts: points of a cloud, cells of a mesh."""
        return int(self.points.shape[0]) if self.cells is None else len(self.cells)

    def centres(self) -> np.ndarray:
        """(num_items, 3) points of a cloud, or the vertex-mean centre of each cell of a mesh."""
        if self.cells is None:
            return self.points
        return cell_centres(self.points, self.cells.connectivity, self.cells.offsets)


def as_numpy(value: Any, name: str) -> np.ndarray:
    """A tensor/array as a CPU numpy array VTK can store (bool -> uint8, half -> float32)."""
    if isinstance(value, ShardTensor):  # its local rows
        value = value.to_local()
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.dtype in (torch.float16, torch.bfloat16):
            value = value.float()
        value = value.cpu().numpy()
    elif not isinstance(value, np.ndarray):
        try:
            value = np.asarray(value)
        except Exception as exc:  # pragma: no cover - numpy's own message follows
            raise TypeError(f"{name} must be a tensor or array (got {type(value).__name__})") from exc
    if value.dtype == np.bool_:
        value = value.astype(np.uint8)
    elif value.dtype == np.float16:
        value = value.astype(np.float32)
    if value.dtype.kind not in "fiu":
        raise TypeError(f"{name} must hold real numbers (got dtype {value.dtype})")
    return np.ascontiguousarray(value)


def _as_points(value: Any, name: str) -> np.ndarray:
    points = as_numpy(value, name)
    points = check_points(points, name, dims=(2, 3), arrays=True, integers=True)
    points = check_finite_points(points, name).numpy()
    if points.shape[1] == 2:  # VTK points are 3-D: a planar cloud gets z = 0
        points = np.concatenate([points, np.zeros((points.shape[0], 1), dtype=points.dtype)], axis=1)
    return points


def _check_name(name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError(f"field names must be str (got {type(name).__name__})")
    if name in RESERVED_NAMES:
        raise ValueError(f"field name {name!r} is reserved: meshshard.io writes it itself")
    return name


def _per_item(value: Any, name: str, n: int, what: str) -> np.ndarray:
    array = as_numpy(value, f"field {name!r}")
    if array.ndim == 0 or array.shape[0] != n:
        raise ValueError(
            f"field {name!r} must have one row per {what} ({n}) (got shape {tuple(array.shape)})"
        )
    return array


def _select(available: Mapping[str, np.ndarray], fields: Any, n: int) -> dict[str, np.ndarray]:
    """Apply ``fields`` (None: all, names: a subset, mapping: extra arrays) to a point cloud."""
    if fields is None:
        return {k: v for k, v in available.items() if k not in RESERVED_NAMES}
    if isinstance(fields, Mapping):
        out = {k: v for k, v in available.items() if k not in RESERVED_NAMES}
        out.update({_check_name(k): _per_item(v, k, n, "point") for k, v in fields.items()})
        return out
    names = _field_names(fields)
    missing = [k for k in names if k not in available]
    if missing:
        raise ValueError(f"fields {missing} not found in data (available: {sorted(available)})")
    return {k: available[k] for k in names}


def _field_names(fields: Any) -> list[str]:
    if isinstance(fields, str) or not isinstance(fields, Sequence):
        raise TypeError(
            "fields must be None, a sequence of names or a mapping name -> array "
            f"(got {type(fields).__name__})"
        )
    return [_check_name(k) for k in fields]


def _from_cloud(points: np.ndarray, arrays: Mapping[str, Any], fields: Any) -> Dataset:
    n = points.shape[0]
    available = {}
    for key, value in arrays.items():
        if isinstance(value, torch.Tensor | np.ndarray) and value.ndim >= 1 and value.shape[0] == n:
            available[key] = as_numpy(value, f"field {key!r}")
    return Dataset("points", points, _select(available, fields, n), {})


def _from_mesh(mesh: Any, fields: Any) -> Dataset:
    """A pyvista/VTK dataset or a trimesh, read by the partitioner's adapter."""
    found = mesh_arrays(mesh, "data")
    points = _as_points(found.points, found.points_name)
    if found.kind == "poly" and found.num_cells == 0:
        return _from_cloud(points, found.point_data, fields)
    if found.kind == "ugrid" and np.any(found.types == VTK_POLYHEDRON):
        raise ValueError("data holds polyhedron cells (VTK type 42), which meshshard.io cannot split")
    cells = Cells(found.types, found.offsets, found.connectivity)
    num_points, num_cells = points.shape[0], len(cells)
    point_arrays = {k: v for k, v in found.point_data.items() if k not in RESERVED_NAMES}
    cell_arrays = {k: v for k, v in found.cell_data.items() if k not in RESERVED_NAMES}
    if fields is None:
        pass
    elif isinstance(fields, Mapping):
        for key, value in fields.items():
            key = _check_name(key)
            array = as_numpy(value, f"field {key!r}")
            if array.ndim >= 1 and array.shape[0] == num_cells:
                cell_arrays[key] = array
            elif array.ndim >= 1 and array.shape[0] == num_points:
                point_arrays[key] = array
            else:
                raise ValueError(
                    f"field {key!r} must have one row per cell ({num_cells}) or per point "
                    f"({num_points}) (got shape {tuple(array.shape)})"
                )
    else:
        names = _field_names(fields)
        missing = [k for k in names if k not in point_arrays and k not in cell_arrays]
        if missing:
            available = sorted({*point_arrays, *cell_arrays})
            raise ValueError(f"fields {missing} not found in data (available: {available})")
        point_arrays = {k: v for k, v in point_arrays.items() if k in names}
        cell_arrays = {k: v for k, v in cell_arrays.items() if k in names}
    point_data = {k: as_numpy(v, f"field {k!r}") for k, v in point_arrays.items()}
    cell_data = {k: as_numpy(v, f"field {k!r}") for k, v in cell_arrays.items()}
    return Dataset(found.kind, points, point_data, cell_data, cells)


def as_dataset(data: Any, fields: Any = None, arrays: bool = True) -> Dataset:
    """Describe ``data`` (any input :mod:`meshshard.io` accepts) as a :class:`Dataset`.

    ``fields``: ``None`` keeps every named per-point (per-cell) array of ``data``; a sequence of
    names keeps those; a mapping ``name -> array`` adds arrays (one row per point, or per cell of
    a mesh). ``arrays=False`` reads the geometry only.
    """
    if not arrays:
        ds = as_dataset(data, fields=[] if _has_named_arrays(data) else None)
        ds.point_data, ds.cell_data = {}, {}
        return ds
    if isinstance(data, torch.Tensor | np.ndarray | ShardTensor):
        points = _as_points(data, "data")
        if fields is not None and not isinstance(fields, Mapping):
            raise TypeError(
                "fields for a bare point array must be a mapping name -> array "
                f"(got {type(fields).__name__})"
            )
        return _from_cloud(points, {}, fields)
    if isinstance(data, Mapping):
        if "pos" not in data:
            raise ValueError(f"a sample dict needs a 'pos' entry (found keys {sorted(map(str, data))})")
        points = _as_points(data["pos"], "data['pos']")
        return _from_cloud(points, {k: v for k, v in data.items() if k != "pos"}, fields)
    if type(data).__module__.startswith("torch_geometric"):
        if getattr(data, "pos", None) is None:
            raise ValueError("a torch_geometric Data needs a 'pos' attribute of shape (N, 3)")
        points = _as_points(data.pos, "data.pos")
        arrays = {k: data[k] for k in data.node_attrs() if k != "pos"}
        return _from_cloud(points, arrays, fields)
    module = type(data).__module__
    if module.startswith(("pyvista", "vtkmodules", "vtk", "trimesh")):
        return _from_mesh(data, fields)
    raise TypeError(
        "data must be an (N, 3) tensor/array, a pyvista/VTK dataset, a trimesh, a torch_geometric "
        f"Data or a sample dict with 'pos' (got {type(data).__name__})"
    )


def _has_named_arrays(data: Any) -> bool:
    return not isinstance(data, torch.Tensor | np.ndarray | ShardTensor)


def partition_sizes_and_perm(partition: Partition | MeshPartition, ds: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """``(perm, sizes)`` of ``partition`` for ``ds`` as int64 numpy, checked.

    ``partition`` is a :class:`~meshshard.partition.Partition` of the points of a cloud or the
    cells of a mesh, or a :class:`~meshshard.partition.MeshPartition` (its ``cells`` partition
    is used for a mesh, its ``points`` partition for a cloud).
    """
    is_mesh = ds.cells is not None
    if isinstance(partition, MeshPartition):
        partition = partition.cells if is_mesh else partition.points
    if not isinstance(partition, Partition):
        raise TypeError(
            f"partition must be a meshshard Partition with perm and sizes (got {type(partition).__name__})"
        )
    perm = as_numpy(partition.perm, "partition.perm").astype(np.int64, copy=False).reshape(-1)
    sizes = as_numpy(partition.sizes, "partition.sizes").astype(np.int64, copy=False).reshape(-1)
    n = ds.num_items
    if perm.shape[0] != n:
        what = "cells" if is_mesh else "points"
        hint = ""
        if is_mesh and perm.shape[0] == ds.points.shape[0]:
            hint = (
                " (it matches the mesh's points, but meshes are split by cells: use "
                "partition_mesh(mesh, P).cells, or pass the points as a cloud)"
            )
        raise ValueError(f"partition covers {perm.shape[0]} items but data has {n} {what}{hint}")
    if sizes.sum() != n or np.any(sizes < 0):
        raise ValueError(f"partition.sizes must be >= 0 and sum to {n} (got {sizes.tolist()})")
    return perm, sizes
