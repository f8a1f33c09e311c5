"""The training loop (meshshard/training.py): its model config, checkpoints that survive crashes, evaluate.

Through the CLI and torchrun: tests/cli/test_train.py and tests/cli/test_evaluate.py.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from meshshard import training
from meshshard.nn import Transolver, TransolverConfig


class _Crash(Exception):
    pass


def test_train_config_defaults_are_the_transolver_config():
    cfg = training.TrainConfig(store="s", out="o")
    assert cfg.transolver == TransolverConfig()
    small = TransolverConfig(n_hidden=16, n_layers=2, n_head=2, slice_num=4, mlp_ratio=1)
    cfg = training.TrainConfig(store="s", out="o", **small.__dict__)
    assert cfg.transolver == small
    model = cfg.model()
    assert isinstance(model, Transolver)
    assert {k: model.config[k] for k in small.__dict__} == small.__dict__


def test_checkpoint_write_crash_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    training._atomic_save({"step": 2, "w": torch.arange(4)}, path)
    real_save = torch.save

    def half_then_crash(obj, f, *a, **k):
        f.write(b"PK\x03\x04 half a zip")  # some bytes hit the temporary file, then the process "dies"
        raise _Crash

    monkeypatch.setattr(torch, "save", half_then_crash)
    with pytest.raises(_Crash):
        training._atomic_save({"step": 4, "w": torch.zeros(4)}, path)
    monkeypatch.setattr(torch, "save", real_save)
    ckpt = torch.load(path, weights_only=False)
    assert ckpt["step"] == 2 and torch.equal(ckpt["w"], torch.arange(4))

    def no_rename(src, dst):
        raise _Crash

    monkeypatch.setattr(os, "replace", no_rename)  # crash after fsync, before the rename
    with pytest.raises(_Crash):
        training._atomic_save({"step": 6, "w": torch.ones(4)}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=False)["step"] == 2


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory) -> Path:
    from meshshard.datasets import make_synthetic_drivaerml, preprocess

    root = tmp_path_factory.mktemp("faults")
    make_synthetic_drivaerml(root / "raw", 3, surface_cells=300, volume_cells=0, seed=5)
    report = preprocess(root / "raw", root / "store", parts=(1,), workers=1, splits=(0.6, 0.2, 0.2), progress=False)
    assert report.ok
    return root / "store"


def test_resume_after_a_crash_during_a_checkpoint_write(tiny_store, tmp_path, monkeypatch):
    def config(out: Path, resume: bool = False) -> training.TrainConfig:
        return training.TrainConfig(store=str(tiny_store), out=str(out), steps=4, checkpoint_every=2, n_hidden=8,
                                 n_layers=1, n_head=2, slice_num=4, quiet=True, resume=resume)

    reference = training.train(config(tmp_path / "ref"))["losses"]
    real_save, saves = training._atomic_save, []

    def crash_on_second_checkpoint(obj, path):
        saves.append(obj["step"])
        if len(saves) == 2:
            torch.save(obj, str(path) + ".partial")  # the half-written temporary a crash leaves
            raise _Crash
        real_save(obj, path)

    out = tmp_path / "crashed"
    monkeypatch.setattr(training, "_atomic_save", crash_on_second_checkpoint)
    with pytest.raises(_Crash):
        training.train(config(out))
    monkeypatch.undo()
    assert torch.load(out / "checkpoint.pt", weights_only=False)["step"] == 2  # the previous one
    resumed = training.train(config(out, resume=True))
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log] == [1, 2, 3, 4]  # none repeated, none skipped
    assert resumed["losses"] == pytest.approx(reference, rel=1e-6)


def test_a_checkpoint_written_by_train_loads_in_evaluate(tiny_store, tmp_path):
    cfg = training.TrainConfig(store=str(tiny_store), out=str(tmp_path), steps=2, n_hidden=8, n_layers=1, n_head=2,
                               slice_num=4, mlp_ratio=1, quiet=True)
    training.train(cfg)
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert ckpt["config"]["n_hidden"] == 8 and ckpt["config"]["mlp_ratio"] == 1
    summary = training.evaluate(str(tiny_store), str(tmp_path / "checkpoint.pt"), split="all",
                                out=str(tmp_path / "eval.json"))
    assert len(summary["runs"]) == 3 and json.loads((tmp_path / "eval.json").read_text()) == summary
    for r in summary["runs"]:
        assert r["rel_l2"]["pMeanTrim"] > 0 and abs(r["Cd_true"] - r["Cd_csv"]) < 1e-3
        assert math.isfinite(r["Cd_pred"]) and math.isfinite(r["Cl_pred"])
