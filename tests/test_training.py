"""The training loop (meshshard/training.py): its model config, checkpoints that survive crashes, evaluate;
checkpoints that cannot run code (weights-only reads, one clear error for anything else).

Through the CLI and torchrun: tests/cli/test_train.py and tests/cli/test_evaluate.py.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from meshshard import training
from meshshard.errors import CheckpointError
from meshshard.nn import Transolver, TransolverConfig
from tests.cli._helpers import code_running_checkpoint, snapshot


class _Crash(Exception):
    pass


def test_train_config_nests_the_model_config_and_defaults_to_it():
    cfg = training.TrainConfig(store="s", out="o")
    assert cfg.model_config == TransolverConfig()
    small = TransolverConfig(n_hidden=16, n_layers=2, n_head=2, slice_num=4, mlp_ratio=1)
    cfg = training.TrainConfig(store="s", out="o", model_config=small)
    assert cfg.model_config is small
    model = cfg.model()
    assert isinstance(model, Transolver)
    assert {k: model.config[k] for k in small.__dict__} == small.__dict__
    assert (model.config["in_dim"], model.config["out_dim"]) == (training.IN_DIM, training.OUT_DIM) == (6, 4)
    mgn = training.TrainConfig(store="s", out="o", arch="meshgraphnet")
    assert mgn.model_config == training.MeshGraphNetConfig(TransolverConfig.n_hidden, TransolverConfig.n_layers)
    with pytest.raises(TypeError, match=r"model_config must be a MeshGraphNetConfig for arch 'meshgraphnet' "
                                        r"\(got TransolverConfig\)"):
        training.TrainConfig(store="s", out="o", arch="meshgraphnet", model_config=small)
    with pytest.raises(TypeError, match=r"model_config must be a TransolverConfig for arch 'transolver\+\+'"):
        training.TrainConfig(store="s", out="o", arch="transolver++", model_config=mgn.model_config)
    with pytest.raises(ValueError, match=r"hidden must be at least 1 \(got 0\)"):
        training.MeshGraphNetConfig(hidden=0)


def test_from_dict_reads_the_nested_and_the_older_flat_config():
    small = TransolverConfig(n_hidden=16, n_layers=2, n_head=2, slice_num=4, mlp_ratio=1)
    cfg = training.TrainConfig(store="s", out="o", steps=3, model_config=small)
    assert training.TrainConfig.from_dict(asdict(cfg)) == cfg
    flat = {k: v for k, v in asdict(cfg).items() if k != "model_config"} | asdict(small)
    assert training.TrainConfig.from_dict(flat) == cfg  # a checkpoint written before the config was nested
    mgn_flat = {**flat, "arch": "meshgraphnet"}  # MeshGraphNet used n_hidden and n_layers
    assert training.TrainConfig.from_dict(mgn_flat).model_config == training.MeshGraphNetConfig(16, 2)
    with pytest.raises(ValueError, match=r"both model_config and the older top-level model fields \['n_hidden'\]"):
        training.TrainConfig.from_dict({**asdict(cfg), "n_hidden": 8})
    with pytest.raises(TypeError, match="unexpected keyword argument 'width'"):
        training.TrainConfig.from_dict({**asdict(cfg), "model_config": {"width": 3}})


def test_the_channel_layout_is_defined_once():
    assert training.INPUTS == tuple(training.INPUT_CHANNELS) == ("pos", "normals")
    assert training.TARGETS == tuple(training.TARGET_CHANNELS) == ("pMeanTrim", "wallShearStressMeanTrim")
    n = 5
    sample = {"pos": torch.full((n, 3), 3.0), "normals": torch.full((n, 3), 2.0),
              "pMeanTrim": torch.arange(n, dtype=torch.float32), "wallShearStressMeanTrim": torch.full((n, 3), -1.0)}
    x, t = training.features(sample, {"pos": (torch.ones(3), torch.full((3,), 2.0))})
    assert x.shape == (n, training.IN_DIM) and t.shape == (n, training.OUT_DIM)
    assert torch.equal(x[:, :3], torch.ones(n, 3)) and torch.equal(x[:, 3:], sample["normals"])
    assert torch.equal(training._target(t, "pMeanTrim"), sample["pMeanTrim"])
    assert torch.equal(training._target(t, "wallShearStressMeanTrim"), sample["wallShearStressMeanTrim"])


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
        model = TransolverConfig(n_hidden=8, n_layers=1, n_head=2, slice_num=4)
        return training.TrainConfig(store=str(tiny_store), out=str(out), steps=4, checkpoint_every=2,
                                    model_config=model, quiet=True, resume=resume)

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
    model = TransolverConfig(n_hidden=8, n_layers=1, n_head=2, slice_num=4, mlp_ratio=1)
    cfg = training.TrainConfig(store=str(tiny_store), out=str(tmp_path), steps=2, quiet=True, model_config=model)
    training.train(cfg)
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert ckpt["config"]["model_config"]["n_hidden"] == 8 and ckpt["config"]["model_config"]["mlp_ratio"] == 1
    summary = training.evaluate(str(tiny_store), str(tmp_path / "checkpoint.pt"), split="all",
                                out=str(tmp_path / "eval.json"))
    assert len(summary["runs"]) == 3 and json.loads((tmp_path / "eval.json").read_text()) == summary
    for r in summary["runs"]:
        assert r["rel_l2"]["pMeanTrim"] > 0 and abs(r["Cd_true"] - r["Cd_csv"]) < 1e-3
        assert math.isfinite(r["Cd_pred"]) and math.isfinite(r["Cl_pred"])


# -- checkpoints that cannot run code (issue 33) ------------------------------------------------------
SMALL_MODEL = TransolverConfig(n_hidden=8, n_layers=1, n_head=2, slice_num=4, mlp_ratio=1)
SMALL = dict(model_config=SMALL_MODEL, quiet=True)


@pytest.fixture(scope="module")
def trained(tiny_store, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trained")
    training.train(training.TrainConfig(store=str(tiny_store), out=str(out), steps=2, **SMALL))
    return out


def test_a_checkpoint_that_would_run_code_runs_none_through_the_library(tiny_store, tmp_path):
    run, marker = tmp_path / "run", tmp_path / "PWNED"
    run.mkdir()
    evil = code_running_checkpoint(run / "checkpoint.pt", marker)
    (run / "log.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    before = snapshot(run)
    refused = r"is not a meshshard checkpoint: loading it would need Python objects that can run code \(io.open\)"
    with pytest.raises(CheckpointError, match=refused):
        training.evaluate(str(tiny_store), str(evil))
    with pytest.raises(CheckpointError, match=refused):
        training.train(training.TrainConfig(store=str(tiny_store), out=str(run), steps=4, resume=True, **SMALL))
    with pytest.raises(CheckpointError, match=refused):
        training.convert_checkpoint(evil, tmp_path / "converted.pt")
    assert not marker.exists() and not (tmp_path / "converted.pt").exists()
    assert snapshot(run) == before  # a failed resume leaves the run folder as it was


def test_checkpoints_hold_only_tensors_and_plain_types_and_unversioned_ones_load(tiny_store, trained, tmp_path):
    ckpt = torch.load(trained / "checkpoint.pt", weights_only=True)
    assert sorted(ckpt) == sorted([*training.CHECKPOINT_KEYS, "format"]) and ckpt["format"] == 1
    assert isinstance(ckpt["config"], dict) and ckpt["rng"].dtype == torch.uint8
    assert training.load_checkpoint(trained / "checkpoint.pt", resume=True)["step"] == 2
    del ckpt["format"]  # as every checkpoint written before the format entry: plain, so it loads
    torch.save(ckpt, tmp_path / "old.pt")
    old = training.evaluate(str(tiny_store), str(tmp_path / "old.pt"), split="all")
    assert old == training.evaluate(str(tiny_store), str(trained / "checkpoint.pt"), split="all")


def test_a_checkpoint_with_the_older_flat_config_evaluates_and_resumes(tiny_store, trained, tmp_path):
    ckpt = torch.load(trained / "checkpoint.pt", weights_only=True)
    config = dict(ckpt["config"])
    flat = {**config, **config.pop("model_config")}
    del flat["model_config"]
    assert flat["n_hidden"] == 8 and "model_config" not in flat
    run = tmp_path / "run"
    run.mkdir()
    torch.save({**ckpt, "config": flat}, run / "checkpoint.pt")
    (run / "log.jsonl").write_bytes((trained / "log.jsonl").read_bytes())
    old = training.evaluate(str(tiny_store), str(run / "checkpoint.pt"), split="all")
    assert old == training.evaluate(str(tiny_store), str(trained / "checkpoint.pt"), split="all")
    cfg = training.TrainConfig(store=str(tiny_store), out=str(run), steps=3, resume=True, **SMALL)
    assert training.check_resume(cfg) is True
    assert len(training.train(cfg)["losses"]) == 3


def test_progress_lines_go_to_the_log_callback(tiny_store, tmp_path, capsys):
    lines = []
    cfg = training.TrainConfig(store=str(tiny_store), out=str(tmp_path / "run"), steps=3, log_every=2,
                               model_config=SMALL_MODEL, resume=True)
    training.train(cfg, log=lines.append)
    assert lines[0] == f"no checkpoint in {tmp_path / 'run'}: starting from step 0"
    assert [line.split()[1] for line in lines[1:]] == ["1", "2", "3"] and "loss" in lines[1]
    assert capsys.readouterr().out == ""


def test_python_objects_of_older_files_are_refused_with_how_to_convert(tiny_store, trained, tmp_path):
    ckpt = torch.load(trained / "checkpoint.pt", weights_only=True)
    cfg = training.TrainConfig.from_dict(ckpt["config"])
    cfg.store = Path(cfg.store)  # a path object, as a script might have left it
    torch.save({**ckpt, "config": cfg}, tmp_path / "objects.pt")
    with pytest.raises(CheckpointError, match=r"meshshard.training.TrainConfig.*convert_checkpoint\(SRC, DST\)"):
        training.load_checkpoint(tmp_path / "objects.pt")
    dst = training.convert_checkpoint(tmp_path / "objects.pt", tmp_path / "plain.pt")
    assert training.load_checkpoint(dst, resume=True)["config"] == ckpt["config"]
    assert training.evaluate(str(tiny_store), str(dst), split="all")["runs"]
    with pytest.raises(FileExistsError, match="plain.pt exists; choose a new file name"):
        training.convert_checkpoint(tmp_path / "objects.pt", dst)


def _entries(trained: Path) -> dict:
    return torch.load(trained / "checkpoint.pt", weights_only=True)


BAD = {
    "not a torch file": (lambda t: b"step 2, loss 0.1\n", r"is not a checkpoint written by 'meshshard train' "
                         r"\(torch.load failed: "),
    "a list": (lambda t: [1, 2], r"expected a dict with entries \['model', .*found a list"),
    "no config": (lambda t: {"model": _entries(t)["model"]}, r"lacks \['config'\]"),
    "model of strings": (lambda t: {**_entries(t), "model": {"w": "x"}},
                         r"'model' must be a dict of tensors \(model.state_dict\(\)\) \(found str\)"),
    "negative step": (lambda t: {**_entries(t), "step": -1}, r"'step' must be a non-negative int \(found -1\)"),
    "float rng": (lambda t: {**_entries(t), "rng": torch.zeros(3)}, r"'rng' must be a uint8 tensor.*1-d torch.float32"),
    "unknown config field": (lambda t: {**_entries(t), "config": {**_entries(t)["config"], "lr_warmup": 3}},
                             r"TrainConfig lacks: \['lr_warmup'\] \(written by another version\)"),
    "bad config value": (lambda t: {**_entries(t), "config": {**_entries(t)["config"], "steps": 0}},
                         r"config is not a valid TrainConfig \(ValueError: steps must be"),
    "newer format": (lambda t: {**_entries(t), "format": 7}, r"checkpoint format 7; this meshshard reads format 1"),
    "other model": (lambda t: {**_entries(t), "model": {**_entries(t)["model"], "extra": torch.zeros(2)}},
                    r"'model' does not fit this run's Transolver"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_file_that_is_no_checkpoint_gets_one_clear_error_naming_it(tiny_store, trained, tmp_path, case):
    make, message = BAD[case]
    path = tmp_path / "checkpoint.pt"
    content = make(trained)
    path.write_bytes(content) if isinstance(content, bytes) else torch.save(content, path)
    with pytest.raises(CheckpointError, match=message) as info:
        training.evaluate(str(tiny_store), str(path))
    assert str(path) in str(info.value) and len(str(info.value).splitlines()) == 1


def test_resume_with_other_model_options_is_refused_and_writes_nothing(tiny_store, trained, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("checkpoint.pt", "log.jsonl"):
        (run / name).write_bytes((trained / name).read_bytes())
    before = snapshot(run)
    wider = replace(SMALL_MODEL, n_hidden=16)
    cfg = training.TrainConfig(store=str(tiny_store), out=str(run), steps=4, resume=True, quiet=True,
                               model_config=wider)
    with pytest.raises(CheckpointError, match=r"checkpoint.pt: the checkpoint's 'model' does not fit this run's "
                                              r"Transolver \(was it written with other model options\?\)"):
        training.check_resume(cfg)
    with pytest.raises(CheckpointError, match="does not fit"):
        training.train(cfg)
    assert snapshot(run) == before
    assert training.check_resume(replace(cfg, model_config=SMALL_MODEL)) is True
    assert training.check_resume(replace(cfg, out=str(tmp_path / "empty"))) is False
