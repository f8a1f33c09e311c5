"""``meshshard evaluate``: errors and drag of a checkpoint on a split (:func:`meshshard.training.evaluate`)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..errors import UsageError
from ._common import Formatter, add_command, positive_int
from ._inputs import check_parts, load_store_meta
from ._launch import ranks, relaunch

__all__ = ["register", "run"]


def register(subparsers: Any, formatter_class: type[argparse.HelpFormatter] = Formatter) -> None:
    """Add the ``evaluate`` subcommand to an ``argparse`` subparsers object."""
    p = add_command(
        subparsers, "evaluate", run, formatter_class,
        summary="relative L2 per field and Cd/Cl of a checkpoint on a split",
        description=(
            "Evaluate a checkpoint written by 'meshshard train' on every run of a split of the store: relative "
            "L2 error of pressure and wall shear stress, and the drag coefficient from the predicted fields, "
            "from the stored fields and from the raw data's force_mom_i.csv (when its folder is still there)."
        ),
    )
    p.add_argument("store", metavar="STORE", help="a store written by 'meshshard preprocess'")
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoint.pt written by 'meshshard train'")
    p.add_argument("--split", choices=("train", "val", "test", "all"), default="test", help="runs to evaluate")
    p.add_argument("--nproc", type=positive_int, default=1, help="ranks to launch with torchrun")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")


def _check_checkpoint(path: str) -> None:
    """Read the checkpoint weights-only (no code from the file runs) before any rank starts."""
    if not os.path.exists(path):
        raise UsageError(f"meshshard evaluate: checkpoint not found: {path}")
    if not os.path.isfile(path):
        raise UsageError(f"meshshard evaluate: CHECKPOINT must be a file (got the folder {path})")
    from ..errors import CheckpointError
    from ..training import load_checkpoint

    try:
        load_checkpoint(path)
    except CheckpointError as exc:
        raise UsageError(f"meshshard evaluate: {exc}") from None


def run(args: argparse.Namespace) -> int:
    """Check the store and the checkpoint, relaunch under torchrun if asked, evaluate and print a table."""
    meta = load_store_meta("evaluate", args.store)
    check_parts("evaluate", args.store, meta, ranks(args), 1)
    _check_checkpoint(args.checkpoint)
    code = relaunch(args)
    if code is not None:
        return code
    import torch.distributed as dist

    from ..errors import CheckpointError
    from ..training import evaluate

    try:
        summary = evaluate(args.store, args.checkpoint, split=args.split, out=args.json)
    except CheckpointError as exc:
        raise UsageError(f"meshshard evaluate: {exc}") from None
    if not dist.is_initialized() or dist.get_rank() == 0:
        if not summary["runs"]:
            print(f"the store has no runs in the {args.split!r} split")
        print(f"{'run':>5} {'points':>8} {'relL2 p':>9} {'relL2 wss':>9} {'Cd pred':>8} {'Cd true':>8} {'Cd csv':>8}")
        for r in summary["runs"]:
            csv = f"{r['Cd_csv']:.4f}" if r["Cd_csv"] is not None else "-"
            print(
                f"{r['run']:>5} {r['num_points']:>8} {r['rel_l2']['pMeanTrim']:>9.4f} "
                f"{r['rel_l2']['wallShearStressMeanTrim']:>9.4f} {r['Cd_pred']:>8.4f} {r['Cd_true']:>8.4f} {csv:>8}"
            )
    return 0
