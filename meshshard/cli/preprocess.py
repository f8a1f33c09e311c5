"""``meshshard preprocess``: turn a DrivaerML-layout folder into a partitioned store."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ._common import METHODS, Formatter, add_command

__all__ = ["register", "run"]


def register(subparsers: Any, formatter_class: type[argparse.HelpFormatter] = Formatter) -> None:
    """Add the ``preprocess`` subcommand to an ``argparse`` subparsers object."""
    parser = add_command(
        subparsers, "preprocess", run, formatter_class,
        summary="partition DrivaerML runs into a store that ranks read slice by slice",
        description=(
            "Read every run_i of a DrivaerML-layout folder (surface boundary_i.vtp and/or volume "
            "volume_i.vtu), compute volume signed distances to drivaer_i.stl, partition the cell "
            "centres for each --parts P, and write a store (meta.json + one .npy per array, in "
            "partition order) with train-set statistics. Finished runs are skipped on a re-run; a re-run "
            "that would drop data already in the store (a kind, a part count, a field) is refused. Under torchrun "
            "(WORLD_SIZE > 1) the ranks share the work: each reads its own files, the cells are partitioned "
            "with repartition and every rank writes its rows of the store (--workers is ignored; raw DrivaerML "
            "layout only)."
        ),
    )
    parser.add_argument(
        "data_dir", metavar="DATA_DIR", help="folder holding run_<i>/ sub-folders (or curator run_<i>.zarr/.npz)"
    )
    parser.add_argument(
        "--source",
        choices=("drivaerml", "physicsnemo-curator"),
        default="drivaerml",
        help="DATA_DIR layout: raw DrivaerML VTK runs (default) or PhysicsNeMo-Curator output (Zarr or NumPy)",
    )
    parser.add_argument("store", metavar="STORE", help="output store folder (created)")
    parser.add_argument(
        "--parts", type=int, nargs="+", default=[1, 2, 4], help="part counts P to serve (at most the cells of a run)"
    )
    parser.add_argument("--method", choices=METHODS, default="rcb", help="partitioner")
    parser.add_argument("--surface", action="store_true", help="store the surface (default if no kind given)")
    parser.add_argument("--volume", action="store_true", help="store the volume (with signed distances)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--splits", type=float, nargs=3, default=[0.8, 0.1, 0.1], metavar=("TRAIN", "VAL", "TEST"),
                        help="fractions of runs for the train/val/test splits")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train/val/test split")
    parser.add_argument("--runs", type=int, nargs="+", default=None, help="run numbers (default: all)")
    parser.add_argument("--sdf-backend", choices=("auto", "igl", "warp"), default="auto",
                        help="signed-distance backend for --volume (auto: warp if installed, else libigl)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """Run the pipeline; exit code 0 when every run succeeded, 1 when some failed."""
    import warnings

    from ..datasets import preprocess

    data_dir = Path(args.data_dir)
    if not data_dir.is_dir():
        raise UsageError(f"meshshard preprocess: DATA_DIR {data_dir} is not a directory")
    surface = args.surface or not args.volume
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # under torchrun: every rank builds its part of the store
        if args.source != "drivaerml":
            raise UsageError("meshshard preprocess: under torchrun only the raw DrivaerML layout is read "
                             "rank-parallel; run --source physicsnemo-curator without torchrun")
        return _run_ranks(args, data_dir, surface)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # failures are printed below
            report = preprocess(
                data_dir,
                args.store,
                **_store_options(args, surface),
                workers=args.workers,
                progress=not args.no_progress,
                source=args.source,
            )
    except (ValueError, TypeError, FileNotFoundError) as err:
        raise UsageError(f"meshshard preprocess: {err}") from None
    cells = ", ".join(f"{n:,} {kind} cells" for kind, n in report.cells.items()) or "no new cells"
    rate = sum(report.cells.values()) / report.seconds if report.seconds > 0 else 0.0
    print(
        f"store {report.store}: {len(report.processed)} run(s) processed ({cells}, {rate:,.0f} cells/s), "
        f"{len(report.skipped)} skipped, {len(report.failed)} failed in {report.seconds:.1f} s"
    )
    for run_id, message in report.failed.items():
        print(f"  run {run_id} failed: {message}")
    return 0 if report.ok else 1


def _store_options(args: argparse.Namespace, surface: bool) -> dict:
    """What the single-process and the torchrun paths pass alike to the store writer."""
    return {
        "parts": args.parts,
        "method": args.method,
        "surface": surface,
        "volume": args.volume,
        "splits": args.splits,
        "seed": args.seed,
        "runs": args.runs,
        "sdf_backend": args.sdf_backend,
    }


def _run_ranks(args: argparse.Namespace, data_dir: Path, surface: bool) -> int:
    """``preprocess`` on every rank of a torchrun job (see ``_preprocess_dist``); rank 0 prints."""
    import torch.distributed as dist

    from ..datasets import preprocess_distributed

    try:
        report = preprocess_distributed(data_dir, args.store, **_store_options(args, surface))
    except (ValueError, TypeError, FileNotFoundError) as err:
        raise UsageError(f"meshshard preprocess: {err}") from None
    if dist.get_rank() == 0:
        cells = ", ".join(f"{n:,} {kind} cells" for kind, n in report.cells.items()) or "no new cells"
        print(
            f"store {report.store}: {len(report.processed)} run(s) processed ({cells}) on "
            f"{dist.get_world_size()} ranks, {len(report.skipped)} skipped, {len(report.failed)} failed "
            f"in {report.seconds:.1f} s"
        )
        for run_id, message in report.failed.items():
            print(f"  run {run_id} failed: {message}")
    return 0 if report.ok else 1
