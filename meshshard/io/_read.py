"""Reading mesh files, with one clear error instead of VTK's console noise and an empty mesh.

VTK readers do not raise on a file they cannot parse (a text file named ``.vtp``, a truncated
download): they log errors to stderr and return an empty dataset, which then flows through a
pipeline as "0 cells". :func:`read_mesh` (any format pyvista reads) silences the logging, keeps
the first error VTK reported, and raises :class:`MeshReadError` when the file could not be read or
holds nothing. :func:`read_cell_mesh` reads a VTK XML file (``.vtp``, ``.vtu``, or a ``.vtu`` split
into byte pieces) with chosen cell-data fields into a :class:`~meshshard.io._data.Dataset`, and
raises :class:`~meshshard.errors.DatasetError` naming the file and what is wrong with it.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._checks import check_points, points_problem
from ..errors import DatasetError, MeshReadError
from ..partition import POLY_SECTIONS
from ._data import Cells, Dataset

__all__ = ["MESH_SUFFIXES", "MeshReadError", "assemble_parts", "read_cell_mesh", "read_mesh", "read_points"]

#: File types :func:`read_mesh` accepts (pyvista/VTK readers), lower case.
MESH_SUFFIXES = (".vtp", ".vtu", ".vtk", ".stl", ".ply", ".obj")


def _clean(message: str) -> str:
    line = next((s for s in reversed(message.strip().splitlines()) if s.strip()), message)
    return re.sub(r"\s*\(0x[0-9a-fA-F]+\)", "", line).strip()


def read_mesh(path: str | os.PathLike[str]) -> Any:
    """Read a ``.vtp/.vtu/.vtk/.stl/.ply/.obj`` file with pyvista; raise one clear error when it fails.

    Raises
    ------
    FileNotFoundError
        ``path`` is not a file.
    MeshReadError
        The suffix is not a mesh format, VTK could not parse the file, or it holds no points.
    """
    import pyvista as pv
    from pyvista.core.utilities.observers import VtkErrorCatcher
    from vtkmodules.vtkCommonCore import vtkLogger

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not a file" if path.exists() else f"{path}: file not found")
    if path.suffix.lower() not in MESH_SUFFIXES:
        raise MeshReadError(f"{path}: not a mesh file (expected one of {', '.join(MESH_SUFFIXES)})")
    verbosity = vtkLogger.GetCurrentVerbosityCutoff()
    vtkLogger.SetStderrVerbosity(vtkLogger.VERBOSITY_OFF)
    logging.disable(logging.CRITICAL)  # pyvista re-logs VTK errors through the root logger
    try:
        with warnings.catch_warnings(), VtkErrorCatcher(raise_errors=False, send_to_logging=False) as caught:
            warnings.simplefilter("ignore")
            try:
                mesh = pv.read(str(path))
            except Exception as exc:  # VTK and pyvista raise many types
                raise MeshReadError(f"{path}: cannot read it ({type(exc).__name__}: {_clean(str(exc))})") from None
    finally:
        logging.disable(logging.NOTSET)
        vtkLogger.SetStderrVerbosity(verbosity)
    errors = [_clean(str(e)) for e in caught.events if "ERROR" in str(e).upper()]
    if errors:
        raise MeshReadError(f"{path}: not a valid {path.suffix} file, or truncated ({errors[0]})")
    if isinstance(mesh, pv.MultiBlock):
        mesh = mesh.combine()
    if mesh is None or mesh.n_points == 0:
        raise MeshReadError(f"{path}: the file holds no points (empty or truncated)")
    return mesh


def read_points(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an ``(N, 2)`` or ``(N, 3)`` point cloud from a ``.npy`` file; raise one clear error when it fails.

    Raises
    ------
    FileNotFoundError
        ``path`` is not a file.
    MeshReadError
        The file is not a readable ``.npy`` array, not numeric ``(N, 2|3)``, empty, or not finite.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not a file" if path.exists() else f"{path}: file not found")
    try:
        points = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise MeshReadError(f"cannot read {path} as a .npy array ({exc})") from None
    name = f"{path}: the array"
    try:
        coords = check_points(points, name, dims=(2, 3), arrays=True, integers=True)
    except (TypeError, ValueError) as exc:
        raise MeshReadError(str(exc)) from None
    if len(points) == 0:
        raise MeshReadError(f"{path} holds no points")
    problem = points_problem(coords, name)
    if problem is not None:
        raise MeshReadError(problem)
    return points


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
) -> Dataset:
    """Read a VTK XML file (``.vtp``, ``.vtu``) and its cell-data ``fields``, checking presence, placement and shape.

    Returns a :class:`~meshshard.io._data.Dataset` (``kind`` ``"poly"`` or ``"ugrid"``) with the
    points, the cells and ``cell_data`` holding exactly ``fields``; no point data is read.
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


def _read(path: Path, fields: Sequence[str], components: dict[str, int], shown: str) -> Dataset:
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
    if layout == "polygons":
        types = np.full(num_cells, POLY_SECTIONS.index("polys"), dtype=np.uint8)
    else:
        import pyvista as pv

        types = np.asarray(pv.wrap(data).celltypes).astype(np.uint8, copy=False)  # pyvista hides VTK's API churn
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
    kind = "poly" if layout == "polygons" else "ugrid"
    return Dataset(kind, points, {}, cell_data, Cells(types, offsets, connectivity))
