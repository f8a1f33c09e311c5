"""Pieces as VTK objects, the XML writers, and the parallel index files (.pvtp/.pvtu, .vtpd).

VTK's parallel XML writers need an MPI controller to write one piece per process, and pyvista
cannot write ``.pvtp``/``.pvtu`` at all, so the index is a few lines of XML written here. Every
file goes to a temporary name in the target folder first and is renamed into place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import quoteattr

import numpy as np

from .._atomic import atomic_replace
from .._checks import check_choice
from ._data import Cells

__all__ = ["Piece", "Schema", "read_schema", "write_index", "write_piece"]

DUPLICATEPOINT = 1  # vtkDataSetAttributes::DUPLICATEPOINT
DUPLICATECELL = 1  # vtkDataSetAttributes::DUPLICATECELL

_XML_TYPES = {
    np.dtype(np.float32): "Float32", np.dtype(np.float64): "Float64",
    np.dtype(np.int8): "Int8", np.dtype(np.uint8): "UInt8",
    np.dtype(np.int16): "Int16", np.dtype(np.uint16): "UInt16",
    np.dtype(np.int32): "Int32", np.dtype(np.uint32): "UInt32",
    np.dtype(np.int64): "Int64", np.dtype(np.uint64): "UInt64",
}
EXTENSIONS = {"poly": (".vtp", ".pvtp", "PPolyData"), "ugrid": (".vtu", ".pvtu", "PUnstructuredGrid")}


@dataclass
class Piece:
    """One rank's share, ready for VTK: points, local cells and named arrays.

    **Shapes**: ``points`` (N_local + N_ghost, 3); ``point_data[name]`` (N_local + N_ghost, ...);
    ``cell_data[name]`` (C_local + C_ghost, ...). Point and cell ids in ``cells`` are local.
    """

    kind: str  # "poly" | "ugrid"
    points: np.ndarray
    cells: Cells
    point_data: dict[str, np.ndarray] = field(default_factory=dict)
    cell_data: dict[str, np.ndarray] = field(default_factory=dict)
    #: whole-dataset values (VTK FieldData): strings, numbers or 1-D arrays
    field_data: dict[str, object] = field(default_factory=dict)


@dataclass
class Schema:
    """What the index file declares: the points type and every array's (name, type, components)."""

    kind: str
    points_type: str
    point_arrays: list[tuple[str, str, int]]
    cell_arrays: list[tuple[str, str, int]]
    ghost_level: int = 0


def _xml_type(dtype: np.dtype, name: str) -> str:
    try:
        return _XML_TYPES[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"array {name!r} has dtype {dtype}, which VTK XML files cannot hold") from None


def _components(array: np.ndarray) -> int:
    return int(np.prod(array.shape[1:], dtype=np.int64)) if array.ndim > 1 else 1


def schema_of(piece: Piece) -> Schema:
    """The :class:`Schema` of ``piece`` (all pieces of one write share it)."""
    def arrays(data: dict[str, np.ndarray]) -> list[tuple[str, str, int]]:
        return [(k, _xml_type(v.dtype, k), _components(v)) for k, v in data.items()]

    ghost = int("vtkGhostType" in piece.point_data or "vtkGhostType" in piece.cell_data)
    return Schema(piece.kind, _xml_type(piece.points.dtype, "points"), arrays(piece.point_data),
                  arrays(piece.cell_data), ghost)


def _to_vtk_array(name: str, array: np.ndarray, id_type: bool = False):
    from vtkmodules.util.numpy_support import numpy_to_vtk
    from vtkmodules.vtkCommonCore import VTK_ID_TYPE

    components = _components(array)
    flat = np.ascontiguousarray(array.reshape(array.shape[0], components) if array.ndim > 1 else array)
    out = numpy_to_vtk(flat, deep=True, array_type=VTK_ID_TYPE if id_type else None)
    out.SetNumberOfComponents(components)
    out.SetName(name)
    return out


def _cell_array(offsets: np.ndarray, connectivity: np.ndarray):
    from vtkmodules.vtkCommonDataModel import vtkCellArray

    cells = vtkCellArray()
    cells.SetData(_to_vtk_array("offsets", offsets.astype(np.int64), True),
                  _to_vtk_array("connectivity", connectivity.astype(np.int64), True))
    return cells


