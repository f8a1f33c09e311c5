from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import pyvista as pv
import torch

from meshshard.datasets import DatasetError, DrivaerML


def test_sample_layout(tiny_root: Path) -> None:
    ds = DrivaerML(tiny_root, volume=True)
    assert len(ds) == 3 and ds.runs == [1, 2, 3]
    s = ds[1]
    assert s["run"] == 2
    surf, vol = s["surface"], s["volume"]
    n = surf["pos"].shape[0]
    assert set(surf) == {"pos", "normals", "areas", "pMeanTrim", "CpMeanTrim", "wallShearStressMeanTrim"}
    assert surf["pos"].shape == (n, 3) and surf["normals"].shape == (n, 3) and surf["areas"].shape == (n,)
    assert surf["wallShearStressMeanTrim"].shape == (n, 3) and surf["pMeanTrim"].shape == (n,)
    assert set(vol) == {"pos", "UMeanTrim", "pMeanTrim", "nutMeanTrim"}
    m = vol["pos"].shape[0]
    assert vol["UMeanTrim"].shape == (m, 3) and vol["nutMeanTrim"].shape == (m,)
    assert all(t.dtype == torch.float32 for t in (*surf.values(), *vol.values()))
    assert s["forces"]["Cd"] > 0 and "length" in s["geo_parameters"]
    assert ds[-1]["run"] == 3


def test_round_trip_against_pyvista(tiny_root: Path) -> None:
    s = DrivaerML(tiny_root)[0]["surface"]
    mesh = pv.read(tiny_root / "run_1" / "boundary_1.vtp")
    np.testing.assert_allclose(s["pos"].numpy(), mesh.cell_centers().points, rtol=0, atol=1e-5)
    sizes = mesh.compute_cell_sizes(length=False, volume=False)
    np.testing.assert_allclose(s["areas"].numpy(), sizes.cell_data["Area"], rtol=1e-4)
    normals = mesh.compute_normals(cell_normals=True, point_normals=False, auto_orient_normals=False)
    np.testing.assert_allclose(s["normals"].numpy(), normals.cell_data["Normals"], atol=1e-4)
    np.testing.assert_array_equal(s["pMeanTrim"].numpy(), mesh.cell_data["pMeanTrim"])
    np.testing.assert_array_equal(s["wallShearStressMeanTrim"].numpy(), mesh.cell_data["wallShearStressMeanTrim"])
    # Outward normals: the divergence theorem gives the enclosed volume (positive).
    assert (s["pos"] * s["normals"]).sum(dim=1).mul(s["areas"]).sum() / 3 > 0


def test_volume_parts_are_concatenated(tiny_root: Path, tiny_split_root: Path) -> None:
    whole = DrivaerML(tiny_root, runs=[1], surface=False, volume=True)[0]["volume"]
    split = DrivaerML(tiny_split_root, surface=False, volume=True)[0]["volume"]
    for key in whole:
        assert torch.equal(whole[key], split[key])
    grid = pv.read(tiny_root / "run_1" / "volume_1.vtu")
    np.testing.assert_allclose(whole["pos"].numpy(), grid.cell_centers().points, atol=1e-5)


def test_hand_made_polygons(tmp_path: Path) -> None:
    # A unit square (quad) in z=0 and a right triangle in x=0: exact centres, normals, areas.
    points = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 1]], dtype=np.float32)
    faces = np.array([4, 0, 1, 2, 3, 3, 0, 3, 4])
    mesh = pv.PolyData(points, faces)
    mesh.cell_data["pMeanTrim"] = np.array([1.0, 2.0], dtype=np.float32)
    run = tmp_path / "run_7"
    run.mkdir()
    mesh.save(run / "boundary_7.vtp")
    s = DrivaerML(tmp_path, fields=["pMeanTrim"])[0]
    assert s["run"] == 7 and set(s) == {"run", "surface"}
    surf = s["surface"]
    torch.testing.assert_close(surf["pos"], torch.tensor([[0.5, 0.5, 0.0], [0.0, 1 / 3, 1 / 3]]))
    torch.testing.assert_close(surf["normals"], torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]))
    torch.testing.assert_close(surf["areas"], torch.tensor([1.0, 0.5]))
    torch.testing.assert_close(surf["pMeanTrim"], torch.tensor([1.0, 2.0]))


def test_selection_of_runs_and_fields(tiny_root: Path) -> None:
    ds = DrivaerML(tiny_root, runs=[3, 1], fields={"surface": ["CpMeanTrim"], "volume": ["UMeanTrim"]}, volume=True)
    assert ds.runs == [3, 1]
    s = ds[0]
    assert s["run"] == 3
    assert set(s["surface"]) == {"pos", "normals", "areas", "CpMeanTrim"}
    assert set(s["volume"]) == {"pos", "UMeanTrim"}
    only = DrivaerML(tiny_root, fields=["pMeanTrim"], surface=True, volume=True)[0]
    assert set(only["surface"]) - {"pos", "normals", "areas"} == {"pMeanTrim"}
    assert set(only["volume"]) == {"pos", "pMeanTrim"}
    assert "tiny" not in repr(ds) or "runs=2" in repr(ds)


@pytest.fixture
def broken_root(tiny_root: Path, tmp_path: Path) -> Path:
    shutil.copytree(tiny_root / "run_1", tmp_path / "run_1")
    return tmp_path


def test_missing_things(broken_root: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        DrivaerML(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=r"for run\(s\) \[2, 5\]"):
        DrivaerML(broken_root, runs=[1, 2, 5])
    with pytest.raises(FileNotFoundError, match="no run_<i> folders"):
        DrivaerML(broken_root / "run_1")
    (broken_root / "run_1" / "volume_1.vtu").unlink()
    with pytest.raises(FileNotFoundError, match=r"volume_1\.vtu: file not found \(and no volume_1\.vtu\.NN\.part"):
        DrivaerML(broken_root, surface=False, volume=True)[0]
    (broken_root / "run_1" / "boundary_1.vtp").unlink()
    with pytest.raises(FileNotFoundError, match=r"run_1/boundary_1\.vtp: file not found"):
        DrivaerML(broken_root)[0]
    with pytest.raises(IndexError, match="index 1 out of range for 1 runs"):
        DrivaerML(broken_root, surface=False, volume=True)[1]
    with pytest.raises(TypeError, match=r"index must be an int \(got str\)"):
        DrivaerML(broken_root)["a"]
    with pytest.raises(ValueError, match="at least one of surface, volume"):
        DrivaerML(broken_root, surface=False)


def test_missing_field_names_file_and_field(tiny_root: Path) -> None:
    with pytest.raises(DatasetError, match=r"boundary_1\.vtp: cell field 'UMeanTrim' not found; available"):
        DrivaerML(tiny_root, fields=["UMeanTrim"])[0]
    with pytest.raises(TypeError, match="fields must be a sequence"):
        DrivaerML(tiny_root, fields="pMeanTrim")
    with pytest.raises(ValueError, match=r"fields keys must be 'surface' or 'volume' \(got \['boundary'\]\)"):
        DrivaerML(tiny_root, fields={"boundary": ["pMeanTrim"]})


def test_bad_csv(broken_root: Path) -> None:
    path = broken_root / "run_1" / "force_mom_1.csv"
    path.write_text("Cd,Cl\n0.3\n")
    with pytest.raises(DatasetError, match=r"force_mom_1\.csv: 2 column names but 1 values"):
        DrivaerML(broken_root).forces(1)
    path.write_text("Cd,Cl\n")
    with pytest.raises(DatasetError, match="expected a header row and a value row"):
        DrivaerML(broken_root)[0]
