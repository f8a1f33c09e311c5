"""``meshshard partition``: partition a point cloud or mesh file and print its quality."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["register", "run"]

MESH_SUFFIXES = (".vtp", ".vtu", ".stl", ".vtk", ".ply", ".obj")


def register(subparsers: Any) -> None:
    """Add the ``partition`` subcommand to an ``argparse`` subparsers object."""
    parser = subparsers.add_parser(
        "partition",
        help="partition a point cloud (.npy) or mesh (.vtp/.vtu/.stl) and print its quality",
        description=(
            "Partition a point cloud (.npy of shape (N, 3) or (N, 2)) or the cells of a mesh "
            "(.vtp, .vtu, .stl, by cell centroid) into parts, and print per-part sizes and ghost counts."
        ),
    )
    parser.add_argument("input", metavar="INPUT", help="a .npy point array or a .vtp/.vtu/.stl mesh")
    parser.add_argument("--parts", type=int, default=8, help="number of parts (default 8)")
    parser.add_argument(
        "--method", choices=("rcb", "morton", "hilbert"), default="rcb", help="partitioner (default rcb)"
    )
    parser.add_argument("--fractions", default=None, help="comma-separated target share of each part, summing to 1")
    parser.add_argument(
        "--ghost-radius",
        type=float,
        default=None,
        help="radius for ghost counts (default: the radius holding about 32 neighbours)",
    )
    parser.add_argument("--out", default=None, help="folder for partition.pt and the VTK pieces")
    parser.add_argument("--png", default=None, help="render the parts to this PNG file")
    parser.set_defaults(func=run)


def _fail(message: str) -> SystemExit:
    return SystemExit(f"meshshard partition: {message}")


def _load(path: Path) -> tuple[Any, str]:
    """``(data, kind)``: a float array of points (``"cloud"``) or a pyvista mesh (``"mesh"``)."""
    if not path.is_file():
        raise _fail(f"input file not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        try:
            points = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise _fail(f"cannot read {path} as a .npy array ({exc})") from None
        if points.ndim != 2 or points.shape[1] not in (2, 3) or points.dtype.kind not in "fiu":
            raise _fail(f"{path} must hold an (N, 3) or (N, 2) numeric array (got {points.dtype} {points.shape})")
        return points, "cloud"
    if suffix in MESH_SUFFIXES:
        import pyvista as pv

        try:
            return pv.read(str(path)), "mesh"
        except Exception as exc:  # VTK readers raise many types
            raise _fail(f"cannot read {path} ({type(exc).__name__}: {exc})") from None
    raise _fail(f"INPUT must end with .npy, {', '.join(MESH_SUFFIXES)} (got {path.name!r})")


def _fractions(text: str | None, parts: int) -> list[float] | None:
    if text is None:
        return None
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise _fail(f"--fractions must be comma-separated numbers (got {text!r})") from None
    if len(values) != parts:
        raise _fail(f"--fractions needs {parts} values, one per part (got {len(values)})")
    return values


def format_quality(q: dict[str, Any]) -> str:
    """A per-part table of a :func:`~meshshard.partition.quality` result, and a summary line."""
    sizes = q["sizes"]
    total = max(q["num_points"], 1)
    ghosts = q["ghosts"]
    lines = []
    header = f"{'part':>5} {'size':>12} {'share':>8}"
    if ghosts is not None:
        header += f" {'ghosts':>10} {'ghost/owned':>12} {'neighbours':>11}"
    lines.append(header)
    for r, size in enumerate(sizes):
        row = f"{r:>5} {size:>12,} {100 * size / total:>7.2f}%"
        if ghosts is not None:
            g = int(ghosts[r])
            ratio = f"{g / size:.3f}" if size else "-"
            row += f" {g:>10,} {ratio:>12} {int(q['neighbor_parts'][r]):>11}"
        lines.append(row)
    summary = f"imbalance {q['imbalance']:.4f}"
    if ghosts is not None:
        summary += (
            f"   ghost fraction {q['ghost_fraction']:.4f}   max ghost/owned {q['max_ghost_fraction']:.4f}"
            f"   max neighbours {q['max_neighbor_parts']}"
            f"   (surface-to-volume estimate {q['surface_to_volume_estimate']:.4f})"
        )
    lines.append(summary)
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run ``meshshard partition`` with parsed arguments; returns the exit code."""
    from . import neighbor_radius, partition, partition_mesh, quality

    path = Path(args.input)
    data, kind = _load(path)
    if args.parts < 1:
        raise _fail(f"--parts must be at least 1 (got {args.parts})")
    if args.ghost_radius is not None and not args.ghost_radius > 0:
        raise _fail(f"--ghost-radius must be positive (got {args.ghost_radius})")
    fractions = _fractions(args.fractions, args.parts)

    start = time.perf_counter()
    try:
        if kind == "cloud":
            part = partition(data, args.parts, method=args.method, fractions=fractions)
            points, what = data, "points"
        else:
            mesh_part = partition_mesh(data, args.parts, method=args.method, fractions=fractions)
            part, points, what = mesh_part.cells, mesh_part.centroids, "cells"
    except ValueError as exc:
        raise _fail(str(exc)) from None
    elapsed = time.perf_counter() - start

    num = part.num_points
    print(f"{path.name}: {num:,} {what} into {args.parts} parts with {args.method} in {elapsed:.3f} s")
    radius = args.ghost_radius
    if radius is None and num > 32:
        radius = neighbor_radius(points, 32)
        print(f"ghost radius {radius:.6g} (about 32 neighbours; set --ghost-radius to change)")
    elif radius is not None:
        print(f"ghost radius {radius:.6g}")
    print(format_quality(quality(points, part, radius=radius)))

    if args.out is not None:
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise _fail(f"--out must be a folder (got the file {out})")
        out.mkdir(parents=True, exist_ok=True)
        part.save(out / "partition.pt")
        print(f"wrote {out / 'partition.pt'}")
        io = _io()
        if io is None or not hasattr(io, "write_partitions"):
            print("VTK output: meshshard.io.write_partitions is not available yet")
        else:
            index = io.write_partitions(data, part, out, ghost_radius=args.ghost_radius)
            print(f"wrote {index}")
    if args.png is not None:
        io = _io()
        if io is None or not hasattr(io, "render_partitions"):
            print("PNG output: meshshard.io.render_partitions is not available yet")
        else:
            print(f"wrote {io.render_partitions(data, part, args.png)}")
    return 0


def _io() -> Any:
    try:
        from meshshard import io
    except ImportError:
        return None
    return io
