"""``meshshard plan``: capacity planning for P ranks in one process (:func:`meshshard.planning.plan`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..errors import UsageError
from ._common import METHODS, Formatter, add_command, add_model_args, model_config, positive_float, positive_int
from ._inputs import check_out_file

__all__ = ["register", "run"]


def register(subparsers: Any, formatter_class: type[argparse.HelpFormatter] = Formatter) -> None:
    """Add the ``plan`` subcommand to an ``argparse`` subparsers object."""
    p = add_command(
        subparsers, "plan", run, formatter_class,
        summary="capacity planning: per-rank points, ghosts, halo bytes and activation memory for P ranks",
        description=(
            "Partition a cloud and build every rank's halo plan in ONE process, for any number of parts, and "
            "estimate per-rank activation memory of a Transolver: plan clusters you do not have."
        ),
    )
    p.add_argument("--points", type=positive_int, default=None, help="synthetic car-surface-like cloud of N points")
    p.add_argument("--data", default=None, help="a .npy (N, 3) file or a mesh (.vtp/.vtu/.vtk/.stl/.ply/.obj; cell "
                   "centres)")
    p.add_argument("--parts", type=positive_int, required=True, help="ranks P")
    p.add_argument("--method", choices=METHODS, default="rcb", help="partitioner")
    p.add_argument("--neighbors", type=positive_int, default=32, help="size the ball radius for about k neighbours")
    p.add_argument("--radius", type=positive_float, default=None, help="ball radius (overrides --neighbors)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic cloud")
    p.add_argument("--kind", choices=("surface", "volume"), default="surface", help="synthetic cloud for --points")
    p.add_argument(
        "--sample",
        type=positive_int,
        default=1_000_000,
        help="above this many points, plan exactly on samples of this size and a quarter of it and scale the "
        "ghosts to N by a fitted (N/P)^(1-1/d) model, with an error bound",
    )
    p.add_argument("--json", default=None, help="also write the report to this JSON file")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_model_args(p)


def run(args: argparse.Namespace) -> int:
    """Check the input and output paths, plan, print the table (and write the JSON report)."""
    if (args.points is None) == (args.data is None):
        raise UsageError("meshshard plan: give exactly one of --points N or --data FILE")
    if args.data is not None and os.path.isdir(args.data):
        raise UsageError(f"meshshard plan: --data must be a file, but {args.data} is a folder")
    if args.data is not None and not os.path.isfile(args.data):
        raise UsageError(f"meshshard plan: file not found: {args.data}")
    if args.points is not None and args.parts > args.points:
        raise UsageError(f"meshshard plan: --parts {args.parts} is more than the {args.points:,} points: "
                         f"{args.parts - args.points:,} ranks would hold nothing; use --parts {args.points} or fewer")
    if args.json is not None:
        check_out_file("plan", "--json", args.json)
    from ..planning import format_plan, plan

    report = plan(
        num_points=args.points,
        data=args.data,
        parts=args.parts,
        method=args.method,
        neighbors=args.neighbors,
        radius=args.radius,
        model=model_config("plan", args),
        seed=args.seed,
        kind=args.kind,
        sample=args.sample,
        progress=None if args.quiet else _say,
    )
    print(format_plan(report))
    if args.json:
        from .._atomic import atomic_write

        atomic_write(args.json, lambda f: json.dump(report.to_dict(), f, indent=1))
    return 0


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
