"""meshshard.io._read: read_mesh (any format pyvista reads) and read_cell_mesh (VTK XML with cell fields)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import pyvista as pv
from vtkmodules.util.numpy_support import vtk_to_numpy

from meshshard.errors import DatasetError
from meshshard.io import MeshReadError, read_mesh
from meshshard.io._read import assemble_parts, read_cell_mesh

# ---------------------------------------------------------------- read_mesh


def test_read_mesh_reads_what_pyvista_wrote(tmp_path: Path, sphere: pv.PolyData) -> None:
    sphere.save(tmp_path / "s.vtp")
    mesh = read_mesh(tmp_path / "s.vtp")
    np.testing.assert_array_equal(mesh.points, sphere.points)
    np.testing.assert_array_equal(mesh.faces, sphere.faces)


def test_read_mesh_errors(tmp_path: Path, sphere: pv.PolyData) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.vtp: file not found"):
        read_mesh(tmp_path / "nope.vtp")
    with pytest.raises(FileNotFoundError, match="not a file"):
        read_mesh(tmp_path)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(MeshReadError, match=r"notes\.txt: not a mesh file \(expected one of \.vtp, \.vtu"):
        read_mesh(tmp_path / "notes.txt")
    (tmp_path / "junk.vtp").write_text("not a vtk file" * 10)
    with pytest.raises(MeshReadError, match=r"junk\.vtp: not a valid \.vtp file, or truncated"):
        read_mesh(tmp_path / "junk.vtp")
    pv.PolyData().save(tmp_path / "empty.vtp")
    with pytest.raises(MeshReadError, match=r"empty\.vtp: the file holds no points"):
        read_mesh(tmp_path / "empty.vtp")
    assert issubclass(MeshReadError, ValueError)


# ---------------------------------------------------------------- read_cell_mesh


def _polygons() -> pv.PolyData:
    """A unit square (quad) and a triangle, with a scalar and a vector cell field."""
    points = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 1]], dtype=np.float32)
    mesh = pv.PolyData(points, np.array([4, 0, 1, 2, 3, 3, 0, 3, 4]))
    mesh.cell_data["p"] = np.array([1.0, 2.0], dtype=np.float32)
    mesh.cell_data["tau"] = np.arange(6, dtype=np.float32).reshape(2, 3)
    mesh.point_data["ignored"] = np.zeros(5, dtype=np.float32)
    return mesh


def test_polydata_into_cells_exactly(tmp_path: Path) -> None:
    _polygons().save(tmp_path / "b.vtp")
    mesh = read_cell_mesh(tmp_path / "b.vtp", ["tau"], {"tau": 3})
    assert mesh.kind == "poly" and len(mesh.cells) == 2 and mesh.point_data == {}
    np.testing.assert_array_equal(mesh.points, _polygons().points)
    np.testing.assert_array_equal(mesh.cells.offsets, [0, 4, 7])
    np.testing.assert_array_equal(mesh.cells.connectivity, [0, 1, 2, 3, 0, 3, 4])
    np.testing.assert_array_equal(mesh.cells.types, [2, 2])  # the polys section
    assert list(mesh.cell_data) == ["tau"]
    np.testing.assert_array_equal(mesh.cell_data["tau"], np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(mesh.centres(), [[0.5, 0.5, 0.0], [0.0, 1 / 3, 1 / 3]])


def test_unstructured_grid_and_split_parts(tmp_path: Path, tets: pv.UnstructuredGrid) -> None:
    tets.save(tmp_path / "v.vtu")
    whole = read_cell_mesh(tmp_path / "v.vtu", ["u"], {"u": 3})
    assert whole.kind == "ugrid"
    np.testing.assert_array_equal(whole.cells.types, tets.celltypes)
    np.testing.assert_array_equal(whole.cells.offsets, vtk_to_numpy(tets.GetCells().GetOffsetsArray()))
    np.testing.assert_array_equal(whole.cells.connectivity, vtk_to_numpy(tets.GetCells().GetConnectivityArray()))
    np.testing.assert_array_equal(whole.cell_data["u"], tets.cell_data["u"])

    data = (tmp_path / "v.vtu").read_bytes()
    parts = []
    for i, lo in enumerate(range(0, len(data), len(data) // 3 + 1)):
        parts.append(tmp_path / f"v.vtu.{i:02d}.part")
        parts[-1].write_bytes(data[lo:lo + len(data) // 3 + 1])
    joined = tmp_path / "joined.vtu"
    assemble_parts(parts, joined)
    assert joined.read_bytes() == data
    split = read_cell_mesh(tmp_path / "absent.vtu", ["u"], parts=parts)
    np.testing.assert_array_equal(split.points, whole.points)
    np.testing.assert_array_equal(split.cells.connectivity, whole.cells.connectivity)
    np.testing.assert_array_equal(split.cell_data["u"], whole.cell_data["u"])
    with pytest.raises(DatasetError, match=re.escape("absent.vtu (from 2 parts): could not be read")):
        read_cell_mesh(tmp_path / "absent.vtu", ["u"], parts=parts[:2])


def _write_with_vtk(mesh: pv.PolyData, path: Path) -> None:
    from vtkmodules.vtkIOXML import vtkXMLPolyDataWriter

    writer = vtkXMLPolyDataWriter()
    writer.SetFileName(str(path))
    writer.SetInputData(mesh)
    writer.Write()


def test_bad_arrays(tmp_path: Path) -> None:
    from vtkmodules.util.numpy_support import numpy_to_vtk

    path = tmp_path / "boundary_1.vtp"
    corners = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0]], dtype=np.float32)
    square = pv.PolyData(corners, [3, 0, 1, 2, 3, 0, 2, 3])

    short = square.copy()
    array = numpy_to_vtk(np.zeros(1, dtype=np.float32), deep=1)
    array.SetName("pMeanTrim")
    short.GetCellData().AddArray(array)  # 1 value for 2 cells: VTK refuses the array
    _write_with_vtk(short, path)
    with pytest.raises(DatasetError, match=r"boundary_1\.vtp: cell field 'pMeanTrim' has the wrong length"):
        read_cell_mesh(path, ["pMeanTrim"])

    wrong = square.copy()
    wrong.cell_data["wallShearStressMeanTrim"] = np.zeros((2, 2), dtype=np.float32)
    wrong.save(path)
    with pytest.raises(DatasetError, match=r"'wallShearStressMeanTrim' must have 3 component\(s\) \(got 2\)"):
        read_cell_mesh(path, ["wallShearStressMeanTrim"], {"wallShearStressMeanTrim": 3})

    pointwise = square.copy()
    pointwise.point_data["pMeanTrim"] = np.zeros(4, dtype=np.float32)
    pointwise.save(path)
    with pytest.raises(DatasetError, match="it is stored as point data"):
        read_cell_mesh(path, ["pMeanTrim"])
    with pytest.raises(DatasetError, match=r"boundary_1\.vtp: cell field 'UMeanTrim' not found; available"):
        read_cell_mesh(path, ["UMeanTrim"])

    lines = pv.PolyData(np.zeros((2, 3), dtype=np.float32), lines=[2, 0, 1])
    lines.cell_data["pMeanTrim"] = np.zeros(1, dtype=np.float32)
    lines.save(path)
    with pytest.raises(DatasetError, match=r"expected only polygon cells \(got 1 vertex/line/strip cells\)"):
        read_cell_mesh(path, ["pMeanTrim"])


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_file(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "boundary_1.vtp"
    _polygons().save(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"not a vtk file" * 10)
    with pytest.raises(DatasetError, match=r"boundary_1\.vtp: could not be read as VTK XML .*corrupt or truncated"):
        read_cell_mesh(path, ["p"])


def test_missing_file_and_unsupported_type(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.vtp: file not found"):
        read_cell_mesh(tmp_path / "nope.vtp", [])
    (tmp_path / "m.stl").write_text("solid x\nendsolid x\n")
    with pytest.raises(DatasetError, match=r"m\.stl: unsupported file type \(expected \.vtp or \.vtu\)"):
        read_cell_mesh(tmp_path / "m.stl", [])


def test_read_points_reads_a_finite_numeric_cloud(tmp_path):
    from meshshard.io._read import read_points

    path = tmp_path / "cloud.npy"
    np.save(path, np.arange(12, dtype=np.float64).reshape(4, 3))
    np.testing.assert_array_equal(read_points(path), np.arange(12).reshape(4, 3))


@pytest.mark.parametrize(
    "array, match",
    [
        (np.zeros((4, 4)), r"bad\.npy: the array must have shape \(N, 2\) or \(N, 3\) \(got \(4, 4\)\)"),
        (np.zeros((0, 3)), r"holds no points"),
        (np.array([[0.0, np.nan, 1.0]]), r"the array must be finite \(found 1 row with NaN/Inf, first at row 0\)"),
        (np.array([["a", "b", "c"]]), r"the array must hold real numbers \(got numpy dtype <U1\)"),
    ],
)
def test_read_points_refuses_what_is_not_a_point_cloud(tmp_path, array, match):
    from meshshard.io._read import read_points

    path = tmp_path / "bad.npy"
    np.save(path, array)
    with pytest.raises(MeshReadError, match=match):
        read_points(path)
    with pytest.raises(FileNotFoundError, match="file not found"):
        read_points(tmp_path / "missing.npy")
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    with pytest.raises(MeshReadError, match=r"cannot read .*junk.npy as a .npy array"):
        read_points(tmp_path / "junk.npy")
