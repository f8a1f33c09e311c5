from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import trimesh

from meshshard.datasets import DrivaerML, load_meta, preprocess
from meshshard.datasets import _preprocess as preprocess_module
from meshshard.datasets._store import FieldStats

SURFACE_ARRAYS = {"pos", "normals", "areas", "pMeanTrim", "CpMeanTrim", "wallShearStressMeanTrim"}


def _files(store: Path) -> dict[str, bytes]:
    return {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.rglob("*.npy"))}


def test_meta(tiny_store: Path) -> None:
    meta = load_meta(tiny_store)
    assert meta["parts"] == [1, 2, 3, 4] and meta["kinds"] == ["surface", "volume"]
    assert meta["orders"] == {"p4": [1, 2, 4], "p3": [1, 3]}
    assert meta["order_of"] == {"1": "p4", "2": "p4", "3": "p3", "4": "p4"}
    assert set(meta["fields"]["surface"]) == SURFACE_ARRAYS
    assert set(meta["fields"]["volume"]) == {"pos", "sdf", "UMeanTrim", "pMeanTrim", "nutMeanTrim"}
    assert meta["fields"]["surface"]["wallShearStressMeanTrim"] == {
        "shape": [3],
        "dtype": "float32",
        "units": "Pa",
    }
    assert meta["fields"]["volume"]["nutMeanTrim"]["units"] == "m^2/s"
    splits = meta["splits"]
    assert sorted(splits["train"] + splits["val"] + splits["test"]) == [1, 2, 3]
    assert meta["failed"] == {}
    for run in ("1", "2", "3"):
        for kind in ("surface", "volume"):
            info = meta["runs"][run][kind]
            for p in ("1", "2", "3", "4"):
                assert len(info["sizes"][p]) == int(p) and sum(info["sizes"][p]) == info["num_points"]
                assert max(info["sizes"][p]) - min(info["sizes"][p]) <= 1  # balanced


def test_arrays_are_the_source_in_partition_order(tiny_root: Path, tiny_store: Path) -> None:
    source = DrivaerML(tiny_root, volume=True)
    for order in ("p4", "p3"):
        folder = tiny_store / "runs" / "run_2" / "surface" / order
        perm = np.load(folder / "perm.npy")
        raw = source.read_surface(2)
        assert sorted(perm.tolist()) == list(range(len(raw["pos"])))
        for name in SURFACE_ARRAYS:
            stored = np.load(folder / f"{name}.npy")
            assert stored.dtype == np.float32
            np.testing.assert_array_equal(stored, raw[name].astype(np.float32)[perm])
    vol = tiny_store / "runs" / "run_1" / "volume" / "p4"
    sdf = np.load(vol / "sdf.npy")
    assert sdf.shape == (np.load(vol / "perm.npy").shape[0],)
    assert (sdf > -0.05).all() and np.median(sdf) > 0  # cell centres lie outside the body


def test_sdf_matches_a_direct_computation(tiny_root: Path, tiny_store: Path) -> None:
    folder = tiny_store / "runs" / "run_1" / "volume" / "p4"
    pos = np.load(folder / "pos.npy")[:200].astype(np.float64)
    body = trimesh.load(tiny_root / "run_1" / "drivaer_1.stl")
    closest, dist, _ = trimesh.proximity.closest_point(body, pos)
    inside = body.contains(pos)
    np.testing.assert_allclose(np.load(folder / "sdf.npy")[:200], np.where(inside, -dist, dist), atol=1e-5)


def test_parts_are_spatial(tiny_store: Path) -> None:
    meta = load_meta(tiny_store)
    folder = tiny_store / "runs" / "run_1" / "surface" / "p4"
    pos = torch.from_numpy(np.load(folder / "pos.npy"))
    sizes = meta["runs"]["1"]["surface"]["sizes"]["2"]
    left, right = pos[: sizes[0]], pos[sizes[0] :]
    axis = int(torch.argmax(pos.max(0).values - pos.min(0).values))  # RCB cuts the longest extent
    assert left[:, axis].max() <= right[:, axis].min()


