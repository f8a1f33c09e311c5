"""meshshard.io._vtk: pieces as VTK objects, the XML piece writer, the schema and the index files."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import pyvista as pv

from meshshard.io._data import Cells
from meshshard.io._vtk import (
    Piece,
    check_compression,
    index_xml,
    partitioned_xml,
    read_schema,
    schema_of,
    to_vtk,
    write_index,
    write_piece,
)


def _piece() -> Piece:
    """Two polygons and a line (sections sorted), a vector point array, ids and FieldData."""
    points = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0]], dtype=np.float32)
    cells = Cells(np.array([1, 2, 2], np.uint8), np.array([0, 2, 5, 8]), np.array([0, 1, 0, 1, 2, 0, 2, 3]))
    return Piece(
        "poly", points, cells,
        {"u": np.arange(12, dtype=np.float64).reshape(4, 3), "GlobalPointIds": np.arange(4, dtype=np.int64)},
        {"vtkProcessId": np.array([0, 0, 1], np.int32)},
        {"method": "rcb", "num_parts": 2, "imbalance": 1.5},
    )


def test_piece_written_and_read_back_exactly(tmp_path):
    piece = _piece()
    write_piece(piece, tmp_path / "p.vtp", compression="zlib")
    mesh = pv.read(tmp_path / "p.vtp")
    np.testing.assert_array_equal(mesh.points, piece.points)
    assert mesh.n_lines == 1 and mesh.n_cells == 3
    np.testing.assert_array_equal(mesh.lines, [2, 0, 1])
    np.testing.assert_array_equal(mesh.faces, [3, 0, 1, 2, 3, 0, 2, 3])
    np.testing.assert_array_equal(mesh.point_data["u"], piece.point_data["u"])
    np.testing.assert_array_equal(mesh.cell_data["vtkProcessId"], [0, 0, 1])
    assert mesh.GetPointData().GetGlobalIds().GetName() == "GlobalPointIds"
    assert mesh.field_data["method"][0] == "rcb" and mesh.field_data["imbalance"][0] == 1.5
    assert read_schema(tmp_path / "p.vtp", "poly") == schema_of(piece)


def test_unstructured_piece_keeps_cell_types():
    points = np.eye(4, 3, dtype=np.float64)
    cells = Cells(np.array([10], np.uint8), np.array([0, 4]), np.array([0, 1, 2, 3]))
    grid = pv.wrap(to_vtk(Piece("ugrid", points, cells)))
    assert grid.celltypes.tolist() == [10] and grid.n_points == 4


def test_index_declares_the_schema_and_references_the_pieces(tmp_path):
    schema = schema_of(_piece())
    assert schema.points_type == "Float32" and schema.ghost_level == 0
    root = ET.fromstring(index_xml(schema, ["a_0.vtp", "a_1.vtp"]))
    assert root.get("type") == "PPolyData"
    assert [p.get("Source") for p in root.iter("Piece")] == ["a_0.vtp", "a_1.vtp"]
    point_data = root.find("PPolyData/PPointData")
    assert point_data.get("GlobalIds") == "GlobalPointIds"
    assert [(a.get("Name"), a.get("type"), a.get("NumberOfComponents")) for a in point_data] == [
        ("u", "Float64", "3"), ("GlobalPointIds", "Int64", "1")
    ]
    blocks = ET.fromstring(partitioned_xml(["a_0.vtp", "a_1.vtp"]))
    assert [d.get("file") for d in blocks.iter("DataSet")] == ["a_0.vtp", "a_1.vtp"]
    write_index(tmp_path / "a.pvtp", schema, ["a_0.vtp"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pvtp", "a.vtpd"]


def test_what_vtk_xml_cannot_hold():
    with pytest.raises(ValueError, match=re.escape("compression must be one of (None, 'zlib', 'lz4', 'lzma')")):
        check_compression("gzip")
    piece = _piece()
    piece.point_data["z"] = np.zeros(4, dtype=np.complex64)
    with pytest.raises(TypeError, match="array 'z' has dtype complex64, which VTK XML files cannot hold"):
        schema_of(piece)
