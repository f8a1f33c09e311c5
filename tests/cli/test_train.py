"""``meshshard train`` (meshshard/cli/train.py) on tiny data, through torchrun.

Torchrun launches with 1, 2 and 3 ranks give the same loss trajectory; a run killed mid-way and
resumed from its checkpoint repeats no step, skips none, and ends with the losses of an
uninterrupted run. The same for ``--model meshgraphnet`` at 1 and 2 ranks, then ``evaluate``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshshard.cli import main
from meshshard.cli._common import model_config
from meshshard.nn import TransolverConfig
from tests._crash_hook import crash_env
from tests.cli._helpers import STEPS, code_running_checkpoint, log, snapshot, train


# -- Transolver: world sizes, resume ---------------------------------------------------------------------
def test_torchrun_1_2_3_ranks_follow_the_same_loss_trajectory(trajectories):
    logs = {n: log(p) for n, p in trajectories.items()}
    assert [e["step"] for e in logs[1]] == list(range(1, STEPS + 1))
    ref = [e["loss"] for e in logs[1]]
    for n in (2, 3):
        got = [e["loss"] for e in logs[n]]
        assert got == pytest.approx(ref, rel=2e-4), (n, got, ref)
    summary = json.loads((trajectories[3] / "train_summary.json").read_text())
    assert summary["world"] == 3 and len(summary["per_rank"]) == 3


def test_killed_run_resumes_without_lost_or_repeated_steps(train_store, trajectories, tmp_path):
    out = tmp_path / "killed"
    crashed = train(train_store, out, 2, env=crash_env(5))
    assert crashed.returncode != 0
    ckpt_steps = [e["step"] for e in log(out)]
    assert ckpt_steps[-1] == 5  # step 5 was logged, then the process died before its checkpoint
    resumed = train(train_store, out, 2, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    entries = log(out)
    assert [e["step"] for e in entries] == list(range(1, STEPS + 1))
    reference = [e["loss"] for e in log(trajectories[2])]
    assert [e["loss"] for e in entries] == pytest.approx(reference, rel=1e-6)


def test_transolver_plus_trains_alike_on_1_and_2_ranks_and_resumes_exactly(train_store, tmp_path):
    """Gumbel noise keyed by global point id and step: ranks and a resume draw the serial run's noise."""
    runs = {}
    for nproc in (1, 2):
        res = train(train_store, tmp_path / f"pp{nproc}", nproc, "--model", "transolver++")
        assert res.returncode == 0, res.stderr[-3000:]
        runs[nproc] = [e["loss"] for e in log(tmp_path / f"pp{nproc}")]
    assert len(runs[1]) == STEPS and runs[2] == pytest.approx(runs[1], rel=2e-4)
    # the resume on one rank (no torchrun, half the processes): the noise is keyed by point id and step, and
    # the ranks draw the serial noise (above); resuming on several ranks: test_killed_run_resumes_...
    out = tmp_path / "pp_killed"
    assert train(train_store, out, 1, "--model", "transolver++", env=crash_env(3)).returncode != 0
    resumed = train(train_store, out, 1, "--model", "transolver++", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [e["loss"] for e in log(out)] == pytest.approx(runs[1], rel=1e-6)


def test_model_options_default_to_the_transolver_config():
    from meshshard.cli import build_parser

    args = build_parser().parse_args(["train", "STORE", "--out", "o"])
    assert model_config("train", args) == TransolverConfig()


def test_store_not_found_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "/nonexistent/store", "--out", "x"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "store not found" in err and len(err.strip().splitlines()) == 1, err


def test_resume_from_a_checkpoint_that_would_run_code_is_refused_and_changes_nothing(train_store, tmp_path, capsys):
    out, marker = tmp_path / "run", tmp_path / "PWNED"
    out.mkdir()
    code_running_checkpoint(out / "checkpoint.pt", marker)
    (out / "log.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    before = snapshot(out)
    says = f"meshshard train: --resume: {out / 'checkpoint.pt'} is not a meshshard checkpoint: loading it would need"
    for nproc in ("1", "2"):  # refused before any rank starts
        with pytest.raises(SystemExit) as info:
            main(["train", str(train_store), "--out", str(out), "--resume", "--nproc", nproc, "--steps", "2"])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(says) and len(err.strip().splitlines()) == 1, err
    res = train(train_store, out, 2, "--resume")  # the installed command, as a user runs it
    assert res.returncode == 2 and res.stderr.startswith(says) and len(res.stderr.strip().splitlines()) == 1
    assert not marker.exists() and snapshot(out) == before


def test_zero_steps_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "s", "--out", "o", "--steps", "0"])
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err


# -- MeshGraphNet (--model meshgraphnet) -----------------------------------------------------------------
MGN_STEPS = 4


def _train_mgn(
    store: Path, out: Path, nproc: int, *extra: str, env: dict | None = None
) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "meshshard.cli", "train", str(store), "--out", str(out), "--nproc", str(nproc),
           "--model", "meshgraphnet", "--steps", str(MGN_STEPS), "--checkpoint-every", "2", "--n-hidden", "16",
           "--n-layers", "3", "--knn", "5", *extra]
    run_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=600)


def _losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def mgn_runs(train_store, tmp_path_factory):
    root = tmp_path_factory.mktemp("mgn_runs")
    for nproc in (1, 2):
        res = _train_mgn(train_store, root / f"p{nproc}", nproc)
        assert res.returncode == 0, res.stderr[-3000:]
    return root


def test_meshgraphnet_1_and_2_ranks_follow_the_same_loss_trajectory(mgn_runs):
    ref, got = _losses(mgn_runs / "p1"), _losses(mgn_runs / "p2")
    assert len(ref) == MGN_STEPS and len(set(ref)) > 1
    assert got == pytest.approx(ref, rel=1e-4)
    ckpt_cfg = json.loads((mgn_runs / "p2" / "train_summary.json").read_text())
    assert ckpt_cfg["world"] == 2


def test_meshgraphnet_resume_and_evaluate(train_store, mgn_runs, tmp_path, capsys):
    out = tmp_path / "killed"  # on one rank, as the Transolver++ resume above
    crashed = _train_mgn(train_store, out, 1, env=crash_env(3))
    assert crashed.returncode != 0
    resumed = _train_mgn(train_store, out, 1, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _losses(out) == pytest.approx(_losses(mgn_runs / "p1"), rel=1e-6)
    out_json = tmp_path / "eval.json"
    assert main(["evaluate", str(train_store), str(mgn_runs / "p1" / "checkpoint.pt"), "--json", str(out_json)]) == 0
    assert "relL2 p" in capsys.readouterr().out
    res = json.loads(out_json.read_text())
    assert res["runs"] and all(r["rel_l2"]["pMeanTrim"] > 0 for r in res["runs"])
