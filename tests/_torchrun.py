"""Run a user script under torchrun, tolerating one known abort at exit.

A torchrun rank can abort (SIGABRT, "terminate called without an active exception") in gloo's C++
threads at interpreter exit on a starved machine, after the script has finished and destroyed its
process group: a PyTorch issue (pytorch/pytorch#179291), not ours. The ``meshshard`` CLI avoids it with
``os._exit``; a user's script cannot. So a run that ends that way runs once more, and a second failure
reports both runs. Any other failure fails at once.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Any


def run_script(cmd: Sequence[str], **kwargs: Any) -> tuple[subprocess.CompletedProcess, str]:
    """``subprocess.run(cmd, capture_output=True, text=True, **kwargs)``, rerun once after a SIGABRT at exit.

    Returns the (last) result and, when a rerun happened, the first run's output to show on failure.
    """
    res = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if res.returncode != 0 and "Signal 6 (SIGABRT)" in res.stderr:
        first = f"--- first run, SIGABRT\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}\n"
        return subprocess.run(cmd, capture_output=True, text=True, **kwargs), first
    return res, ""
