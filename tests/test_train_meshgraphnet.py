"""``meshshard train --model meshgraphnet``: 1 and 2 ranks follow one loss trajectory; resume; evaluate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshshard.cli import main
from tests._crash_hook import crash_env

STEPS = 4


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    from meshshard.datasets import make_synthetic_drivaerml, preprocess

    root = tmp_path_factory.mktemp("mgn")
    make_synthetic_drivaerml(root / "raw", 3, surface_cells=1200, volume_cells=0, seed=3)
    report = preprocess(root / "raw", root / "store", parts=(1, 2), workers=1, splits=(0.6, 0.2, 0.2), progress=False)
    assert report.ok
    return root / "store"


def _train(store: Path, out: Path, nproc: int, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "meshshard.cli", "train", str(store), "--out", str(out), "--nproc", str(nproc),
           "--model", "meshgraphnet", "--steps", str(STEPS), "--checkpoint-every", "2", "--n-hidden", "16",
           "--n-layers", "3", "--knn", "5", *extra]
    run_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=600)


def _losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(store, tmp_path_factory):
    root = tmp_path_factory.mktemp("mgn_runs")
    for nproc in (1, 2):
        res = _train(store, root / f"p{nproc}", nproc)
        assert res.returncode == 0, res.stderr[-3000:]
    return root


def test_meshgraphnet_1_and_2_ranks_follow_the_same_loss_trajectory(runs):
    ref, got = _losses(runs / "p1"), _losses(runs / "p2")
    assert len(ref) == STEPS and len(set(ref)) > 1
    assert got == pytest.approx(ref, rel=1e-4)
    ckpt_cfg = json.loads((runs / "p2" / "train_summary.json").read_text())
    assert ckpt_cfg["world"] == 2


def test_meshgraphnet_resume_and_evaluate(store, runs, tmp_path, capsys):
    out = tmp_path / "killed"
    crashed = _train(store, out, 2, env=crash_env(3))
    assert crashed.returncode != 0
    resumed = _train(store, out, 2, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _losses(out) == pytest.approx(_losses(runs / "p2"), rel=1e-6)
    out_json = tmp_path / "eval.json"
    assert main(["evaluate", str(store), str(runs / "p1" / "checkpoint.pt"), "--json", str(out_json)]) == 0
    assert "relL2 p" in capsys.readouterr().out
    res = json.loads(out_json.read_text())
    assert res["runs"] and all(r["rel_l2"]["pMeanTrim"] > 0 for r in res["runs"])
