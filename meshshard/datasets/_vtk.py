"""Reading VTK XML files (``.vtp``, ``.vtu``, split ``.vtu.NN.part``) into numpy, with clear errors."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DatasetError

__all__ = ["DatasetError", "CellMesh", "read_cell_mesh", "assemble_parts"]


@dataclass
class CellMesh:
    """Points, cells (VTK offsets/connectivity layout) and the requested cell-data arrays."""

    points: np.ndarray  # (V, 3)
    connectivity: np.ndarray  # (K,)
    offsets: np.ndarray  # (C + 1,)
    cell_data: dict[str, np.ndarray]  # name -> (C,) or (C, k)

    @property
    def num_cells(self) -> int:
        return len(self.offsets) - 1


def assemble_parts(parts: Sequence[Path], out_path: Path) -> None:
    """Concatenate the byte pieces of a split file (``volume_i.vtu.00.part``, ...) in order."""
    with open(out_path, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out, length=1 << 24)


def _vtk_reader(path: Path):  # noqa: ANN202 (vtk types)
    from vtkmodules.vtkIOXML import vtkXMLPolyDataReader, vtkXMLUnstructuredGridReader

    suffix = path.name.split(".")[1] if "." in path.name else ""
    if suffix == "vtp":
        return vtkXMLPolyDataReader(), "polygons"
    if suffix == "vtu":
        return vtkXMLUnstructuredGridReader(), "cells"
    raise DatasetError(f"{path}: unsupported file type (expected .vtp or .vtu)")


def read_cell_mesh(
    path: str | os.PathLike[str],
    fields: Sequence[str],
    components: dict[str, int] | None = None,
    parts: Sequence[Path] | None = None,
) -> CellMesh:
    """Read a VTK XML file and the cell-data ``fields``, checking presence, placement and shape.

    ``parts``: byte pieces to concatenate (into a temporary file) instead of reading ``path``.
    ``components``: expected number of components per field name (checked when given).

    Raises
    ------
    FileNotFoundError
        If the file (or a part) does not exist.
    DatasetError
        If the file cannot be parsed, has no cells, holds non-polygon cells in a ``.vtp``, lacks a
        field (or has it as point data), or a field has the wrong length or number of components.
    """
    path = Path(path)
    if parts:
        with tempfile.TemporaryDirectory(prefix="meshshard-parts-") as tmp:
            joined = Path(tmp) / path.name
            assemble_parts(parts, joined)
            mesh = _read(joined, fields, components or {}, shown=f"{path} (from {len(parts)} parts)")
        return mesh
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    return _read(path, fields, components or {}, shown=str(path))


def _read(path: Path, fields: Sequence[str], components: dict[str, int], shown: str) -> CellMesh:
    from vtkmodules.util.numpy_support import vtk_to_numpy
    from vtkmodules.vtkCommonCore import vtkLogger, vtkOutputWindow, vtkStringOutputWindow

    reader, layout = _vtk_reader(path)
    reader.SetFileName(str(path))
    # Collect VTK's messages instead of printing them, to put them in our error.
    previous = vtkOutputWindow.GetInstance()
    log = vtkStringOutputWindow()
    vtkOutputWindow.SetInstance(log)
    verbosity = vtkLogger.GetCurrentVerbosityCutoff()
    vtkLogger.SetStderrVerbosity(vtkLogger.VERBOSITY_OFF)
    try:
        reader.UpdateInformation()
        selection = reader.GetCellDataArraySelection()
        available = {selection.GetArrayName(i) for i in range(selection.GetNumberOfArrays())}
        for name in available:
            if name in fields:
                selection.EnableArray(name)
            else:
                selection.DisableArray(name)
        reader.GetPointDataArraySelection().DisableAllArrays()
        reader.Update()
    finally:
        vtkOutputWindow.SetInstance(previous)
        vtkLogger.SetStderrVerbosity(verbosity)
    messages = " ".join(line.strip() for line in log.GetOutput().splitlines() if line.strip())
    data = reader.GetOutput()
    num_cells = data.GetNumberOfCells() if data is not None else 0
    short = re.search(r'Cannot read cell data array "([^"]+)"', messages)
    if short:
        raise DatasetError(
            f"{shown}: cell field {short.group(1)!r} has the wrong length (fewer values than the "
            f"{reader.GetNumberOfCells()} cells). VTK said: {messages[:400]}"
        )
    if data is None or num_cells == 0 or data.GetPoints() is None:
        hint = f" VTK said: {messages[:400]}" if messages else ""
        raise DatasetError(f"{shown}: could not be read as VTK XML or holds no cells (corrupt or truncated?).{hint}")

    for name in fields:
        if name not in available:
            point_names = reader.GetPointDataArraySelection()
            as_points = any(point_names.GetArrayName(i) == name for i in range(point_names.GetNumberOfArrays()))
            where = " (it is stored as point data; DrivaerML fields are cell data)" if as_points else ""
            raise DatasetError(
                f"{shown}: cell field {name!r} not found{where}; available cell fields: {sorted(available)}"
            )

    if layout == "polygons":
        other = data.GetNumberOfVerts() + data.GetNumberOfLines() + data.GetNumberOfStrips()
        if other:
            raise DatasetError(f"{shown}: expected only polygon cells (got {other} vertex/line/strip cells)")
        cells = data.GetPolys()
    else:
        cells = data.GetCells()
    offsets = vtk_to_numpy(cells.GetOffsetsArray()).astype(np.int64, copy=False)
    connectivity = vtk_to_numpy(cells.GetConnectivityArray()).astype(np.int64, copy=False)
    points = vtk_to_numpy(data.GetPoints().GetData())

    cell_data = {}
    vtk_cell_data = data.GetCellData()
    for name in fields:
        array = vtk_cell_data.GetArray(name)
        if array is None or array.GetNumberOfTuples() != num_cells:
            found = "no array" if array is None else f"{array.GetNumberOfTuples()} values"
            hint = f" VTK said: {messages[:400]}" if messages else ""
            raise DatasetError(
                f"{shown}: cell field {name!r} has the wrong length (expected {num_cells} cells, got {found}).{hint}"
            )
        values = vtk_to_numpy(array)
        got = 1 if values.ndim == 1 else values.shape[1]
        want = components.get(name)
        if want is not None and got != want:
            raise DatasetError(f"{shown}: cell field {name!r} must have {want} component(s) (got {got})")
        cell_data[name] = values
    return CellMesh(points, connectivity, offsets, cell_data)
