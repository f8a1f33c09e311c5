"""Tiny synthetic DrivaerML folders shared by the dataset tests (written once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshshard.datasets import make_synthetic_drivaerml

TINY = {"surface_cells": 2000, "volume_cells": 5000}


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three runs (surface ~2k triangles, volume ~5k tetrahedra), seed 0; treat as read-only."""
    root = tmp_path_factory.mktemp("drivaerml")
    make_synthetic_drivaerml(root, 3, seed=0, **TINY)
    return root


@pytest.fixture(scope="session")
def tiny_split_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first run of ``tiny_root`` again, with its volume split into ``.part`` pieces."""
    root = tmp_path_factory.mktemp("drivaerml_split")
    make_synthetic_drivaerml(root, 1, seed=0, split_volume=True, **TINY)
    return root


@pytest.fixture(scope="session")
def tiny_store(tiny_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tiny_root`` preprocessed for P in (1, 2, 3, 4), surface and volume, one process."""
    from meshshard.datasets import preprocess

    store = tmp_path_factory.mktemp("store")
    report = preprocess(tiny_root, store, parts=(1, 2, 3, 4), volume=True, workers=1, sdf_backend="igl", progress=False)
    assert report.ok and report.processed == [1, 2, 3]
    return store
