"""``meshshard partition``: partition a point cloud or mesh file and print its quality."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ._common import METHODS, Formatter, add_command

__all__ = ["register", "run", "format_quality"]

#: Mesh formats read with pyvista (as in :data:`meshshard.io._read.MESH_SUFFIXES`; not imported here,
#: so that building the parser imports nothing heavy).
MESH_SUFFIXES = (".vtp", ".vtu", ".vtk", ".stl", ".ply", ".obj")
FORMATS = "a .npy point array (N, 3) or (N, 2), or a mesh: " + ", ".join(MESH_SUFFIXES)
#: above this many parts the per-part table shows the first and last rows only
_TABLE_ROWS = 32


def register(subparsers: Any, formatter_class: type[argparse.HelpFormatter] = Formatter) -> None:
    """Add the ``partition`` subcommand to an ``argparse`` subparsers object."""
    parser = add_command(
        subparsers, "partition", run, formatter_class,
        summary="partition a point cloud (.npy) or mesh (.vtp/.vtu/.vtk/.stl/.ply/.obj) and print its quality",
        description=(
            f"Partition {FORMATS} (a mesh by cell centroid) into parts, print per-part sizes and ghost counts, "
            "and optionally write partition.pt, ParaView files (one piece per part with ghosts marked by "
            "vtkGhostType, and FieldData naming the method, parts, ghost radius, imbalance and version) and a PNG."
        ),
    )
    parser.add_argument("input", metavar="INPUT", help=FORMATS)
    parser.add_argument("--parts", type=int, default=8, help="number of parts (at most the number of points/cells)")
    parser.add_argument("--method", choices=METHODS, default="rcb", help="partitioner")
    parser.add_argument("--fractions", default=None, help="comma-separated target share of each part, summing to 1")
    parser.add_argument(
        "--ghost-radius",
        type=float,
        default=None,
        help="radius for ghost counts and written ghosts (default: the radius holding about 32 neighbours)",
    )
    parser.add_argument("--no-ghosts", action="store_true", help="do not write ghost points/cells into --out")
    parser.add_argument("--out", default=None, help="folder for partition.pt and the VTK pieces (partitions.pvtp)")
    parser.add_argument("--png", default=None, help="render the parts to this PNG file")


def _fail(message: str) -> UsageError:
    return UsageError(f"meshshard partition: {message}")


def _load(path: Path) -> tuple[Any, str, int]:
    """``(data, kind, n)``: a float array of points (``"cloud"``) or a pyvista mesh (``"mesh"``), and its size."""
    if path.is_dir():
        raise _fail(f"INPUT must be a file, but {path} is a folder (expected {FORMATS})")
    if not path.is_file():
        raise _fail(f"input file not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        from ..io import MeshReadError, read_points

        try:
            points = read_points(path)
        except MeshReadError as exc:
            raise _fail(str(exc)) from None
        return points, "cloud", len(points)
    if suffix in MESH_SUFFIXES:
        from ..io import MeshReadError, read_mesh

        try:
            mesh = read_mesh(path)
        except MeshReadError as exc:
            raise _fail(str(exc)) from None
        if mesh.n_cells == 0:
            raise _fail(f"{path} holds {mesh.n_points} points but no cells")
        return mesh, "mesh", mesh.n_cells
    raise _fail(f"INPUT must be {FORMATS} (got {path.name!r})")


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
    rows = list(range(len(sizes)))
    if len(rows) > _TABLE_ROWS:
        half = _TABLE_ROWS // 4
        rows = rows[:half] + [-1] + rows[-half:]
    for r in rows:
        if r < 0:
            hidden = len(sizes) - 2 * half
            lines.append(f"{'...':>5} ({hidden:,} parts not shown; sizes and ghosts are summarised below)")
            continue
        size = sizes[r]
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
    """Run ``meshshard partition`` with parsed arguments; returns the exit code.

    Every check (input readable and not empty, parts, radius, output paths) runs before anything is
    written, so a mistake leaves nothing on disk.
    """
    from .._checks import check_positive_int

    try:
        check_positive_int(args.parts, "--parts")
    except (TypeError, ValueError) as exc:
        raise _fail(str(exc)) from None
    if args.ghost_radius is not None and not (0 < args.ghost_radius < float("inf")):
        raise _fail(f"--ghost-radius must be positive (got {args.ghost_radius})")
    out = Path(args.out) if args.out is not None else None
    if out is not None and out.exists() and not out.is_dir():
        raise _fail(f"--out must be a folder (got the file {out})")
    if args.png is not None:
        if not args.png.lower().endswith(".png"):
            raise _fail(f"--png must name a .png file (got {args.png!r})")
        if Path(args.png).is_dir():
            raise _fail(f"--png must name a file (got the folder {args.png})")
    path = Path(args.input)
    data, kind, num = _load(path)
    what = "points" if kind == "cloud" else "cells"
    if args.parts > num:
        raise _fail(
            f"--parts {args.parts} is more than the {num:,} {what} of {path.name}: "
            f"{args.parts - num:,} parts would be empty; use --parts {num} or fewer"
        )
    fractions = _fractions(args.fractions, args.parts)

    from ..partition import neighbor_radius, partition, partition_mesh, quality

    start = time.perf_counter()
    try:
        if kind == "cloud":
            part = partition(data, args.parts, method=args.method, fractions=fractions)
            points = data
        else:
            mesh_part = partition_mesh(data, args.parts, method=args.method, fractions=fractions)
            part, points = mesh_part.cells, mesh_part.centroids
    except ValueError as exc:
        raise _fail(str(exc)) from None
    elapsed = time.perf_counter() - start

    print(f"{path.name}: {num:,} {what} into {args.parts} parts with {args.method} in {elapsed:.3f} s")
    radius = args.ghost_radius
    if radius is None and num > 1:
        k = min(32, num - 1)
        radius = neighbor_radius(points, k)
        print(f"ghost radius {radius:.6g} (about {k} neighbours; set --ghost-radius to change)")
    elif radius is not None:
        print(f"ghost radius {radius:.6g}")
    q = quality(points, part, radius=radius)
    print(format_quality(q))

    if out is not None:
        from ..io import write_partitions

        out.mkdir(parents=True, exist_ok=True)
        part.save(out / "partition.pt")
        print(f"wrote {out / 'partition.pt'}")
        ghosts = None if args.no_ghosts else radius
        index = write_partitions(
            data, part, out, ghost_radius=ghosts, field_data={"source": path.name, "imbalance": float(q["imbalance"])}
        )
        note = "no ghosts" if ghosts is None else f"ghosts within {ghosts:.6g} marked by vtkGhostType"
        print(f"wrote {index} ({note}; in Python: meshshard.io.read_partitions({str(index)!r}), or "
              f"pyvista.read({str(index.with_suffix('.vtpd'))!r}))")
    if args.png is not None:
        from ..io import render_partitions

        print(f"wrote {render_partitions(data, part, args.png)}")
    return 0
