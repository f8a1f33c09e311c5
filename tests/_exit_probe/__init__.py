"""See which native threads a ``torchrun`` rank still runs at its last ``atexit`` hook (``sitecustomize.py`` here).

A gloo backend still alive at that point is destroyed during interpreter finalization, where its
threads can abort the process (SIGABRT, "terminate called without an active exception"; see
:mod:`meshshard.device_mesh`). The probe makes that precondition visible on every run, instead of
waiting for the race to be lost.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["probe_env", "exit_threads"]

GLOO_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop")


def probe_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a subprocess whose ``torchrun`` ranks print ``EXIT-THREADS rank [names]`` at exit."""
    base = dict(os.environ if env is None else env)
    path = os.pathsep.join(p for p in (str(Path(__file__).parent), base.get("PYTHONPATH", "")) if p)
    return {**base, "PYTHONPATH": path}


def exit_threads(stderr: str) -> dict[int, list[str]]:
    """``{rank: thread names}`` read from the probe's lines in ``stderr``."""
    return {int(r): names.split() for r, names in re.findall(r"^EXIT-THREADS (\d+) (.*)$", stderr, flags=re.M)}
