"""examples/train_transolver_drivaerml.py on a small store, under torchrun on 2 ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_example_training_script_runs_under_torchrun(train_store):
    script = Path(__file__).resolve().parents[1] / "examples" / "train_transolver_drivaerml.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
           str(train_store), "--steps", "2"]
    res = subprocess.run(cmd, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "step    1  loss" in res.stdout and "points on rank 0" in res.stdout