def to_vtk(piece: Piece):
    """``piece`` as a ``vtkPolyData`` / ``vtkUnstructuredGrid`` (arrays deep-copied)."""
    from vtkmodules.vtkCommonCore import vtkPoints
    from vtkmodules.vtkCommonDataModel import vtkPolyData, vtkUnstructuredGrid

    cells = piece.cells
    if piece.kind == "poly":
        out = vtkPolyData()
        setters = (out.SetVerts, out.SetLines, out.SetPolys, out.SetStrips)
        bounds = np.searchsorted(cells.types, np.arange(5))  # cells are sorted by section
        for k, setter in enumerate(setters):
            lo, hi = bounds[k], bounds[k + 1]
            if hi > lo:
                offsets = cells.offsets[lo:hi + 1]
                setter(_cell_array(offsets - offsets[0], cells.connectivity[offsets[0]:offsets[-1]]))
    else:
        from vtkmodules.util.numpy_support import numpy_to_vtk
        from vtkmodules.vtkCommonCore import VTK_UNSIGNED_CHAR

        out = vtkUnstructuredGrid()
        types = numpy_to_vtk(cells.types.astype(np.uint8), deep=True, array_type=VTK_UNSIGNED_CHAR)
        out.SetCells(types, _cell_array(cells.offsets, cells.connectivity))
    points = vtkPoints()
    points.SetData(_to_vtk_array("Points", piece.points))
    out.SetPoints(points)
    for data, target in ((piece.point_data, out.GetPointData()), (piece.cell_data, out.GetCellData())):
        for name, array in data.items():
            is_id = name in ("GlobalPointIds", "GlobalCellIds")
            vtk_array = _to_vtk_array(name, array, id_type=is_id)
            if is_id:
                target.SetGlobalIds(vtk_array)
            else:
                target.AddArray(vtk_array)
    for name, value in piece.field_data.items():
        out.GetFieldData().AddArray(_field_array(name, value))
    return out


def _field_array(name: str, value: object):
    """A FieldData array: a one-tuple string array for text, else a numeric array."""
    if isinstance(value, str):
        from vtkmodules.vtkCommonCore import vtkStringArray

        array = vtkStringArray()
        array.SetName(name)
        array.InsertNextValue(value)
        return array
    values = np.atleast_1d(np.asarray(value))
    if values.dtype == bool:
        values = values.astype(np.uint8)
    elif values.dtype.kind == "f":
        values = values.astype(np.float64)
    elif values.dtype.kind in "iu":
        values = values.astype(np.int64)
    return _to_vtk_array(name, values)


COMPRESSORS = (None, "zlib", "lz4", "lzma")


def check_compression(compression: object) -> str | None:
    """``compression`` if VTK's XML writers know it, else a ValueError naming the choices."""
    return check_choice(compression, "compression", COMPRESSORS)  # type: ignore[return-value]


def _writer(kind: str, compression: str | None):
    from vtkmodules.vtkIOXML import vtkXMLPolyDataWriter, vtkXMLUnstructuredGridWriter

    writer = vtkXMLPolyDataWriter() if kind == "poly" else vtkXMLUnstructuredGridWriter()
    writer.SetDataModeToAppended()
    writer.EncodeAppendedDataOff()  # raw bytes: exact, and no base64 cost
    if compression is None:
        writer.SetCompressorTypeToNone()
    else:
        {"zlib": writer.SetCompressorTypeToZLib, "lz4": writer.SetCompressorTypeToLZ4,
         "lzma": writer.SetCompressorTypeToLZMA}[compression]()
    writer.SetHeaderTypeToUInt64()
    return writer


def write_piece(piece: Piece, path: Path, compression: str | None = None) -> None:
    """Write ``piece`` to ``path`` (any name; the caller renames it into place)."""
    writer = _writer(piece.kind, compression)
    writer.SetInputData(to_vtk(piece))
    writer.SetFileName(str(path))
    if writer.Write() != 1:
        raise OSError(f"VTK could not write {path}")