def test_statistics_equal_single_pass_over_train_runs(tiny_root: Path, tiny_store: Path) -> None:
    meta = load_meta(tiny_store)
    train = meta["splits"]["train"]
    source = DrivaerML(tiny_root)
    for name in SURFACE_ARRAYS:
        values = np.concatenate([source.read_surface(r)[name].astype(np.float32) for r in train])
        values = values.astype(np.float64).reshape(len(values), -1)
        stats = meta["stats"]["surface"][name]
        assert stats["count"] == len(values)
        np.testing.assert_allclose(stats["mean"], values.mean(axis=0), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(stats["std"], values.std(axis=0), rtol=1e-10)


def test_deterministic_and_worker_count_invariant(tiny_root: Path, tmp_path: Path) -> None:
    kwargs = {"parts": (1, 2), "runs": [1, 2], "splits": (0.5, 0.5, 0.0), "progress": False}
    one = preprocess(tiny_root, tmp_path / "one", workers=1, **kwargs)
    two = preprocess(tiny_root, tmp_path / "two", workers=2, **kwargs)
    assert one.processed == two.processed == [1, 2] and one.cells == two.cells
    assert _files(tmp_path / "one") == _files(tmp_path / "two")
    meta_one, meta_two = load_meta(tmp_path / "one"), load_meta(tmp_path / "two")
    assert meta_one["stats"] == meta_two["stats"]  # bit for bit
    assert meta_one["runs"] == meta_two["runs"]


def test_resume_skips_finished_runs(tiny_root: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    kwargs = {"parts": (2,), "workers": 1, "progress": False}
    first = preprocess(tiny_root, store, **kwargs)
    assert first.processed == [1, 2, 3]
    meta = (store / "meta.json").read_text()
    shutil.rmtree(store / "runs" / "run_2")
    (store / "runs" / ".tmp-run_3-dead").mkdir()  # left behind by a killed job
    again = preprocess(tiny_root, store, **kwargs)
    assert again.processed == [2] and again.skipped == [1, 3]
    assert (store / "meta.json").read_text() == meta
    assert not list((store / "runs").glob(".tmp-*"))
    changed = preprocess(tiny_root, store, parts=(2, 4), workers=1, progress=False)
    assert changed.processed == [1, 2, 3]  # a new configuration redoes every run


def test_failure_is_reported_and_atomic(tiny_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    preprocess(tiny_root, store, parts=(2,), workers=1, progress=False)
    old = (store / "runs" / "run_2" / "run.json").read_text()

    real_save = np.save

    def failing_save(path: Path, values: np.ndarray) -> None:
        if "run_2" in str(path) and str(path).endswith("areas.npy"):
            raise OSError("disk full")
        real_save(path, values)

    monkeypatch.setattr(preprocess_module.np, "save", failing_save)
    with pytest.warns(UserWarning, match=r"1 run\(s\) failed .*run 2: OSError: disk full"):
        report = preprocess(tiny_root, store, parts=(2, 4), workers=1, progress=False)
    assert report.processed == [1, 3] and list(report.failed) == [2] and not report.ok
    # The old run_2 survives untouched (the new one never replaced it); no temporary folder is left.
    assert (store / "runs" / "run_2" / "run.json").read_text() == old
    assert not list((store / "runs").glob(".tmp-*"))
    meta = load_meta(store)
    assert "2" not in meta["runs"] and meta["failed"] == {"2": "OSError: disk full"}
    assert 2 not in sum(meta["splits"].values(), [])


def test_corrupt_run_names_file(tiny_root: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(tiny_root, data)
    path = data / "run_3" / "boundary_3.vtp"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.warns(UserWarning, match="run 3: DatasetError: .*boundary_3.vtp: could not be read"):
        report = preprocess(data, tmp_path / "store", parts=(2,), workers=1, progress=False)
    assert report.processed == [1, 2]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"parts": (0, 2)}, ValueError, r"parts must be positive \(got \(0, 2\)\)"),
        ({"parts": ()}, TypeError, "parts must be a non-empty sequence of ints"),
        (
            {"method": "metis"},
            ValueError,
            r"method must be one of \('rcb', 'morton', 'hilbert'\) \(got 'metis'\)",
        ),
        ({"workers": 0}, ValueError, r"workers must be at least 1 \(got 0\)"),
        ({"surface": False}, ValueError, "at least one of surface, volume"),
        ({"splits": (0.9, 0.2, 0.0)}, ValueError, "splits must be non-negative and sum to 1"),
        ({"volume": True, "sdf_backend": "trimesh"}, ValueError, "sdf_backend must be one of"),
    ],
)
def test_bad_arguments(tiny_root: Path, tmp_path: Path, kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        preprocess(tiny_root, tmp_path / "store", **{"progress": False, **kwargs})


def test_load_meta_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="meta.json not found"):
        load_meta(tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="is not a meshshard.DrivaerMLStore/1 store"):
        load_meta(tmp_path)


def test_stats_json_round_trip(tiny_store: Path) -> None:
    info = json.loads((tiny_store / "runs" / "run_1" / "run.json").read_text())
    stats = FieldStats.from_json(info["kinds"]["surface"]["stats"]["pos"])
    pos = np.load(tiny_store / "runs" / "run_1" / "surface" / "p4" / "pos.npy").astype(np.float64)
    np.testing.assert_allclose(stats.mean, pos.mean(axis=0), rtol=1e-12)


ESCAPES = {
    "order_of": lambda m: {**m, "order_of": {"1": "../../outside"}},
    "kinds": lambda m: {**m, "kinds": ["/etc"]},
    "fields": lambda m: {**m, "fields": {**m["fields"], "surface": {"../x": {}}}},
    "splits": lambda m: {**m, "splits": {**m["splits"], "train": ["1/../../x"]}},
}


@pytest.mark.parametrize("entry", sorted(ESCAPES))
def test_store_metadata_cannot_name_files_outside_the_store(tiny_store, tmp_path, entry):
    meta = load_meta(tiny_store)  # a real store passes
    (tmp_path / "meta.json").write_text(json.dumps(ESCAPES[entry](meta)))
    with pytest.raises(ValueError, match=rf"meta.json: {entry}.* is not a plain file name .*cannot point outside"):
        load_meta(tmp_path)
