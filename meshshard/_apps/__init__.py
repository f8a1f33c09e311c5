"""Applications behind the CLI: training, evaluation, demo, capacity planning, launching."""

from __future__ import annotations

__all__ = ["UsageError", "RunFailed"]


class UsageError(SystemExit):
    """A user mistake (a bad argument, a missing file): one line on stderr, exit code 2, no traceback."""

    exit_code = 2


class RunFailed(SystemExit):
    """A command that started and failed (training crashed, a run could not be processed): one line, exit 1."""

    exit_code = 1
