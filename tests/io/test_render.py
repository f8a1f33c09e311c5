"""Pictures: the PNG has the asked size and shows every rank's colour; the quality chart is written."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from PIL import Image

from meshshard.io import plot_partition_quality, rank_colors, render_partitions
from meshshard.partition import Partition

from .conftest import slab_partition


def _ranks_seen(png, num_parts: int, min_pixels: int = 30) -> set[int]:
    """Ranks whose colour (up to shading: same RGB direction) covers at least ``min_pixels`` pixels."""
    rgb = np.asarray(Image.open(png).convert("RGB"), dtype=np.float64).reshape(-1, 3)
    rgb = rgb[(rgb.max(1) > 40) & (rgb.max(1) - rgb.min(1) > 25)]  # drop background, greys, black text
    palette = rank_colors(num_parts)
    unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)  # noqa: E731
    cosine = unit(rgb) @ unit(palette).T
    nearest = cosine.argmax(1)
    close = cosine.max(1) > 0.997
    counts = np.bincount(nearest[close], minlength=num_parts)
    return set(np.flatnonzero(counts >= min_pixels).tolist())


def test_rank_colors_are_distinct_and_never_grey():
    for p in (1, 8, 18, 40):
        colors = rank_colors(p)
        assert colors.shape == (p, 3)
        assert len({tuple(np.round(c, 4)) for c in colors}) == p
        assert np.all(colors.max(1) - colors.min(1) > 0.05)
    with pytest.raises(ValueError, match=re.escape("num_parts must be >= 0 (got -1)")):
        rank_colors(-1)


def test_mesh_picture_has_size_and_every_rank_colour(tmp_path, car):
    part = slab_partition(np.asarray(car.cell_centers().points), 6)
    png = render_partitions(car, part, tmp_path / "pics" / "car.png", window_size=(480, 320), legend=False)
    assert png == tmp_path / "pics" / "car.png"
    assert Image.open(png).size == (480, 320)
    assert _ranks_seen(png, 6) == set(range(6))


def test_point_cloud_picture_one_view_with_legend(tmp_path):
    gen = torch.Generator().manual_seed(0)
    points = torch.randn(3000, 3, generator=gen) * torch.tensor([2.0, 0.8, 0.5])
    part = slab_partition(points.numpy(), 4)
    png = render_partitions(points, part, tmp_path / "cloud.png", window_size=(400, 300), second_view=False)
    assert Image.open(png).size == (400, 300)
    assert _ranks_seen(png, 4) == set(range(4))


def test_render_errors(tmp_path, car):
    part = Partition(perm=torch.arange(car.n_cells), sizes=torch.tensor([car.n_cells]))
    with pytest.raises(ValueError, match=re.escape("png_path must end with .png (got")):
        render_partitions(car, part, tmp_path / "car.jpg")
    with pytest.raises(ValueError, match=re.escape("window_size must be at least (16, 16) (got (8, 800))")):
        render_partitions(car, part, tmp_path / "car.png", window_size=(8, 800))
    with pytest.raises(ValueError, match=f"partition covers {car.n_cells} items but data has 10 points"):
        render_partitions(torch.zeros(10, 3), part, tmp_path / "car.png")
    with pytest.raises(TypeError, match=r"data must be an \(N, 3\) tensor/array"):
        render_partitions("car.stl", part, tmp_path / "car.png")
    assert not (tmp_path / "car.png").exists()


def test_quality_chart(tmp_path):
    quality = {"ghosts": torch.tensor([3, 5, 0]), "imbalance": 1.05, "ghost_fraction": 0.08}
    png = plot_partition_quality(quality, tmp_path / "q.png", sizes=[10, 12, 9])
    assert png.is_file() and Image.open(png).size[0] >= 600
    png = plot_partition_quality({**quality, "sizes": [10, 12, 9]}, tmp_path / "q2.png", title="rcb")
    assert png.is_file()
    with pytest.raises(ValueError, match="needs sizes"):
        plot_partition_quality(quality, tmp_path / "q3.png")
    with pytest.raises(ValueError, match=re.escape("one entry per rank (got 2 and 3)")):
        plot_partition_quality(quality, tmp_path / "q3.png", sizes=[1, 2])
    with pytest.raises(ValueError, match="per-rank 'ghosts' entry"):
        plot_partition_quality({"sizes": [1]}, tmp_path / "q3.png")
