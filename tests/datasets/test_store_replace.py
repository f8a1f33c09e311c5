"""Run-folder replacement: a crash at any point leaves a readable run (the old or the new one)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from meshshard.datasets import _store


class _Crash(BaseException):
    pass


def _run(path: Path, version: int) -> Path:
    path.mkdir()
    (path / "run.json").write_text(json.dumps({"v": version}))
    return path


def _version(path: Path) -> int:
    return json.loads((path / "run.json").read_text())["v"]


def test_replace_dir_swaps_in_the_new_run_and_leaves_no_backup(tmp_path):
    final = _run(tmp_path / "run_1", 1)
    _store.replace_dir(_run(tmp_path / ".tmp-run_1", 2), final)
    assert _version(final) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run_1"]


def test_replace_dir_into_a_missing_folder(tmp_path):
    _store.replace_dir(_run(tmp_path / ".tmp-run_1", 2), tmp_path / "run_1")
    assert _version(tmp_path / "run_1") == 2


def test_failed_second_rename_puts_the_old_run_back(tmp_path, monkeypatch):
    final, new = _run(tmp_path / "run_1", 1), _run(tmp_path / ".tmp-run_1", 2)
    real_rename = os.rename

    def fail_tmp_rename(src, dst):
        if Path(src) == new:
            raise _Crash
        real_rename(src, dst)

    monkeypatch.setattr(_store.os, "rename", fail_tmp_rename)
    with pytest.raises(_Crash):
        _store.replace_dir(new, final)
    assert _version(final) == 1 and not (tmp_path / ".old-run_1").exists()


def test_a_killed_process_between_the_renames_is_recovered(tmp_path):
    # what a SIGKILL between the two renames leaves: only the backup (no rollback ran)
    backup = _run(tmp_path / ".old-run_1", 1)
    final = tmp_path / "run_1"
    assert _store.live_dir(final) == backup  # readers still find the previous version
    _store.recover_dir(final)
    assert _version(final) == 1 and not backup.exists()
    assert _store.live_dir(final) == final


def test_a_stale_backup_next_to_a_live_run_is_dropped(tmp_path):
    # a kill after the second rename but before the backup was deleted
    final, _ = _run(tmp_path / "run_1", 2), _run(tmp_path / ".old-run_1", 1)
    _store.recover_dir(final)
    assert _version(final) == 2
    _store.replace_dir(_run(tmp_path / ".tmp-run_1", 3), final)
    assert _version(final) == 3 and sorted(p.name for p in tmp_path.iterdir()) == ["run_1"]


def test_a_store_whose_run_was_left_as_a_backup_stays_readable_and_preprocess_restores_it(
    tiny_root, tiny_store, tmp_path
):
    import shutil

    import torch

    from meshshard.datasets import DrivaerMLDataset, preprocess

    store = tmp_path / "store"
    shutil.copytree(tiny_store, store)
    expected = DrivaerMLDataset(store, split="all", mesh=None)[0]
    os.rename(store / "runs" / "run_1", store / "runs" / ".old-run_1")  # killed between the renames
    got = DrivaerMLDataset(store, split="all", mesh=None)[0]
    assert all(torch.equal(got[k], expected[k]) for k in expected if isinstance(expected[k], torch.Tensor))
    report = preprocess(tiny_root, store, parts=(1, 2, 3, 4), volume=True, workers=1, sdf_backend="igl",
                        progress=False)  # fmt: skip
    assert report.ok and report.skipped == [1, 2, 3] and report.processed == []
    assert (store / "runs" / "run_1" / "run.json").is_file() and not (store / "runs" / ".old-run_1").exists()
