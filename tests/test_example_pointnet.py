"""examples/train_pointnet_drivaerml.py on a small store: 1 and 2 ranks print the same losses and parameters.

Three uneven ranks with an empty one are proven for the same model by tests/nn/test_pointnet.py, and reading
a store partitioned for 3 ranks by the CLI trainings of tests/cli/test_train.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def _run(store: Path, nproc: int) -> tuple[list[float], float]:
    script = Path(__file__).resolve().parents[1] / "examples" / "train_pointnet_drivaerml.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), str(script),
           str(store), "--steps", "5"]
    res = subprocess.run(cmd, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    losses = [float(v) for v in re.findall(r"loss (\S+)", res.stdout)]
    checksum = float(re.search(r"parameter checksum (\S+)", res.stdout).group(1))
    assert len(losses) == 5
    return losses, checksum


def test_pointnet_example_trains_like_one_process(train_store):
    ref, ref_sum = _run(train_store, 1)
    assert ref[-1] < ref[0]
    losses, checksum = _run(train_store, 2)
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(losses, ref)), (losses, ref)
    assert abs(checksum - ref_sum) <= 1e-5 * abs(ref_sum)
