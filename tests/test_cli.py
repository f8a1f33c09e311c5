"""The ``meshshard`` parser and entry point (meshshard/cli/__init__.py): every command, help, bad commands."""

from __future__ import annotations

import subprocess
import sys

import pytest

from meshshard.cli import COMMANDS, main

NAMES = ["demo", "partition", "preprocess", "train", "evaluate", "plan"]


def test_one_module_per_command():
    assert [c.__name__.rsplit(".", 1)[-1] for c in COMMANDS] == NAMES


@pytest.mark.parametrize("command", NAMES)
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    assert "usage: meshshard" in capsys.readouterr().out


def test_an_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["nope"])
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_python_dash_m_meshshard_cli():
    res = subprocess.run([sys.executable, "-m", "meshshard.cli", "--version"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and res.stdout.startswith("meshshard "), res.stderr
