"""Exceptions raised by meshshard."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "CheckpointError",
    "CollectiveError",
    "DatasetError",
    "MeshReadError",
    "RunFailed",
    "ShardingError",
    "UnsupportedOpError",
    "UsageError",
]


class ShardingError(RuntimeError):
    """Ranks disagree, or two operands are sharded incompatibly (different sizes, dims or meshes)."""


class CollectiveError(ShardingError):
    """A collective failed on this rank because another rank raised, died or is stuck.

    The message names this rank, the collective and where it was issued, and the rank(s) that
    failed first with their exception (see :mod:`meshshard.faults`).

    Attributes
    ----------
    rank:
        This process's global rank.
    op:
        The collective that failed (``all_reduce``, ``all_to_all``, ``all_gather``).
    culprits:
        Global ranks that reported a failure, or, when none did, the ranks that did not answer.
    """

    def __init__(self, message: str, *, rank: int = -1, op: str = "", culprits: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.rank = rank
        self.op = op
        self.culprits = tuple(culprits)


class UnsupportedOpError(NotImplementedError):
    """An op was applied to a ShardTensor for which meshshard has no sharding rule."""


class DatasetError(ValueError):
    """A data file is corrupt, lacks a field, or holds arrays of the wrong length or shape."""


class CheckpointError(ValueError):
    """A file is not a meshshard checkpoint: not a weights-only torch file (it would need to run code
    to load), missing entries, entries of unexpected types, or weights that do not fit the model."""


class MeshReadError(ValueError):
    """A mesh file is not readable (wrong format, truncated) or holds no points."""


class UsageError(ValueError):
    """A mistake in a ``meshshard`` command line (a bad option, a missing file), raised by :mod:`meshshard.cli` only.

    The library never raises it (it raises ``ValueError``/``TypeError`` and the classes above, in API
    terms); the command prints the message as one line on stderr and exits with :attr:`exit_code`.
    It is an ``Exception``, never a ``SystemExit``: ``except Exception`` catches it.
    """

    exit_code = 2


class RunFailed(RuntimeError):
    """A command that started and failed (training crashed, a run could not be processed), raised by
    :mod:`meshshard.cli` only: one line on stderr, exit code 1."""

    exit_code = 1
