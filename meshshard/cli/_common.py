"""What the subcommands share: argparse value types, the help formatter, model options, store checks.

Standard library only at import time (``meshshard --help`` imports no torch, numpy or VTK).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from .._checks import check_positive_int
from .._config import PARTITION_METHODS, TransolverConfig
from ..errors import UsageError

__all__ = [
    "METHODS",
    "Formatter",
    "add_model_args",
    "check_out_file",
    "check_out_folder",
    "check_parts",
    "load_store_meta",
    "model_config",
    "positive_float",
    "positive_int",
]

METHODS = PARTITION_METHODS


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (checked by :func:`meshshard._checks.check_positive_int`)."""
    try:
        return check_positive_int(int(text), "the value")
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a positive integer (got {text!r})") from None


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number (got {text!r})") from None
    if not (value > 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive number (got {text})")
    return value


class Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every option's default (``%(default)s``) unless the help text already names it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default is argparse.SUPPRESS
        if "default" in text or unset or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def add_model_args(p: argparse.ArgumentParser) -> None:
    """``--n-hidden`` ... ``--mlp-ratio``, defaulting to :class:`~meshshard.nn.TransolverConfig`'s values."""
    d = TransolverConfig()
    g = p.add_argument_group("model (Transolver)")
    g.add_argument("--n-hidden", type=positive_int, default=d.n_hidden, help="width C")
    g.add_argument("--n-layers", type=positive_int, default=d.n_layers, help="blocks L")
    g.add_argument("--n-head", type=positive_int, default=d.n_head, help="attention heads H (must divide --n-hidden)")
    g.add_argument("--slice-num", type=positive_int, default=d.slice_num, help="physics-attention slices M")
    g.add_argument("--mlp-ratio", type=positive_int, default=d.mlp_ratio, help="MLP width ratio")


def model_config(command: str, args: argparse.Namespace) -> TransolverConfig:
    """The :class:`~meshshard.nn.TransolverConfig` of the parsed model options, or a one-line usage error.

    The options are positive integers already (argparse); what is left to refuse is a width the
    heads do not divide.
    """
    if args.n_hidden % args.n_head:
        raise UsageError(
            f"meshshard {command}: --n-hidden ({args.n_hidden}) must be divisible by --n-head ({args.n_head})"
        )
    return TransolverConfig(n_hidden=args.n_hidden, n_layers=args.n_layers, n_head=args.n_head,
                            slice_num=args.slice_num, mlp_ratio=args.mlp_ratio)


def load_store_meta(command: str, store: str) -> dict[str, Any]:
    """The store's ``meta.json``, or a one-line usage error saying what is wrong with ``store``."""
    if not os.path.isdir(store):
        raise UsageError(f"meshshard {command}: store not found: {store} (write one with 'meshshard preprocess')")
    path = os.path.join(store, "meta.json")
    if not os.path.isfile(path):
        raise UsageError(f"meshshard {command}: {store} is not a store (no meta.json); run 'meshshard preprocess'")
    from ..datasets import load_meta  # the one reader: format and file names checked

    try:
        meta = load_meta(store)
        meta["order_of"]  # noqa: B018  (present in every store format)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"meshshard {command}: cannot read {path} ({type(exc).__name__}: {exc})") from None
    return meta


def check_parts(command: str, store: str, meta: dict[str, Any], ranks: int, dp: int) -> None:
    """The store must serve the per-sample part count ``ranks / dp``: checked before any rank starts."""
    if ranks % dp:
        raise UsageError(f"meshshard {command}: --dp {dp} must divide the number of ranks ({ranks})")
    parts = ranks // dp
    served = sorted(int(p) for p in meta["order_of"])
    if str(parts) not in meta["order_of"]:
        how = f"{ranks} ranks" + (f" / --dp {dp}" if dp > 1 else "")
        raise UsageError(
            f"meshshard {command}: the store {store} has no partition for P={parts} ({how}); it serves P in "
            f"{served}: preprocess again with --parts {' '.join(str(p) for p in sorted({*served, parts}))}, "
            f"or choose --nproc so that --nproc / --dp is one of {served}"
        )


def check_out_folder(command: str, out: str) -> None:
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"meshshard {command}: --out must be a folder, but {out} is a file")


def check_out_file(command: str, option: str, path: str) -> None:
    if os.path.isdir(path):
        raise UsageError(f"meshshard {command}: {option} must be a file name (got the folder {path})")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"meshshard {command}: {option}: folder {folder} does not exist")
