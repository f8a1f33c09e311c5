"""Fail at once when spawned worker processes would re-run a script's top-level code.

``multiprocessing``'s ``spawn`` start method (used by :func:`meshshard.testing.run_distributed`
and by :func:`meshshard.datasets.preprocess` with ``workers > 1``) starts each worker by importing
the main script again. A script that calls such a function at its top level, outside an
``if __name__ == "__main__":`` block, therefore makes every worker call it again while starting:
the workers die, and the caller sees only "worker process exited (exit code 1)" after a timeout,
or one warning per failed run. :func:`check_main_guard` finds the script's top-level line on the
call stack and raises one clear error before any process is started.
"""

from __future__ import annotations

import ast
import functools
import multiprocessing
import os
import sys

__all__ = ["MainGuardError", "check_main_guard"]


class MainGuardError(RuntimeError):
    """A function that spawns processes was called from a script's unguarded top-level code."""


def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(consts) == 1


@functools.lru_cache(maxsize=32)
def _guarded_lines(path: str, mtime: float) -> tuple[tuple[int, int], ...] | None:
    """Line ranges of the top-level ``if __name__ == "__main__":`` blocks of ``path`` (None: unparsable)."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None
    return tuple(
        (node.lineno, node.end_lineno or node.lineno)
        for node in tree.body
        if isinstance(node, ast.If) and _is_main_test(node.test)
    )


def check_main_guard(what: str) -> None:
    """Raise :class:`MainGuardError` if spawned workers would run the caller again.

    Two cases: this process is itself a spawned worker still importing the main script (the call
    came from that script's top level), or the main script's top-level code made this call from a
    line outside every ``if __name__ == "__main__":`` block. Interactive sessions, ``python -c``
    and calls from functions run in threads are left alone.
    """
    message = (
        f"{what} starts worker processes with 'spawn', and each worker imports the main script again: "
        "{where}. Put the call (and everything that should run once) under "
        "`if __name__ == \"__main__\":` at the bottom of the script."
    )
    if getattr(multiprocessing.process.current_process(), "_inheriting", False):
        raise MainGuardError(message.format(where="this process is such a worker, importing the script"))
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path or not os.path.isfile(path) or not path.endswith(".py"):
        return
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals is vars(main)):
        frame = frame.f_back
    if frame is None:
        return
    guarded = _guarded_lines(path, os.path.getmtime(path))
    if guarded is None:
        return
    line = frame.f_lineno
    if not any(lo <= line <= hi for lo, hi in guarded):
        raise MainGuardError(
            message.format(where=f"{path}, line {line}, calls it from top-level code outside such a block")
        )
