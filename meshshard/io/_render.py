"""Pictures of partitions: an off-screen pyvista render coloured by rank, a matplotlib quality chart."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..partition import MeshPartition, Partition
from ._data import Cells, Dataset, as_dataset, as_numpy, partition_sizes_and_perm
from ._vtk import Piece, to_vtk

__all__ = ["plot_partition_quality", "rank_colors", "render_partitions"]

# 3/4 views of a car-like body, length along x, nose towards -x, z up (DrivaerML's frame).
FRONT_VIEW = (-0.65, -1.0, 0.42)
REAR_VIEW = (0.65, 1.0, 0.42)
_MAX_LEGEND_ENTRIES = 24


def rank_colors(num_parts: int) -> np.ndarray:
    """``(num_parts, 3)`` RGB in [0, 1]: distinct categorical colours, no greys.

    The first 9 are matplotlib's tab10 without its grey, then the light tab20 shades; beyond
    that, hues spread by the golden ratio at alternating saturation/value.
    """
    if num_parts < 0:
        raise ValueError(f"num_parts must be >= 0 (got {num_parts})")
    from matplotlib import colormaps

    tab20 = np.asarray(colormaps["tab20"].colors)
    base = np.concatenate([tab20[0::2], tab20[1::2]])
    base = np.delete(base, [7, 17], axis=0)  # the two greys
    if num_parts <= len(base):
        return base[:num_parts].copy()
    from matplotlib.colors import hsv_to_rgb

    k = np.arange(num_parts - len(base))
    hsv = np.stack([(k * 0.618034) % 1.0, np.where(k % 2, 0.55, 0.85), np.where(k % 3 == 2, 0.7, 0.95)], 1)
    return np.concatenate([base, hsv_to_rgb(hsv)])


def _png_path(png_path: Any) -> Path:
    if not isinstance(png_path, str | os.PathLike):
        raise TypeError(f"png_path must be a str or os.PathLike (got {type(png_path).__name__})")
    path = Path(png_path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"png_path must end with .png (got {str(path)!r})")
    if path.parent.exists() and not path.parent.is_dir():
        raise NotADirectoryError(f"cannot write {path.name} into {str(path.parent)!r}: it is not a folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _check_window(window_size: Any) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in window_size)
    except (TypeError, ValueError):
        raise TypeError(f"window_size must be a pair of ints (got {window_size!r})") from None
    if width < 16 or height < 16:
        raise ValueError(f"window_size must be at least (16, 16) (got {(width, height)})")
    return width, height


def _set_view(plotter: Any, points: np.ndarray, direction: Sequence[float], aspect: float,
              zoom: float, margin: float) -> None:
    """Point the camera along ``-direction`` (z up) at ``points``, fitted to the viewport.

    The distance is the smallest at which every point (a sample of at most 20k) fits the view
    angle: tighter than VTK's bounding-sphere ``reset_camera`` for elongated bodies. ``margin``
    of the width is kept free on each side, for the legend.
    """
    step = max(1, len(points) // 20000)
    corners = np.asarray(points[::step], dtype=float)
    centre = (corners.min(0) + corners.max(0)) / 2
    back = np.asarray(direction, dtype=float) / np.linalg.norm(direction)
    right = np.cross(-back, (0.0, 0.0, 1.0))
    right /= np.linalg.norm(right)
    up = np.cross(right, -back)
    half = np.tan(np.radians(plotter.camera.view_angle / 2)) * zoom
    half_width = half * aspect * (1 - 2 * margin)
    for _ in range(4):  # perspective: re-centre on the projected extent, then refit
        rel = corners - centre
        x, y, depth = rel @ right, rel @ up, rel @ back
        distance = max(float(np.max(depth + np.maximum(np.abs(y) / half, np.abs(x) / half_width))), 1e-6)
        u, v = x / (distance - depth), y / (distance - depth)
        centre = centre + distance * ((u.max() + u.min()) / 2 * right + (v.max() + v.min()) / 2 * up)
    plotter.camera_position = [tuple(centre + distance * back), tuple(centre), tuple(up)]
    plotter.reset_camera_clipping_range()


def _add_legend(plotter: Any, colors: np.ndarray, view_height: float) -> None:
    """Rank legend in the top-right corner, about 22 pixels per entry."""
    labels = [[f"rank {r}", tuple(c)] for r, c in enumerate(colors)]
    legend = plotter.add_legend(labels, bcolor="white", face="rectangle")
    height = min(0.92, 22.0 * len(colors) / view_height)
    width = 0.12
    # pyvista's loc= offsets by the larger of width/height; place it ourselves.
    legend.SetPosition(1.0 - width - 0.01, 1.0 - height - 0.04)
    legend.SetPosition2(width, height)


def render_partitions(
    data: Any,
    partition: Partition | MeshPartition,
    png_path: str | os.PathLike,
    window_size: tuple[int, int] = (1200, 800),
    second_view: bool = True,
    *,
    legend: bool = True,
    title: str | None = None,
    point_size: float | None = None,
    zoom: float = 0.85,
    background: str = "white",
) -> Path:
    """Render ``data`` coloured by owning rank to a PNG, off-screen (no display needed).

    Points of a cloud (cells of a mesh) get one categorical colour per rank
    (:func:`rank_colors`), with a legend of ranks. The camera looks at a 3/4 front view of a body
    elongated along x with its nose towards -x and z up (a car in DrivaerML's frame); with
    ``second_view`` a 3/4 rear view from the other side is stacked below it.

    Parameters
    ----------
    data, partition
        As for :func:`write_partitions` (a cloud is partitioned over points, a mesh over cells).
    png_path
        Output file, ``.png``; missing folders are created.
    window_size
        ``(width, height)`` of the image in pixels.
    second_view
        Add the rear 3/4 view (each view gets half the height).
    legend
        Draw the rank legend (up to 24 ranks).
    title
        Text in the top-left corner; default ``"<METHOD>: <P> parts, <N> cells"`` (or points).
    point_size
        Point clouds: ``None`` (default) draws each point as a shaded 3-D sphere sized by the local
        point spacing, so the spheres close up into a surface and the far side does not show
        through; a number draws screen-space sprites of that many pixels instead.
    zoom
        Fraction of the view the bounding box may fill.
    background
        Background colour.

    Returns
    -------
    pathlib.Path
        ``png_path``.
    """
    os.environ.setdefault("VTK_DEFAULT_OPENGL_WINDOW", "vtkEGLRenderWindow")
    import pyvista as pv

    path = _png_path(png_path)
    width, height = _check_window(window_size)
    ds = as_dataset(data, arrays=False)
    perm, sizes = partition_sizes_and_perm(partition, ds)
    num_parts = len(sizes)
    owner = np.empty(ds.num_items, dtype=np.int64)
    owner[perm] = np.repeat(np.arange(num_parts), sizes)
    colors = rank_colors(num_parts)
    rgb = (np.round(colors[owner] * 255)).astype(np.uint8)
    sprites = ds.cells is None and point_size is not None
    if ds.cells is None and point_size is None:
        mesh = _sphere_splats(pv, np.asarray(ds.points, dtype=np.float64), rgb)
    elif ds.cells is None:
        mesh = pv.wrap(to_vtk(Piece("poly", ds.points, Cells.vertices(ds.num_items), {"rank_rgb": rgb}, {})))
    else:
        mesh = pv.wrap(to_vtk(Piece(ds.kind, ds.points, ds.cells, {}, {"rank_rgb": rgb})))

    views = [FRONT_VIEW, REAR_VIEW] if second_view else [FRONT_VIEW]
    plotter = pv.Plotter(off_screen=True, window_size=(width, height), shape=(len(views), 1), border=False)
    try:
        plotter.set_background(background)
        for row, direction in enumerate(views):
            plotter.subplot(row, 0)
            plotter.camera.view_angle = 18.0  # a longer lens: less perspective stretch of the near end
            style = {"render_points_as_spheres": True, "point_size": point_size} if sprites else {}
            plotter.add_mesh(mesh, scalars="rank_rgb", rgb=True, specular=0.0, ambient=0.25, diffuse=0.8,
                             show_scalar_bar=False, **style)
            if row == 0:
                text = title if title is not None else _default_title(partition, num_parts, ds)
                plotter.add_text(text, font_size=max(7, round(height / 66)), color="black")
                if legend and 0 < num_parts <= _MAX_LEGEND_ENTRIES:
                    _add_legend(plotter, colors, height / len(views))
            if ds.num_items:
                margin = 0.13 if legend and num_parts <= _MAX_LEGEND_ENTRIES else 0.0
                aspect = width / (height / len(views))
                _set_view(plotter, ds.points, direction, aspect, zoom, margin)
        plotter.screenshot(str(path))
    finally:
        plotter.close()
    return path


_MAX_SPLATS = 400_000  # spheres drawn for a point cloud; larger clouds are drawn from a random subset


def _sphere_splats(pv: Any, points: np.ndarray, rgb: np.ndarray) -> Any:
    """Each point as a small shaded 3-D sphere whose radius follows the local point spacing.

    Screen-space point sprites of one size leave holes where a cloud is sparse, and through the
    holes the far side shows; spheres sized by the distance to the 8th nearest neighbour close up
    into a surface with depth, so a rank's region reads as a patch of that surface. Above
    ``_MAX_SPLATS`` points a random subset is drawn (with larger spheres, as its spacing is larger).
    """
    from scipy.spatial import cKDTree

    n = len(points)
    if n > _MAX_SPLATS:
        keep = np.sort(np.random.default_rng(0).choice(n, _MAX_SPLATS, replace=False))
        points, rgb, n = points[keep], rgb[keep], _MAX_SPLATS
    if n > 1:
        dist, _ = cKDTree(points).query(points, k=min(9, n))  # 8 neighbours: also spans anisotropic rows
        radius = 0.7 * dist[:, -1]
    else:
        radius = np.ones(n)
    typical = float(np.median(radius[radius > 0])) if (radius > 0).any() else 1.0
    radius = np.clip(np.where(radius > 0, radius, typical), 0.0, 2.5 * typical)  # isolated points stay small
    cloud = pv.PolyData(points)
    cloud["radius"] = radius
    cloud["rank_rgb"] = rgb
    sphere = pv.Sphere(radius=1.0, theta_resolution=8, phi_resolution=6)
    return cloud.glyph(geom=sphere, scale="radius", orient=False, factor=1.0)


def _default_title(partition: Partition | MeshPartition, num_parts: int, ds: Dataset) -> str:
    method = (partition.cells if isinstance(partition, MeshPartition) else partition).method
    what = "points" if ds.cells is None else "cells"
    head = f"{method.upper()}: " if isinstance(method, str) and method != "manual" else ""
    return f"{head}{num_parts} parts, {ds.num_items:,} {what}"


def _per_rank(value: Any, name: str) -> np.ndarray:
    array = as_numpy(value, name).reshape(-1)
    return array.astype(np.float64)


def plot_partition_quality(
    quality: Mapping[str, Any],
    png_path: str | os.PathLike,
    sizes: Any = None,
    *,
    title: str | None = None,
) -> Path:
    """Bar chart of owned points and ghosts per rank (matplotlib, no display needed).

    Parameters
    ----------
    quality
        A dict like :func:`meshshard.partition.quality` returns: ``"ghosts"`` (per rank) and,
        when present, ``"sizes"`` (per rank), ``"imbalance"`` and ``"ghost_fraction"``.
    png_path
        Output file, ``.png``.
    sizes
        Points owned per rank, when ``quality`` has no ``"sizes"`` (e.g. ``partition.sizes``).
    title
        Figure title; default from the number of ranks and the summary numbers.

    Returns
    -------
    pathlib.Path
        ``png_path``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not isinstance(quality, Mapping):
        raise TypeError(f"quality must be a dict (got {type(quality).__name__})")
    if "ghosts" not in quality:
        raise ValueError(f"quality needs a per-rank 'ghosts' entry (found keys {sorted(quality)})")
    ghosts = _per_rank(quality["ghosts"], "quality['ghosts']")
    if sizes is None:
        sizes = next((quality[k] for k in ("sizes", "num_points", "points") if k in quality), None)
    if sizes is None:
        raise ValueError("plot_partition_quality needs sizes: pass sizes= or a quality dict with 'sizes'")
    owned = _per_rank(sizes, "sizes")
    if owned.shape != ghosts.shape:
        raise ValueError(
            f"sizes and ghosts must have one entry per rank (got {len(owned)} and {len(ghosts)})"
        )
    path = _png_path(png_path)

    num_parts = len(owned)
    ranks = np.arange(num_parts)
    fig = Figure(figsize=(max(6.0, 0.25 * num_parts + 3), 4.0), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.bar(ranks, owned, color=rank_colors(num_parts), label="owned")
    ax.bar(ranks, ghosts, bottom=owned, color="none", edgecolor="0.3", hatch="///", label="ghosts")
    ax.set_xlabel("rank")
    ax.set_ylabel("points")
    if num_parts <= 32:
        ax.set_xticks(ranks)
    ax.legend(loc="upper right")
    if title is None:
        parts = [f"{num_parts} ranks"]
        for key, fmt in (("imbalance", "imbalance {:.3f}"), ("ghost_fraction", "ghost fraction {:.1%}")):
            if key in quality:
                parts.append(fmt.format(float(quality[key])))
        title = ", ".join(parts)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    return path
