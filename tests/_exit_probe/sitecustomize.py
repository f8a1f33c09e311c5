"""Test-only: every ``torchrun`` rank prints its native threads from its last ``atexit`` hook.

Imported at start-up (this folder first on ``PYTHONPATH``), so its hook is registered before any
other and, ``atexit`` being last-in first-out, runs after all of them: what it sees is what enters
interpreter finalization.
"""

import atexit
import os
import sys


def _report() -> None:
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    sys.stderr.write(f"EXIT-THREADS {os.environ.get('RANK', '?')} {' '.join(sorted(names))}\n")
    sys.stderr.flush()


if "LOCAL_RANK" in os.environ and os.path.isdir("/proc/self/task"):
    atexit.register(_report)
