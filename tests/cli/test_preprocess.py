"""``meshshard preprocess`` (meshshard/cli/preprocess.py): in process, and started as ``python -m meshshard.cli``."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from meshshard.cli.preprocess import register
from meshshard.datasets import load_meta, make_synthetic_drivaerml
from meshshard.errors import UsageError
from meshshard.testing.curator import write_curator_runs


@pytest.fixture(scope="module")
def raw_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three small synthetic runs (surface only), seed 0; read-only."""
    root = tmp_path_factory.mktemp("raw")
    make_synthetic_drivaerml(root, 3, surface_cells=2000, volume_cells=0, seed=0)
    return root


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="meshshard")
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_preprocess_writes_a_store_and_refuses_bad_arguments(raw_root, tmp_path, capsys):
    args = _parse(["preprocess", str(raw_root), str(tmp_path / "s"), "--parts", "2", "--workers", "1", "--no-progress"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "3 run(s) processed" in out and "cells/s" in out
    assert load_meta(tmp_path / "s")["kinds"] == ["surface"]
    args = _parse(["preprocess", str(tmp_path / "missing"), str(tmp_path / "s")])
    with pytest.raises(UsageError, match="DATA_DIR .*missing is not a directory"):
        args.func(args)
    args = _parse(["preprocess", str(raw_root), str(tmp_path / "s"), "--parts", "0"])
    with pytest.raises(UsageError, match=r"meshshard preprocess: parts must be positive"):
        args.func(args)


def test_preprocess_reads_physicsnemo_curator_folders(raw_root, tmp_path, capsys):
    curated = tmp_path / "curated"
    write_curator_runs(raw_root, curated, fmt="npz", volume=False, chunk_mb=0.01, chunks_per_shard=4)
    args = _parse(
        ["preprocess", str(curated), str(tmp_path / "s"), "--source", "physicsnemo-curator",
         "--parts", "1", "2", "--workers", "1", "--no-progress", "--runs", "1"]
    )  # fmt: skip
    assert args.func(args) == 0
    assert "1 run(s) processed" in capsys.readouterr().out
    assert load_meta(tmp_path / "s")["runs"]["1"]["surface"]["sizes"]["2"]
    bad = _parse(["preprocess", str(curated), str(tmp_path / "t"), "--no-progress"])
    with pytest.raises(UsageError, match=r"no run_<i> folders in .*: use source='physicsnemo-curator'\)$"):
        bad.func(bad)


def test_worker_processes_from_python_dash_m(tmp_path):
    """Spawned workers import ``meshshard.cli.__main__`` again: it must not run the command a second time."""
    make_synthetic_drivaerml(tmp_path / "raw", 2, surface_cells=300, volume_cells=0, seed=1)
    cmd = [sys.executable, "-m", "meshshard.cli", "preprocess", str(tmp_path / "raw"), str(tmp_path / "store"),
           "--parts", "1", "2", "--workers", "2", "--no-progress", "--splits", "0.5", "0.5", "0"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "2 run(s) processed" in res.stdout and "0 failed" in res.stdout, res.stdout
