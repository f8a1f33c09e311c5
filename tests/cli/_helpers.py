"""Shared by the CLI tests: a torchrun ``meshshard train`` launch and its log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

STEPS = 6

#: A model small enough for the tests, passed explicitly (the CLI defaults are the full-size Transolver).
SMALL_MODEL = ["--n-hidden", "16", "--n-layers", "2", "--n-head", "2", "--slice-num", "4"]


def train(store: Path, out: Path, nproc: int, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "meshshard.cli", "train", str(store), "--out", str(out), "--nproc", str(nproc),
           "--steps", str(STEPS), "--checkpoint-every", "2", *SMALL_MODEL, *extra]
    run_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=600)


def log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


class _CreatesAFile:
    """Unpickling this calls ``open(marker, "w")``: a stand-in for any code a crafted checkpoint could run."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def code_running_checkpoint(path: Path, marker: Path) -> Path:
    """A ``checkpoint.pt`` with every meshshard entry whose unpickling would create ``marker``."""
    import torch

    torch.save({"model": {}, "optimizer": {}, "scheduler": {}, "step": 2, "log": [], "rng": torch.get_rng_state(),
                "config": {"store": "s", "out": "o", "payload": _CreatesAFile(marker)}}, path)
    return path


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` and its bytes (to check that nothing was written or overwritten)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
