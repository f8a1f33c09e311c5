"""Inject a crash into ``meshshard train`` from the tests (see ``sitecustomize.py`` in this folder)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["crash_env"]


def crash_env(step: int, env: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a ``meshshard train`` subprocess whose ranks all die right after ``step``.

    Parameters
    ----------
    step : int
        The last step the run completes (and logs) before every rank exits with code 17.
    env : dict, optional
        The environment to extend (default: this process's).
    """
    base = dict(os.environ if env is None else env)
    path = os.pathsep.join(p for p in (str(Path(__file__).parent), base.get("PYTHONPATH", "")) if p)
    return {**base, "PYTHONPATH": path, "MESHSHARD_TEST_CRASH_AFTER_STEP": str(step)}
