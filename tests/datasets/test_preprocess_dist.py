"""A rank-parallel preprocess writes the single-process store: same bytes in every array, same sizes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from meshshard.datasets import preprocess
from meshshard.datasets._preprocess_dist import preprocess_distributed
from meshshard.testing import run_distributed


def _distributed(root: str, store: str, parts: tuple[int, ...], method: str, surface: bool) -> dict:
    report = preprocess_distributed(
        root, store, parts=parts, method=method, surface=surface, volume=True, sdf_backend="igl"
    )
    return {"processed": report.processed, "failed": report.failed, "cells": report.cells}


def _arrays(store: Path) -> dict[str, np.ndarray]:
    return {str(p.relative_to(store)): np.load(p) for p in sorted(store.glob("runs/run_*/**/*.npy"))}


def _without_stats(obj):
    if isinstance(obj, dict):
        return {k: _without_stats(v) for k, v in obj.items() if k not in ("stats", "source")}
    return obj


@pytest.mark.parametrize(("parts", "method", "surface"), [((1, 2, 4), "rcb", False), ((2, 3), "hilbert", True)])
def test_two_ranks_write_the_single_process_store(tiny_root, tmp_path, parts, method, surface):
    serial = tmp_path / "serial"
    preprocess(
        tiny_root, serial, parts=parts, method=method, surface=surface, volume=True, workers=1,
        sdf_backend="igl", progress=False,
    )  # fmt: skip
    parallel = tmp_path / "parallel"
    results = run_distributed(_distributed, 2, str(tiny_root), str(parallel), parts, method, surface, timeout=600)
    assert results[0] == results[1] and not results[0]["failed"] and results[0]["processed"]
    want, got = _arrays(serial), _arrays(parallel)
    assert sorted(want) == sorted(got) and want
    for name in want:
        assert want[name].dtype == got[name].dtype and np.array_equal(want[name], got[name]), name
    # Every .npy byte for byte (headers included).
    for name in want:
        assert (serial / name).read_bytes() == (parallel / name).read_bytes(), name
    meta_s = json.loads((serial / "meta.json").read_text())
    meta_p = json.loads((parallel / "meta.json").read_text())
    assert _without_stats(meta_s) == _without_stats(meta_p)
    for kind, fields in meta_s["stats"].items():
        for field, s in fields.items():
            p = meta_p["stats"][kind][field]
            assert p["count"] == s["count"]
            np.testing.assert_allclose(p["mean"], s["mean"], rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(p["std"], s["std"], rtol=1e-9, atol=1e-12)
    for run_json in sorted(serial.glob("runs/run_*/run.json")):
        a = json.loads(run_json.read_text())
        b = json.loads((parallel / run_json.relative_to(serial)).read_text())
        assert _without_stats(a) == _without_stats(b)
    # A re-run skips every run.
    again = run_distributed(_distributed, 2, str(tiny_root), str(parallel), parts, method, surface, timeout=600)
    assert again[0]["processed"] == [] and again[0]["failed"] == {}


def test_nested_rcb_chains_are_refused_on_every_rank(tiny_root, tmp_path):
    with pytest.raises(Exception, match="powers of two"):
        run_distributed(_distributed, 2, str(tiny_root), str(tmp_path / "s"), (3, 6), "rcb", False, timeout=120)
