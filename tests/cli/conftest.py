"""CLI training runs on the shared ``train_store`` (tests/conftest.py), shared by the CLI tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli._helpers import train


@pytest.fixture(scope="session")
def trajectories(train_store, tmp_path_factory) -> dict[int, Path]:
    """``meshshard train`` on 1, 2 and 3 ranks (torchrun): rank count -> output folder."""
    root = tmp_path_factory.mktemp("traj")
    out = {}
    for nproc in (1, 2, 3):
        res = train(train_store, root / f"p{nproc}", nproc)
        assert res.returncode == 0, res.stderr[-3000:]
        out[nproc] = root / f"p{nproc}"
    return out
