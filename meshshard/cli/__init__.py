"""The ``meshshard`` command: ``demo``, ``partition``, ``preprocess``, ``train``, ``evaluate``, ``plan``.

One module per subcommand (``meshshard/cli/<command>.py``, each with ``register`` and ``run``); they
parse, call the library (:mod:`meshshard.training`, :mod:`meshshard.planning`,
:mod:`meshshard.partition`, :mod:`meshshard.datasets`, :mod:`meshshard.io`) and print.

User mistakes end with a one-line message on stderr and exit code 2, never a traceback; a command
that started and failed (a crashed training, runs that could not be processed) exits with 1.

Only the standard library is imported to build the parser, so ``meshshard --help`` and every
``meshshard COMMAND --help`` answer without importing torch, VTK or numpy; each command imports
what it needs when it runs.

Exit of a ``torchrun`` rank: a rank whose command succeeded exits normally (its ``atexit`` hooks run;
:mod:`meshshard.device_mesh` destroys the process groups there, before finalization, which is what
keeps gloo's threads from aborting the process at exit). A rank that failed, once the traceback is
printed and the failure reported to the other ranks, leaves with ``os._exit``: its peers may be stuck
in a collective with it, and a normal exit would wait for its own pending collectives.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from ..errors import RunFailed, ShardingError, UnsupportedOpError, UsageError
from . import demo, evaluate, partition, plan, preprocess, train
from ._launch import under_torchrun

__all__ = ["main", "build_parser", "console_main", "UsageError", "RunFailed"]

#: The subcommands, in the order ``meshshard --help`` lists them.
COMMANDS = (demo, partition, preprocess, train, evaluate, plan)


def build_parser() -> argparse.ArgumentParser:
    """The ``meshshard`` argument parser (standard library only: building it imports nothing heavy)."""
    parser = argparse.ArgumentParser(
        prog="meshshard",
        description="Domain parallelism for point clouds and meshes: partition, preprocess, train, plan.",
        epilog="Run 'meshshard COMMAND --help' for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"meshshard {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for command in COMMANDS:
        command.register(sub)
    return parser


def _version() -> str:
    from .. import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; return its exit code.

    A user mistake prints one line on stderr and raises ``SystemExit(2)`` (as argparse does): a
    :class:`~meshshard.errors.UsageError` raised here, or a ``ValueError``/``TypeError``/``ShardingError``/
    ``UnsupportedOpError`` from the library (prefixed with ``meshshard COMMAND:``; under torchrun these
    propagate, so the excepthook reports them to the other ranks). A command that fails after
    starting (:class:`~meshshard.errors.RunFailed`) prints one line and raises ``SystemExit(1)``.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else None
    try:
        code = int(args.func(args) or 0)
    except (UsageError, RunFailed) as exc:
        _leave(str(exc), exc.exit_code)
    except _LIBRARY_ERRORS as exc:
        if _distributed():
            raise  # a rank of a torchrun job: the excepthook tells the other ranks, which may wait on this one
        _leave(f"meshshard {args.command}: {exc}", 2)
    # A rank that raised keeps its process group: the excepthook still reports it to the others.
    if _distributed():
        sys.modules["torch.distributed"].destroy_process_group()
    return code


#: What the library raises for bad input (in API terms); a command turns them into one line and exit code 2.
_LIBRARY_ERRORS = (ValueError, TypeError, ShardingError, UnsupportedOpError)


def _leave(message: str, code: int) -> NoReturn:
    """The one place the command line prints an error and exits: one line on stderr, ``SystemExit(code)``."""
    print(message, file=sys.stderr, flush=True)
    raise SystemExit(code) from None


def _distributed() -> bool:
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def console_main() -> NoReturn:
    """Entry point of the ``meshshard`` script and of ``python -m meshshard.cli`` (see the module docstring)."""
    rank = under_torchrun()
    try:
        code: Any = main()
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        if not rank:
            raise
        sys.excepthook(*sys.exc_info())  # prints the traceback; meshshard's hook also tells the other ranks
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    if rank and code != 0:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)
    sys.exit(code)