def _data_arrays(tag: str, arrays: list[tuple[str, str, int]], global_ids: str | None) -> list[str]:
    attrs = f" GlobalIds={quoteattr(global_ids)}" if global_ids else ""
    if not arrays:
        return [f"    <{tag}/>"]
    lines = [f"    <{tag}{attrs}>"]
    lines += [f'      <PDataArray type="{t}" Name={quoteattr(n)} NumberOfComponents="{c}"/>'
              for n, t, c in arrays]
    return lines + [f"    </{tag}>"]


def index_xml(schema: Schema, sources: list[str]) -> str:
    """The ``.pvtp``/``.pvtu`` text declaring ``schema`` and referencing ``sources``."""
    tag = EXTENSIONS[schema.kind][2]
    point_ids = "GlobalPointIds" if any(n == "GlobalPointIds" for n, _, _ in schema.point_arrays) else None
    cell_ids = "GlobalCellIds" if any(n == "GlobalCellIds" for n, _, _ in schema.cell_arrays) else None
    lines = [
        '<?xml version="1.0"?>',
        f'<VTKFile type="{tag}" version="1.0" byte_order="LittleEndian" header_type="UInt64">',
        f'  <{tag} GhostLevel="{schema.ghost_level}">',
        *_data_arrays("PPointData", schema.point_arrays, point_ids),
        *_data_arrays("PCellData", schema.cell_arrays, cell_ids),
        "    <PPoints>",
        f'      <PDataArray type="{schema.points_type}" Name="Points" NumberOfComponents="3"/>',
        "    </PPoints>",
        *[f"    <Piece Source={quoteattr(s)}/>" for s in sources],
        f"  </{tag}>",
        "</VTKFile>",
        "",
    ]
    return "\n".join(lines)


def partitioned_xml(sources: list[str]) -> str:
    """The ``.vtpd`` text (a vtkPartitionedDataSet, one partition per rank) for ``sources``."""
    lines = [
        '<?xml version="1.0"?>',
        '<VTKFile type="vtkPartitionedDataSet" version="1.0" byte_order="LittleEndian" '
        'header_type="UInt64">',
        "  <vtkPartitionedDataSet>",
        *[f'    <DataSet index="{r}" file={quoteattr(s)}/>' for r, s in enumerate(sources)],
        "  </vtkPartitionedDataSet>",
        "</VTKFile>",
        "",
    ]
    return "\n".join(lines)


def write_index(path: Path, schema: Schema, sources: list[str]) -> None:
    """Write the ``.vtpd`` then, last, the ``.pvtp``/``.pvtu`` index at ``path`` (both atomic)."""
    vtpd = path.with_suffix(".vtpd")
    atomic_replace(vtpd, lambda tmp: tmp.write_text(partitioned_xml(sources)))
    atomic_replace(path, lambda tmp: tmp.write_text(index_xml(schema, sources)))


def read_schema(piece_path: Path, kind: str) -> Schema:
    """The :class:`Schema` of a piece file already on disk."""
    from vtkmodules.util.numpy_support import vtk_to_numpy
    from vtkmodules.vtkIOXML import vtkXMLPolyDataReader, vtkXMLUnstructuredGridReader

    reader = vtkXMLPolyDataReader() if kind == "poly" else vtkXMLUnstructuredGridReader()
    reader.SetFileName(str(piece_path))
    reader.Update()
    out = reader.GetOutput()
    if out is None or out.GetPoints() is None:
        raise OSError(f"could not read the piece {piece_path}")

    def arrays(data) -> list[tuple[str, str, int]]:
        found = []
        for i in range(data.GetNumberOfArrays()):
            array = data.GetAbstractArray(i)
            dtype = vtk_to_numpy(array).dtype
            found.append((array.GetName(), _xml_type(dtype, array.GetName()),
                          array.GetNumberOfComponents()))
        return found

    point_arrays, cell_arrays = arrays(out.GetPointData()), arrays(out.GetCellData())
    ghost = int(any(n == "vtkGhostType" for n, _, _ in point_arrays + cell_arrays))
    points_type = _xml_type(vtk_to_numpy(out.GetPoints().GetData()).dtype, "points")
    return Schema(kind, points_type, point_arrays, cell_arrays, ghost)
