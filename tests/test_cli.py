"""The ``meshshard`` command on tiny data: help, bad arguments, plan, and torchrun training.

Training checks: torchrun launches with 1, 2 and 3 ranks give the same loss trajectory; a run
killed mid-way and resumed from its checkpoint repeats no step, skips none, and ends with the
losses of an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshshard.cli import main
from tests._crash_hook import crash_env

STEPS = 6


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    from meshshard.datasets import make_synthetic_drivaerml, preprocess

    root = tmp_path_factory.mktemp("cli")
    make_synthetic_drivaerml(root / "raw", 3, surface_cells=1200, volume_cells=0, seed=3)
    report = preprocess(root / "raw", root / "store", parts=(1, 2, 3), workers=1, splits=(0.6, 0.2, 0.2),
                        progress=False)
    assert report.ok
    return root / "store"


def _train(store: Path, out: Path, nproc: int, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "meshshard.cli", "train", str(store), "--out", str(out), "--nproc", str(nproc),
           "--steps", str(STEPS), "--checkpoint-every", "2", "--n-hidden", "16", "--n-layers", "2", "--n-head", "2",
           "--slice-num", "4", *extra]
    run_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=600)


def _log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def trajectories(store, tmp_path_factory):
    root = tmp_path_factory.mktemp("traj")
    out = {}
    for nproc in (1, 2, 3):
        res = _train(store, root / f"p{nproc}", nproc)
        assert res.returncode == 0, res.stderr[-3000:]
        out[nproc] = root / f"p{nproc}"
    return out


def test_torchrun_1_2_3_ranks_follow_the_same_loss_trajectory(trajectories):
    logs = {n: _log(p) for n, p in trajectories.items()}
    assert [e["step"] for e in logs[1]] == list(range(1, STEPS + 1))
    ref = [e["loss"] for e in logs[1]]
    for n in (2, 3):
        got = [e["loss"] for e in logs[n]]
        assert got == pytest.approx(ref, rel=2e-4), (n, got, ref)
    summary = json.loads((trajectories[3] / "train_summary.json").read_text())
    assert summary["world"] == 3 and len(summary["per_rank"]) == 3


def test_killed_run_resumes_without_lost_or_repeated_steps(store, trajectories, tmp_path):
    out = tmp_path / "killed"
    crashed = _train(store, out, 2, env=crash_env(5))
    assert crashed.returncode != 0
    ckpt_steps = [e["step"] for e in _log(out)]
    assert ckpt_steps[-1] == 5  # step 5 was logged, then the process died before its checkpoint
    resumed = _train(store, out, 2, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = _log(out)
    assert [e["step"] for e in log] == list(range(1, STEPS + 1))
    reference = [e["loss"] for e in _log(trajectories[2])]
    assert [e["loss"] for e in log] == pytest.approx(reference, rel=1e-6)


def test_transolver_plus_trains_alike_on_1_and_2_ranks_and_resumes_exactly(store, tmp_path):
    """Gumbel noise keyed by global point id and step: ranks and a resume draw the serial run's noise."""
    runs = {}
    for nproc in (1, 2):
        res = _train(store, tmp_path / f"pp{nproc}", nproc, "--model", "transolver++")
        assert res.returncode == 0, res.stderr[-3000:]
        runs[nproc] = [e["loss"] for e in _log(tmp_path / f"pp{nproc}")]
    assert len(runs[1]) == STEPS and runs[2] == pytest.approx(runs[1], rel=2e-4)
    out = tmp_path / "pp_killed"
    assert _train(store, out, 2, "--model", "transolver++", env=crash_env(3)).returncode != 0
    resumed = _train(store, out, 2, "--model", "transolver++", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [e["loss"] for e in _log(out)] == pytest.approx(runs[2], rel=1e-6)


def test_evaluate_prints_errors_and_drag(store, trajectories, tmp_path, capsys):
    out_json = tmp_path / "eval.json"
    assert main(["evaluate", str(store), str(trajectories[1] / "checkpoint.pt"), "--json", str(out_json)]) == 0
    printed = capsys.readouterr().out
    assert "relL2 p" in printed and "Cd pred" in printed
    res = json.loads(out_json.read_text())
    assert res["runs"] and all(r["rel_l2"]["pMeanTrim"] > 0 for r in res["runs"])
    assert all(abs(r["Cd_true"] - r["Cd_csv"]) < 1e-3 for r in res["runs"])  # stored fields integrate to the CSV


def test_plan_reports_every_rank(capsys, tmp_path):
    out = tmp_path / "plan.json"
    assert main(["plan", "--points", "20000", "--parts", "8", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "points per rank" in printed and "halo traffic" in printed
    report = json.loads(out.read_text())
    assert len(report["ranks"]) == 8
    assert sum(r["points"] for r in report["ranks"]) == 20000
    assert all(r["ghosts"] > 0 for r in report["ranks"])
    assert report["total_halo_bytes_per_exchange"] < 0.5 * report["total_ring_bytes_per_exchange"]


@pytest.mark.parametrize("command", ["demo", "partition", "preprocess", "train", "evaluate", "plan"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    assert "usage: meshshard" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "/nonexistent/store", "--out", "x"], "store not found"),
        (["evaluate", "/nonexistent/store", "/nonexistent/ckpt.pt"], "store not found"),
        (["plan", "--parts", "4"], "give exactly one of --points N or --data FILE"),
        (["plan", "--data", "/nonexistent.npy", "--parts", "4"], "file not found"),
        (["partition", "/nonexistent.vtp"], "input file not found"),
        (["demo", "--runs", "2"], "--runs must be at least 3"),
    ],
)
def test_user_mistakes_end_with_one_line_messages(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2  # usage errors, as argparse's
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("argv", [["train", "s", "--out", "o", "--steps", "0"], ["plan", "--parts", "-2"], ["nope"]])
def test_bad_argument_values_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_example_training_script_runs_under_torchrun(store):
    script = Path(__file__).resolve().parents[1] / "examples" / "train_transolver_drivaerml.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
           str(store), "--steps", "2"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert "step    1  loss" in res.stdout and "points on rank 0" in res.stdout
