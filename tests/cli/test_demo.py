"""``meshshard demo`` (meshshard/cli/demo.py): its explicit small model and its argument checks.

The demo itself runs for minutes (``make demo``); here only what decides how it runs.
"""

from __future__ import annotations

import pytest

from meshshard.cli import build_parser, main
from meshshard.cli.demo import DEMO_MODEL, _model_args


def test_the_demo_trains_its_stated_model():
    args = build_parser().parse_args(["train", "STORE", "--out", "o", *_model_args(DEMO_MODEL)])
    assert (args.n_hidden, args.n_layers, args.n_head, args.slice_num, args.mlp_ratio) == (64, 3, 4, 16, 2)


def test_too_few_runs_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["demo", "--runs", "2"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--runs must be at least 3" in err and len(err.strip().splitlines()) == 1, err
