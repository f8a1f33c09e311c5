"""``meshshard evaluate`` (meshshard/cli/evaluate.py): the table, the JSON report, one-line usage errors."""

from __future__ import annotations

import json

import pytest

from meshshard.cli import main
from tests.cli._helpers import code_running_checkpoint


def test_evaluate_prints_errors_and_drag(train_store, trajectories, tmp_path, capsys):
    out_json = tmp_path / "eval.json"
    assert main(["evaluate", str(train_store), str(trajectories[1] / "checkpoint.pt"), "--json", str(out_json)]) == 0
    printed = capsys.readouterr().out
    assert "relL2 p" in printed and "Cd pred" in printed
    res = json.loads(out_json.read_text())
    assert res["runs"] and all(r["rel_l2"]["pMeanTrim"] > 0 for r in res["runs"])
    # The store's fields (read from the VTK files, permuted, normalised and restored) integrate to the raw CSV.
    assert all(abs(r["Cd_true"] - r["Cd_csv"]) < 1e-3 for r in res["runs"])


def test_store_not_found_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["evaluate", "/nonexistent/store", "/nonexistent/ckpt.pt"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "store not found" in err and len(err.strip().splitlines()) == 1, err


def test_a_checkpoint_that_would_run_code_is_refused_with_exit_2(train_store, tmp_path, capsys):
    marker = tmp_path / "PWNED"
    evil = code_running_checkpoint(tmp_path / "evil.pt", marker)
    text = tmp_path / "notes.pt"
    text.write_text("not a checkpoint\n")
    for path, says in ((evil, "loading it would need Python objects that can run code (io.open)"),
                       (text, "is not a checkpoint written by 'meshshard train' (torch.load failed")):
        with pytest.raises(SystemExit) as info:
            main(["evaluate", str(train_store), str(path)])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"meshshard evaluate: {path} ") and says in err and len(err.strip().splitlines()) == 1
    assert not marker.exists()
