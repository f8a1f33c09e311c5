"""What the subcommands share in their parsers: the command shape, argparse value types, help formatter, model options.

Standard library only at import time (``meshshard --help`` imports no torch, numpy or VTK).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from .._checks import check_positive_int
from .._config import PARTITION_METHODS, TransolverConfig
from ..errors import UsageError

__all__ = [
    "add_command",
    "METHODS",
    "Formatter",
    "add_model_args",
    "model_config",
    "positive_float",
    "positive_int",
]

METHODS = PARTITION_METHODS


def add_command(
    subparsers: Any, name: str, run: Callable[[argparse.Namespace], int],
    formatter_class: type[argparse.HelpFormatter], *, summary: str, description: str,
) -> argparse.ArgumentParser:
    """The parser of subcommand ``name``, which calls ``run(args)``: the one shape of every ``meshshard COMMAND``.

    ``summary`` is its line in ``meshshard --help``, ``description`` the text of ``meshshard name --help``.
    """
    parser = subparsers.add_parser(name, help=summary, description=description, formatter_class=formatter_class)
    parser.set_defaults(func=run)
    return parser


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
