"""A tiny store partitioned for 1, 2 and 3 ranks, and CLI training runs on it (shared by the CLI tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli._helpers import train


@pytest.fixture(scope="session")
def store(tmp_path_factory) -> Path:
    from meshshard.datasets import make_synthetic_drivaerml, preprocess

    root = tmp_path_factory.mktemp("cli")
    make_synthetic_drivaerml(root / "raw", 3, surface_cells=1200, volume_cells=0, seed=3)
    report = preprocess(root / "raw", root / "store", parts=(1, 2, 3), workers=1, splits=(0.6, 0.2, 0.2),
                        progress=False)
    assert report.ok
    return root / "store"


@pytest.fixture(scope="session")
def trajectories(store, tmp_path_factory) -> dict[int, Path]:
    """``meshshard train`` on 1, 2 and 3 ranks (torchrun): rank count -> output folder."""
    root = tmp_path_factory.mktemp("traj")
    out = {}
    for nproc in (1, 2, 3):
        res = train(store, root / f"p{nproc}", nproc)
        assert res.returncode == 0, res.stderr[-3000:]
        out[nproc] = root / f"p{nproc}"
    return out
