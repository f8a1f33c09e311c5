"""``meshshard partition`` (meshshard/cli/partition.py: register/run), called through argparse and ``main``."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from meshshard.cli import main
from meshshard.cli.partition import format_quality, register
from meshshard.errors import UsageError
from meshshard.partition import Partition


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="meshshard")
    register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture
def cloud_file(tmp_path):
    path = tmp_path / "cloud.npy"
    np.save(path, np.random.default_rng(0).random((2000, 3)))
    return path


def test_cloud_table_and_saved_partition(cloud_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert _main(["partition", str(cloud_file), "--parts", "4", "--method", "hilbert", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "cloud.npy: 2,000 points into 4 parts with hilbert" in text
    assert "about 32 neighbours" in text and "imbalance 1.0000" in text and "ghost fraction" in text
    assert text.count("25.00%") == 4
    assert "ghosts within" in text and (out / "partitions.pvtp").is_file()  # ghosts are written by default
    part = Partition.load(out / "partition.pt")
    assert part.method == "hilbert" and part.sizes.tolist() == [500] * 4


def test_mesh_input_with_radius_and_fractions(tmp_path, capsys):
    import pyvista as pv
    path = tmp_path / "s.vtp"
    pv.Sphere(theta_resolution=16, phi_resolution=10).save(path)
    assert _main(["partition", str(path), "--parts", "2", "--ghost-radius", "0.1", "--fractions", "0.25,0.75"]) == 0
    text = capsys.readouterr().out
    assert "cells into 2 parts with rcb" in text and "ghost radius 0.1\n" in text


def test_calls_io(cloud_file, tmp_path, capsys, monkeypatch):
    calls = []

    def write_partitions(data, part, out, ghost_radius=None, **kwargs):
        calls.append(("write", part.num_parts, ghost_radius, sorted(kwargs.get("field_data", {}))))
        return out / "partitions.pvtp"

    def render_partitions(data, part, png):
        calls.append(("render", part.num_parts))
        return png

    monkeypatch.setattr("meshshard.io.write_partitions", write_partitions)
    monkeypatch.setattr("meshshard.io.render_partitions", render_partitions)
    png = tmp_path / "p.png"
    argv = ["partition", str(cloud_file), "--parts", "3", "--out", str(tmp_path / "o"), "--png", str(png)]
    assert _main([*argv, "--ghost-radius", "0.2"]) == 0
    assert calls == [("write", 3, 0.2, ["imbalance", "source"]), ("render", 3)]
    assert f"wrote {png}" in capsys.readouterr().out
    calls.clear()
    assert _main([*argv, "--no-ghosts"]) == 0
    assert calls[0][2] is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["missing.npy"], "input file not found"),
        (["{cloud}", "--parts", "0"], r"--parts must be at least 1 \(got 0\)"),
        (["{cloud}", "--ghost-radius", "-1"], r"--ghost-radius must be positive \(got -1.0\)"),
        (["{cloud}", "--parts", "2", "--fractions", "0.5,0.4"], r"fractions must sum to 1"),
        (["{cloud}", "--parts", "2", "--fractions", "0.5"], r"--fractions needs 2 values"),
        (["{cloud}", "--fractions", "a,b"], r"--fractions must be comma-separated numbers"),
        (["{bad}"], r"the array must have shape \(N, 2\) or \(N, 3\)"),
        (["{txt}"], r"INPUT must be a \.npy point array"),
    ],
)
def test_user_errors_exit_with_one_line(argv, message, cloud_file, tmp_path):
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((4, 5)))
    txt = tmp_path / "a.txt"
    txt.write_text("x")
    argv = [a.format(cloud=cloud_file, bad=bad, txt=txt) for a in argv]
    with pytest.raises(UsageError, match=message) as info:  # main() turns it into one line and exit 2
        _main(["partition", *argv])
    assert str(info.value).startswith("meshshard partition: ") and "\n" not in str(info.value)


def test_format_quality_without_ghosts():
    q = {"sizes": [3, 1], "num_points": 4, "ghosts": None, "imbalance": 1.5}
    assert format_quality(q).splitlines()[-1] == "imbalance 1.5000"


def test_a_missing_input_through_main_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["partition", "/nonexistent.vtp"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "input file not found" in err and len(err.strip().splitlines()) == 1, err
