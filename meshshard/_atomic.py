"""Atomic file writes shared by checkpoints, stores and VTK output.

Write to a hidden temporary sibling, fsync it, rename it over the target (atomic on POSIX), then
fsync the folder. A crash at any point leaves the previous file (or none) in place, and a failed
write leaves no temporary file behind.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

__all__ = ["temp_name", "atomic_replace", "atomic_replace_all", "atomic_write"]


def temp_name(path: Path) -> Path:
    """A hidden, unique name next to ``path``."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")


def _fsync(path: Path, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_replace(path: Path, produce: Callable[[Path], Any]) -> None:
    """Run ``produce(temp_path)`` (e.g. a writer that takes a file name), then move it onto ``path``."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        produce(tmp)
        _fsync(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync(path.parent)


def atomic_replace_all(items: Iterable[tuple[Path, Callable[[Path], Any]]]) -> list[Path]:
    """Run every ``produce(temp_path)`` first, then move all the temporary files onto their paths.

    For a set of files that belong together (the pieces of one partitioned VTK file): if any
    ``produce`` raises, no target is touched and no temporary file remains. ``items`` may be a
    generator; it is consumed before the first rename. Returns the target paths in order.
    """
    written: list[tuple[Path, Path]] = []
    try:
        for path, produce in items:
            path = Path(path)
            tmp = temp_name(path)
            written.append((tmp, path))
            produce(tmp)
            _fsync(tmp)
        for tmp, path in written:
            os.replace(tmp, path)
    finally:
        for tmp, _ in written:
            tmp.unlink(missing_ok=True)
    for folder in dict.fromkeys(path.parent for _, path in written):
        _fsync(folder)
    return [path for _, path in written]


def atomic_write(path: Path, write: Callable[[IO], Any], mode: str = "w") -> None:
    """Run ``write(file)`` on a temporary file opened with ``mode``, then move it onto ``path``."""

    def produce(tmp: Path) -> None:
        with open(tmp, mode) as f:
            write(f)

    atomic_replace(path, produce)
