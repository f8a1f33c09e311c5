"""Start ``N`` ranks of a meshshard command with ``torchrun`` (standalone rendezvous on this host)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

__all__ = ["under_torchrun", "torchrun"]


def under_torchrun() -> bool:
    """Whether this process is one rank of a ``torchrun`` launch."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def torchrun(
    nproc: int, argv: Sequence[str], *, env: dict[str, str] | None = None, timeout: float | None = None
) -> int:
    """Run ``python -m meshshard.cli ARGV`` on ``nproc`` ranks; return the exit code.

    Uses ``torch.distributed.run --standalone`` (a free port on localhost), so several launches
    can run side by side. Each rank gets ``OMP_NUM_THREADS=1`` unless set.
    """
    if nproc < 1:
        raise SystemExit(f"--nproc must be positive (got {nproc})")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "meshshard.cli",
        *argv,
    ]
    run_env = {**os.environ, **(env or {})}
    run_env.setdefault("OMP_NUM_THREADS", "1")
    run_env.setdefault("VTK_DEFAULT_OPENGL_WINDOW", "vtkEGLRenderWindow")
    return subprocess.run(cmd, env=run_env, timeout=timeout).returncode
