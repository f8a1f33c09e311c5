"""Fixtures shared across test folders, and how ``make test`` spreads the suite over pytest-xdist workers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Under several xdist workers each worker (and every process it starts: ranks, torchrun jobs, README blocks)
# uses one intra-op thread: two workers with two threads each on two cores fight over them, which made a
# sample of the suite (tests/nn/test_transolver.py, tests/ops/test_neighbors.py, tests/partition) take
# 104-128 s instead of 79-86 s. One process alone (``TEST_WORKERS=0``) keeps torch's default.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# ``make test`` runs ``pytest -n 2 --dist loadgroup``: tests go to whichever worker is free, except that the
# tests of one group below run on one worker, one after the other.
#: tests that share an expensive session or module fixture: built once, on the group's worker
FIXTURE_GROUPS = {
    "trajectories": "cli_train",  # three torchrun trainings (tests/cli/conftest.py)
    "mgn_runs": "cli_train",  # two more (tests/cli/test_train.py)
}
#: tests whose verdict depends on wall-clock limits or on the load they create: never two of them at once
WALL_CLOCK_GROUP = "wall_clock"
WALL_CLOCK = (
    "tests/test_first_hour.py::test_two_rank_training_survives_a_loaded_machine",  # starts one busy loop per core
    "tests/tools/test_gpu_check.py::test_a_failing_hanging_or_dying_check_is_recorded_and_the_others_run",
)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist turns the markers into scheduling groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = next((g for name, g in FIXTURE_GROUPS.items() if name in item.fixturenames), None)
        if item.nodeid.split("[")[0] in WALL_CLOCK:
            group = WALL_CLOCK_GROUP
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def train_store(tmp_path_factory) -> Path:
    """A tiny DrivaerML-like store (3 runs, 1200 surface cells) partitioned for 1, 2 and 3 ranks.

    Built once per session (once per xdist worker) and only read: the CLI training tests and both example
    scripts train on it.
    """
    from meshshard.datasets import make_synthetic_drivaerml, preprocess

    root = tmp_path_factory.mktemp("train_store")
    make_synthetic_drivaerml(root / "raw", 3, surface_cells=1200, volume_cells=0, seed=3)
    report = preprocess(root / "raw", root / "store", parts=(1, 2, 3), workers=1, splits=(0.6, 0.2, 0.2),
                        progress=False)
    assert report.ok
    return root / "store"
