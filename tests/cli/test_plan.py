"""``meshshard plan`` (meshshard/cli/plan.py): the report, one-line usage errors, the library's defaults."""

from __future__ import annotations

import json

import pytest

from meshshard.cli import main
from meshshard.nn import TransolverConfig
from meshshard.planning import plan


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


_MEMORY = ("activation_bytes_per_point", "transolver_allreduce_bytes_per_layer", "single_rank_activation_mb",
           "total_halo_bytes_per_exchange", "model")


@pytest.mark.parametrize("model", [None, TransolverConfig(n_hidden=64, n_layers=3, n_head=4, slice_num=16)])
def test_the_command_and_plan_report_the_same_memory(model, tmp_path, capsys):
    """``meshshard plan`` and ``plan()`` share one set of model defaults (TransolverConfig's)."""
    out = tmp_path / "plan.json"
    options = [] if model is None else [
        "--n-hidden", str(model.n_hidden), "--n-layers", str(model.n_layers), "--n-head", str(model.n_head),
        "--slice-num", str(model.slice_num), "--mlp-ratio", str(model.mlp_ratio),
    ]
    assert main(["plan", "--points", "3000", "--parts", "4", "--quiet", "--json", str(out), *options]) == 0
    capsys.readouterr()
    cli = json.loads(out.read_text())
    api = plan(num_points=3000, parts=4, model=model)
    for key in _MEMORY:
        assert cli[key] == api[key], key
    assert [r["activation_mb"] for r in cli["ranks"]] == [r["activation_mb"] for r in api["ranks"]]
    assert cli["model"] == (TransolverConfig() if model is None else model).__dict__


@pytest.mark.parametrize(
    "argv, message",
    [
        (["plan", "--parts", "4"], "give exactly one of --points N or --data FILE"),
        (["plan", "--data", "/nonexistent.npy", "--parts", "4"], "file not found"),
        (["plan", "--points", "1000", "--parts", "2", "--n-hidden", "10", "--n-head", "3"],
         "--n-hidden (10) must be divisible by --n-head (3)"),
    ],
)
def test_user_mistakes_end_with_one_line_messages(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2  # usage errors, as argparse's
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_negative_parts_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["plan", "--parts", "-2"])
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err
