"""tests/conftest.py: the tests that share a CLI training, or that measure wall-clock time, run on one worker.

``make test`` runs ``pytest -n 2 --dist loadgroup``. pytest-xdist keeps a group on one worker by appending
``@group`` to the node ids; pytest 9 keeps node ids elsewhere, so with pytest-xdist 3.8 the suffix is lost
and nothing is grouped (no error: the shared CLI trainings ran once per worker, and the wall-clock tests side
by side). The dev extra pins ``pytest<9``; this test fails if grouping stops working again.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CONFTEST = '''
import pytest

from tests.conftest import pytest_collection_modifyitems  # noqa: F401 - the suite's own grouping hook


@pytest.fixture(scope="session")
def trajectories():
    return None


@pytest.fixture(scope="session")
def mgn_runs():
    return None
'''

_TESTS = '''
import os
import time

import pytest

OUT = os.environ["GROUP_PROBE_OUT"]


def _record(name):
    time.sleep(0.2)  # long enough that both workers take tests
    with open(OUT, "a") as f:
        f.write(f"{name} {os.environ['PYTEST_XDIST_WORKER']}\\n")


@pytest.mark.parametrize("i", range(3))
def test_shares_trajectories(trajectories, i):
    _record(f"cli_train/{i}")


@pytest.mark.parametrize("i", range(2))
def test_shares_mgn_runs(mgn_runs, i):
    _record(f"cli_train/mgn{i}")


@pytest.mark.parametrize("i", range(4))
def test_free(i):
    _record(f"free/{i}")
'''


def test_tests_sharing_a_cli_training_run_on_one_worker(tmp_path):
    (tmp_path / "conftest.py").write_text(_CONFTEST)
    (tmp_path / "test_probe.py").write_text(_TESTS)
    out = tmp_path / "workers.txt"
    env = {**os.environ, "GROUP_PROBE_OUT": str(out),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    runs = dict(line.split() for line in out.read_text().splitlines())
    assert len(runs) == 9, runs
    grouped = {w for name, w in runs.items() if name.startswith("cli_train/")}
    assert len(grouped) == 1, f"the tests of one xdist group ran on several workers: {sorted(runs.items())}"
    assert set(runs.values()) == {"gw0", "gw1"}, runs  # the free tests still spread
