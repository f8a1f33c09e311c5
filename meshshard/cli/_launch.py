"""Start ``N`` ranks of a meshshard command with ``torchrun`` (standalone rendezvous on this host)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence

from ..errors import RunFailed

__all__ = ["under_torchrun", "torchrun", "relaunch", "ranks"]


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


def relaunch(args: argparse.Namespace) -> int | None:
    """Run this command again under torchrun on ``--nproc`` ranks, unless already a rank.

    Returns the exit code of the launch, or None when this process is to run the command itself.
    """
    if args.nproc == 1 or under_torchrun():
        return None
    argv = list(sys.argv[1:] if args.argv is None else args.argv)
    kept, skip = [], False
    for a in argv:  # torchrun's own parser would take --nproc for --nproc-per-node
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            kept.append(a)
    code = torchrun(args.nproc, kept)
    if code != 0:
        raise RunFailed(f"meshshard {args.command}: {args.nproc} ranks failed (exit code {code}); see above")
    return code


def ranks(args: argparse.Namespace) -> int:
    """Ranks this command runs on: ``--nproc``, or the torchrun world when this process is a rank."""
    return int(os.environ["WORLD_SIZE"]) if under_torchrun() else args.nproc
