"""Fixtures shared across test folders."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def train_store(tmp_path_factory) -> Path:
    """A tiny DrivaerML-like store (3 runs, 1200 surface cells) partitioned for 1, 2 and 3 ranks.

    Built once per session and only read: the CLI training tests and both example scripts train on it.
    """
    from meshshard.datasets import make_synthetic_drivaerml, preprocess

    root = tmp_path_factory.mktemp("train_store")
    make_synthetic_drivaerml(root / "raw", 3, surface_cells=1200, volume_cells=0, seed=3)
    report = preprocess(root / "raw", root / "store", parts=(1, 2, 3), workers=1, splits=(0.6, 0.2, 0.2),
                        progress=False)
    assert report.ok
    return root / "store"
