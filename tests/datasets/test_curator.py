"""PhysicsNeMo-Curator outputs (Zarr and NumPy) as a preprocessing source, against the raw-VTK path."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from meshshard.datasets import DatasetError, DrivaerML, DrivaerMLDataset, load_meta, preprocess
from meshshard.datasets._curator import CuratorDrivaerML, CuratorRun, rank_rows
from meshshard.testing import run_distributed
from meshshard.testing.curator import volume_shuffle, write_curator_runs

FORMATS = ("zarr", "npz")
# float32 curator values times rho U^2 (float64), rounded back to float32: a few ulps
RTOL, ATOL = 1e-6, 1e-9


@pytest.fixture(scope="module")
def curator_roots(tiny_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``tiny_root`` through the curator schema, both formats; small chunks so reads span several."""
    roots = {}
    for fmt in FORMATS:
        roots[fmt] = tmp_path_factory.mktemp(f"curator_{fmt}")
        write_curator_runs(tiny_root, roots[fmt], fmt=fmt, chunk_mb=0.01, chunks_per_shard=4)
    return roots


@pytest.fixture(scope="module")
def curator_stores(curator_roots: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each curator root preprocessed like ``tiny_store`` (P in 1..4, surface and volume)."""
    stores = {}
    for fmt, root in curator_roots.items():
        stores[fmt] = tmp_path_factory.mktemp(f"store_{fmt}")
        report = preprocess(
            root,
            stores[fmt],
            parts=(1, 2, 3, 4),
            volume=True,
            workers=1,
            sdf_backend="igl",
            progress=False,
            source="physicsnemo-curator",
        )
        assert report.ok and report.processed == [1, 2, 3]
    return stores


def _close(a: np.ndarray, b: np.ndarray, name: str) -> None:
    scale = float(np.abs(b).max(initial=0.0))
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL + 1e-6 * scale, err_msg=name)


@pytest.mark.parametrize("fmt", FORMATS)
def test_reader_restores_units_and_names(tiny_root: Path, curator_roots: dict[str, Path], fmt: str) -> None:
    raw = DrivaerML(tiny_root, volume=True)
    cur = CuratorDrivaerML(curator_roots[fmt], volume=True)
    assert cur.format == fmt and cur.runs == [1, 2, 3]
    assert cur.surface_fields == ("pMeanTrim", "wallShearStressMeanTrim")
    assert cur.volume_fields == ("UMeanTrim", "pMeanTrim", "nutMeanTrim")
    for run in cur.runs:
        s, rs = cur.read_surface(run), raw.read_surface(run)
        assert set(s) == {"pos", "normals", "areas", "pMeanTrim", "wallShearStressMeanTrim"}
        for name in ("pos", "areas"):
            np.testing.assert_array_equal(s[name], rs[name].astype(np.float32))
        np.testing.assert_allclose(s["normals"], rs["normals"], atol=1e-6)
        for name in cur.surface_fields:
            assert s[name].shape == rs[name].shape
            _close(s[name], rs[name].astype(np.float32), name)
        v, rv = cur.read_volume(run), raw.read_volume(run)
        shuffle = volume_shuffle(len(rv["pos"]))
        np.testing.assert_array_equal(v["pos"], rv["pos"].astype(np.float32)[shuffle])
        for name in cur.volume_fields:
            _close(v[name], rv[name].astype(np.float32)[shuffle], name)


@pytest.mark.parametrize("fmt", FORMATS)
def test_row_ranges_read_only_their_rows(curator_roots: dict[str, Path], fmt: str) -> None:
    cur = CuratorDrivaerML(curator_roots[fmt], volume=True)
    whole = cur.read_volume(2)
    n = len(whole["pos"])
    for num_ranks in (1, 2, 3, 7):
        ranges = [cur.rank_rows(2, "volume", r, num_ranks) for r in range(num_ranks)]
        assert ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # contiguous, disjoint, covering
        align = CuratorRun(cur.open(2).path).chunk_rows("volume_mesh_centers")
        assert all(start % align == 0 or start == n for start, _ in ranges)
        for start, stop in ranges:
            part = cur.read_volume(2, rows=(start, stop))
            for name, values in whole.items():
                np.testing.assert_array_equal(part[name], values[start:stop])


def test_npz_rows_are_one_pread_of_their_bytes(curator_roots: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from meshshard.datasets import _store

    reads: list[int] = []
    real = _store._pread
    monkeypatch.setattr(
        _store, "_pread", lambda fd, buffer, offset: reads.append(len(buffer)) or real(fd, buffer, offset)
    )
    f = CuratorRun(curator_roots["npz"] / "run_1.npz")
    rows = f.read("volume_fields", 10, 30)
    assert rows.shape == (20, 5) and reads == [20 * 5 * 4]
    with np.load(f.path) as npz:
        np.testing.assert_array_equal(rows, npz["volume_fields"][10:30])


def test_rank_rows_split() -> None:
    assert [rank_rows(10, 3, r, 3) for r in range(3)] == [(0, 6), (6, 9), (9, 10)]
    assert [rank_rows(4, 1, r, 6) for r in range(6)] == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 4), (4, 4)]
    assert rank_rows(0, 5, 0, 2) == (0, 0)
    with pytest.raises(ValueError, match="need align >= 1"):
        rank_rows(10, 0, 0, 1)


def _shards(stores: list[str], kind: str) -> list[list[dict[str, Any]]]:
    from meshshard.device_mesh import init_mesh

    mesh = init_mesh()
    out = []
    for store in stores:
        ds = DrivaerMLDataset(store, split="all", kind=kind, mesh=mesh, return_index=True)
        out.append(
            [
                {k: v.to_local().numpy() for k, v in ds[i].items() if k != "run"} | {"sizes": ds.sizes(i)}
                for i in range(len(ds))
            ]
        )
    return out


def _by_raw_id(sample: dict[str, np.ndarray], ids: np.ndarray) -> dict[str, np.ndarray]:
    order = np.argsort(ids, kind="stable")
    return {k: v[order] for k, v in sample.items() if k not in ("index", "sizes")} | {"id": ids[order]}


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("kind", ["surface", "volume"])
def test_dataset_matches_raw_vtk_path(
    tiny_store: Path, curator_stores: dict[str, Path], tiny_root: Path, world: int, kind: str
) -> None:
    stores = [str(tiny_store), *(str(curator_stores[fmt]) for fmt in FORMATS)]
    if world == 1:
        per_rank = [
            [
                [
                    {k: v.numpy() for k, v in s.items() if k != "run"} | {"sizes": ds.sizes(i)}
                    for i, s in enumerate(ds[i] for i in range(len(ds)))
                ]
                for ds in (DrivaerMLDataset(st, split="all", kind=kind, mesh=None, return_index=True) for st in stores)
            ]
        ]
    else:
        per_rank = run_distributed(_shards, world, stores, kind, timeout=240)
    raw = DrivaerML(tiny_root, volume=True)
    for rank, (reference, *curated) in enumerate(per_rank):
        for i, ref in enumerate(reference):
            ref_sorted = _by_raw_id(ref, ref["index"])
            for sample in curated:
                assert sample[i]["sizes"] == ref["sizes"]  # the same partition of the same points
                ids = sample[i]["index"]
                if kind == "volume":  # the curator shuffled the volume rows: back to VTK cell ids
                    ids = volume_shuffle(len(raw.read_volume(raw.runs[i])["pos"]))[ids]
                else:
                    np.testing.assert_array_equal(ids, ref["index"])  # same order, not just the same set
                got = _by_raw_id(sample[i], ids)
                np.testing.assert_array_equal(got["id"], ref_sorted["id"], err_msg=f"rank {rank}")
                np.testing.assert_array_equal(got["pos"], ref_sorted["pos"])
                names = {"pMeanTrim", "wallShearStressMeanTrim"} if kind == "surface" else {
                    "UMeanTrim", "pMeanTrim", "nutMeanTrim", "sdf"}  # fmt: skip
                assert names <= set(got)
                for name in names:
                    _close(got[name], ref_sorted[name], name)
                if kind == "surface":
                    np.testing.assert_array_equal(got["areas"], ref_sorted["areas"])
                    np.testing.assert_allclose(got["normals"], ref_sorted["normals"], atol=1e-6)


def test_store_records_source_and_units(curator_stores: dict[str, Path]) -> None:
    meta = load_meta(curator_stores["zarr"])
    assert meta["config"]["source"] == "physicsnemo-curator"
    assert meta["fields"]["surface"]["pMeanTrim"]["units"] == "Pa"
    assert set(meta["fields"]["volume"]) == {"pos", "sdf", "UMeanTrim", "pMeanTrim", "nutMeanTrim"}
    assert "CpMeanTrim" not in meta["fields"]["surface"]


def test_rerun_skips_and_metadata_version_1_0(tiny_root: Path, curator_stores: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "old"
    write_curator_runs(tiny_root, root, fmt="zarr", runs=[1], volume=False, metadata_version="1.0")
    assert "physics_constants" not in dict(zarr.open_group(root / "run_1.zarr", mode="r").attrs)
    first = preprocess(root, tmp_path / "s", parts=(1, 2), workers=1, progress=False, source="physicsnemo-curator")
    again = preprocess(root, tmp_path / "s", parts=(1, 2), workers=1, progress=False, source="physicsnemo-curator")
    assert first.processed == [1] and again.skipped == [1] and again.processed == []
    ref = DrivaerMLDataset(curator_stores["zarr"], split="all", mesh=None, return_index=True)[0]
    got = DrivaerMLDataset(tmp_path / "s", split="all", mesh=None, return_index=True)[0]
    ref_order, got_order = np.argsort(ref["index"].numpy()), np.argsort(got["index"].numpy())  # stores' P differ
    for name in ("pos", "pMeanTrim", "wallShearStressMeanTrim"):
        np.testing.assert_array_equal(got[name].numpy()[got_order], ref[name].numpy()[ref_order])


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_missing_array_names_run_and_array(curator_roots: dict[str, Path], tmp_path: Path) -> None:
    root = _copy(curator_roots["zarr"], tmp_path / "z")
    shutil.rmtree(root / "run_2.zarr" / "surface_normals")
    with pytest.raises(DatasetError, match=r"^run_2\.zarr: array 'surface_normals' missing \(has \[") as err:
        preprocess(root, tmp_path / "s", workers=1, progress=False, source="physicsnemo-curator")
    assert "\n" not in str(err.value) and not (tmp_path / "s").exists()  # checked before anything is written

    root = tmp_path / "n"
    root.mkdir()
    with np.load(curator_roots["npz"] / "run_1.npz") as npz:
        arrays = {k: npz[k] for k in npz.files if k != "volume_fields"}
    np.savez(root / "run_1.npz", **arrays)
    CuratorDrivaerML(root)  # the surface alone does not need it
    with pytest.raises(DatasetError, match=r"^run_1\.npz: array 'volume_fields' missing"):
        CuratorDrivaerML(root, volume=True)


def test_field_count_mismatch_names_run_and_array(curator_roots: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(
        DatasetError,
        match=r"^run_1\.zarr: array 'surface_fields' has 4 columns, the variable config "
        r"\(pMeanTrim:1, CpMeanTrim:1, wallShearStressMeanTrim:3\) needs 5; pass fields=",
    ):
        CuratorDrivaerML(
            curator_roots["zarr"], fields={"surface": ["pMeanTrim", "CpMeanTrim", "wallShearStressMeanTrim"]}
        )
    with pytest.raises(DatasetError, match=r"^run_1\.npz: array 'volume_fields' has 5 columns, .* needs 4"):
        CuratorDrivaerML(curator_roots["npz"], volume=True, fields={"volume": {"UMeanTrim": "vector", "p": "scalar"}})
    with pytest.raises(ValueError, match="variable 'x' must be 'scalar' or 'vector'"):
        CuratorDrivaerML(curator_roots["npz"], fields={"surface": {"x": "tensor"}})


def test_other_variable_configs(tiny_root: Path, tmp_path: Path) -> None:
    variables = {"surface": {"CpMeanTrim": "scalar", "pMeanTrim": "scalar"}, "volume": {"UMeanTrim": "vector"}}
    write_curator_runs(tiny_root, tmp_path / "c", fmt="npz", runs=[3], variables=variables)
    cur = CuratorDrivaerML(tmp_path / "c", fields=variables, volume=True)
    assert cur.variables == variables
    raw = DrivaerML(tiny_root, runs=[3], volume=True)
    s, rs = cur.read_surface(3), raw.read_surface(3)
    for name in ("CpMeanTrim", "pMeanTrim"):  # every surface column was divided by rho U^2
        _close(s[name], rs[name].astype(np.float32), name)
    v = cur.read_volume(3)
    rv = raw.read_volume(3)
    _close(v["UMeanTrim"], rv["UMeanTrim"].astype(np.float32)[volume_shuffle(len(rv["pos"]))], "UMeanTrim")


def test_mixed_formats(curator_roots: dict[str, Path], tmp_path: Path) -> None:
    root = _copy(curator_roots["zarr"], tmp_path / "m")
    shutil.rmtree(root / "run_3.zarr")
    shutil.copy(curator_roots["npz"] / "run_3.npz", root)
    with pytest.raises(DatasetError, match=r"mixed formats, run_1\.zarr and run_3\.npz; give a folder of one format"):
        CuratorDrivaerML(root)
    shutil.copy(curator_roots["npz"] / "run_1.npz", root)
    with pytest.raises(DatasetError, match=r"^run_1: both run_1\.zarr and run_1\.npz in "):
        CuratorDrivaerML(root)


def test_bad_metadata_and_files(curator_roots: dict[str, Path], tiny_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "n"
    root.mkdir()
    with np.load(curator_roots["npz"] / "run_1.npz") as npz:
        arrays = {k: npz[k] for k in npz.files if k != "stream_velocity"}
    np.savez(root / "run_1.npz", **arrays)
    with pytest.raises(DatasetError, match=r"^run_1\.npz: metadata 'stream_velocity' missing"):
        CuratorDrivaerML(root)
    (root / "run_1.npz").write_bytes(b"not a zip")
    with pytest.raises(DatasetError, match=r"run_1\.npz: not a readable \.npz file"):
        CuratorDrivaerML(root)
    with pytest.raises(FileNotFoundError, match=r"holds raw run_<i>/ folders: use source='drivaerml'"):
        CuratorDrivaerML(tiny_root)
    with pytest.raises(ValueError, match=r"source must be one of \('drivaerml', 'physicsnemo-curator'\)"):
        preprocess(tiny_root, tmp_path / "s", source="curator", progress=False)


def test_a_body_of_zero_length_is_refused_not_used_as_a_zero_scale(
    curator_roots: dict[str, Path], tmp_path: Path
) -> None:
    # the body's length scales the volume's turbulent viscosity: a flat-zero scale would be a silent wrong answer
    root = tmp_path / "z"
    root.mkdir()
    with np.load(curator_roots["npz"] / "run_1.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["stl_coordinates"] = np.zeros_like(arrays["stl_coordinates"])
    np.savez(root / "run_1.npz", **arrays)
    with pytest.raises(DatasetError, match=(
        r"^run_1\.npz: the body's length \(largest extent of 'stl_coordinates'\) must be positive and finite "
        r"\(got 0\.0\)$"
    )):
        CuratorDrivaerML(root, volume=True).read_volume(1, rows=(0, 5))


def test_compressed_npz_still_reads(curator_roots: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "c"
    root.mkdir()
    with np.load(curator_roots["npz"] / "run_2.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    np.savez_compressed(root / "run_2.npz", **arrays)
    with zipfile.ZipFile(root / "run_2.npz") as zf:
        assert zf.getinfo("surface_fields.npy").compress_type == zipfile.ZIP_DEFLATED
    got = CuratorDrivaerML(root).read_surface(2, rows=(5, 50))
    ref = CuratorDrivaerML(curator_roots["npz"]).read_surface(2, rows=(5, 50))
    for name, values in ref.items():
        np.testing.assert_array_equal(got[name], values)


def test_workers_give_the_same_store(curator_roots: dict[str, Path], tmp_path: Path) -> None:
    """Spawned workers re-open the curator folder with the same variable config."""
    stores = []
    for workers in (1, 2):
        stores.append(tmp_path / f"w{workers}")
        report = preprocess(
            curator_roots["npz"],
            stores[-1],
            parts=(1, 2),
            workers=workers,
            progress=False,
            source="physicsnemo-curator",
        )
        assert report.ok and report.processed == [1, 2, 3]
    files = sorted(p.relative_to(stores[0]) for p in stores[0].rglob("*.npy"))
    assert files and files == sorted(p.relative_to(stores[1]) for p in stores[1].rglob("*.npy"))
    for rel in files:
        assert (stores[0] / rel).read_bytes() == (stores[1] / rel).read_bytes()


def _read_sharded(root: str, kind: str) -> dict[str, Any]:
    from meshshard.comm import CommCounter
    from meshshard.datasets import _store
    from meshshard.device_mesh import init_mesh

    mesh = init_mesh()
    reader = CuratorDrivaerML(root, volume=True)
    read_bytes: list[int] = []
    real = _store._pread
    _store._pread = lambda fd, buffer, offset: read_bytes.append(len(buffer)) or real(fd, buffer, offset)
    try:
        with CommCounter() as cc:
            shards = reader.read_sharded(2, kind, mesh, sdf_backend="igl" if kind == "volume" else None)
    finally:
        _store._pread = real
    return {
        "collectives": cc.total,
        "sizes": list(shards["pos"].sharding_sizes),
        "local": {k: v.to_local().numpy() for k, v in shards.items()},
        "read_bytes": sum(read_bytes),
        "full_pos": shards["pos"].full_tensor().numpy(),
    }


@pytest.mark.parametrize(("world", "fmt", "kind"), [(2, "npz", "volume"), (3, "zarr", "volume"), (3, "npz", "surface")])
def test_read_sharded_reads_only_the_ranks_chunks(
    curator_roots: dict[str, Path], world: int, fmt: str, kind: str
) -> None:
    results = run_distributed(_read_sharded, world, str(curator_roots[fmt]), kind, timeout=240)
    reader = CuratorDrivaerML(curator_roots[fmt], volume=True)
    whole = reader.read_volume(2) if kind == "volume" else reader.read_surface(2)
    n = len(whole["pos"])
    for rank, res in enumerate(results):
        start, stop = reader.rank_rows(2, kind, rank, world)
        sizes = [b - a for a, b in (reader.rank_rows(2, kind, r, world) for r in range(world))]
        assert res["collectives"] == 0 and res["sizes"] == sizes
        assert 0 < stop - start < n  # nobody reads the whole array
        for name, values in whole.items():
            np.testing.assert_array_equal(res["local"][name], values[start:stop].astype(np.float32), err_msg=name)
        if kind == "volume":
            np.testing.assert_allclose(res["local"]["sdf"], reader.sdf(2, whole["pos"][start:stop]), atol=1e-6)
        if fmt == "npz":  # this rank's rows of the point arrays, and when sdf is asked the (small) STL
            row_bytes = sum(v[:1].astype(np.float32).nbytes for v in whole.values())
            stl = CuratorRun(reader.open(2).path)
            stl_bytes = 4 * (3 * stl.shape("stl_coordinates")[0] + stl.shape("stl_faces")[0])
            extra = 0 if kind == "surface" else 3 * stl_bytes
            assert (stop - start) * row_bytes <= res["read_bytes"] <= (stop - start) * row_bytes + extra
        np.testing.assert_array_equal(res["full_pos"], whole["pos"].astype(np.float32))


class _CreatesAFile:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_an_npz_member_of_python_objects_is_refused_and_never_unpickled(tmp_path, save):
    marker = tmp_path / "PWNED"
    path = tmp_path / "run_1.npz"
    save(path, surface_mesh_centers=np.array([_CreatesAFile(marker)], dtype=object), air_density=np.array(1.2))
    run = CuratorRun(path)
    with pytest.raises(DatasetError, match=r"run_1.npz: array 'surface_mesh_centers' .*(Python objects|as numbers)"):
        run.read("surface_mesh_centers")
    with pytest.raises(DatasetError, match="surface_mesh_centers"):
        run.shape("surface_mesh_centers")
    assert run.constant("air_density") == pytest.approx(1.2)
    assert not marker.exists()
