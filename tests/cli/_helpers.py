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
