"""Store layout, atomic writes, rank-local row reads, nested partitions and exact-order statistics.

See :mod:`meshshard.datasets._preprocess` for the layout and why it is what it is.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._atomic import atomic_write

__all__ = [
    "STORE_FORMAT",
    "FieldStats",
    "NpyHeader",
    "atomic_write_json",
    "divisor_chains",
    "live_dir",
    "nested_partition",
    "read_npy_header",
    "read_rows",
    "recover_dir",
    "replace_dir",
    "split_runs",
]

STORE_FORMAT = "meshshard.DrivaerMLStore/1"


# ---------------------------------------------------------------------------------- files
def atomic_write_json(path: Path, obj: Any) -> None:
    """Write JSON to a temporary sibling, fsync it, then rename over ``path`` (atomic on POSIX)."""
    atomic_write(path, lambda f: json.dump(obj, f, indent=1, sort_keys=True))


def _backup_dir(final_dir: Path) -> Path:
    return final_dir.with_name(f".old-{final_dir.name}")


def replace_dir(tmp_dir: Path, final_dir: Path) -> None:
    """Move a fully written ``tmp_dir`` to ``final_dir``, replacing an old ``final_dir``.

    POSIX cannot rename a directory over a non-empty one, so an old ``final_dir`` is renamed to a
    fixed backup name (``.old-<name>``) first, then ``tmp_dir`` to ``final_dir``, then the backup
    is deleted. Each rename is atomic, so a reader sees the old or the new run, never a
    half-written one. Between the two renames ``final_dir`` is briefly missing: if the second
    rename fails the backup is put back at once, and if the process dies there instead,
    :func:`recover_dir` (called by ``preprocess``) and :func:`live_dir` (used by readers) find the
    backup, so the previous version stays readable.
    """
    recover_dir(final_dir)
    if not final_dir.exists():
        os.rename(tmp_dir, final_dir)
        return
    backup = _backup_dir(final_dir)
    shutil.rmtree(backup, ignore_errors=True)  # a stale one: final_dir is in place, so it is not needed
    os.rename(final_dir, backup)
    try:
        os.rename(tmp_dir, final_dir)
    except BaseException:
        os.rename(backup, final_dir)
        raise
    shutil.rmtree(backup, ignore_errors=True)


def recover_dir(final_dir: Path) -> None:
    """Put back the backup of ``final_dir`` left by a crash inside :func:`replace_dir`, if any."""
    backup = _backup_dir(final_dir)
    if not final_dir.exists() and backup.is_dir():
        try:
            os.rename(backup, final_dir)
        except FileNotFoundError:  # another process recovered it first
            pass


def live_dir(final_dir: Path) -> Path:
    """``final_dir``, or its backup while a crash inside :func:`replace_dir` left only the backup.

    For readers: read-only, so it is safe from many ranks at once.
    """
    if not final_dir.exists():
        backup = _backup_dir(final_dir)
        if backup.is_dir():
            return backup
    return final_dir


@dataclass(frozen=True)
class NpyHeader:
    """Where the rows of an ``.npy`` file start and how big one row is."""

    shape: tuple[int, ...]
    dtype: np.dtype
    data_offset: int

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self.shape[1:]

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize


def read_npy_header(path: Path) -> NpyHeader:
    """Parse the header of a C-ordered ``.npy`` file (no data is read)."""
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
            read_header = readers.get(version)
            if read_header is None:
                raise ValueError(f"unsupported .npy format version {version}")
            shape, fortran, dtype = read_header(f)
        except ValueError as exc:  # numpy's messages ("EOF: reading array header") do not name the file
            raise ValueError(f"{path}: corrupt .npy header ({exc})") from None
        offset = f.tell()
    if fortran:
        raise ValueError(f"{path}: Fortran-ordered arrays are not supported in a store")
    if np.dtype(dtype).hasobject:  # a pickle inside: never read
        raise ValueError(f"{path}: store arrays hold numbers (found dtype object, i.e. Python objects)")
    return NpyHeader(tuple(shape), np.dtype(dtype), offset)


#: Bytes per positioned read. Measured here on 10M x 3 float32 (115 MB) from the page cache: one
#: ``preadv`` 0.10 s, 4 MiB blocks 0.05 s, ``os.pread`` into ``bytes`` then copied 0.50 s.
_READ_BLOCK = 4 * 2**20


def _pread(fd: int, buffer: memoryview, offset: int) -> int:
    """One positioned read into ``buffer`` (the single place where store data leaves the disk; tests wrap it)."""
    return os.preadv(fd, [buffer], offset)


def read_rows(path: Path, start: int, stop: int, header: NpyHeader | None = None) -> np.ndarray:
    """Rows ``[start, stop)`` of an ``.npy`` file, reading exactly those bytes and nothing else.

    The bytes go straight from the file into the returned array (``preadv`` into an uninitialised
    buffer, in blocks of 4 MiB): no temporary ``bytes`` object, no zero-filling.

    **Shapes**: returns ``(stop - start, *row_shape)``.
    """
    header = read_npy_header(path) if header is None else header
    if not 0 <= start <= stop <= header.shape[0]:
        raise ValueError(f"rows [{start}, {stop}) out of range for {path} with {header.shape[0]} rows")
    out = np.empty((stop - start, *header.row_shape), dtype=header.dtype)
    view = memoryview(out).cast("B") if out.nbytes else memoryview(b"")
    nbytes = len(view)
    first = header.data_offset + start * header.row_bytes
    fd = os.open(path, os.O_RDONLY)
    try:
        done = 0
        while done < nbytes:  # a read may return fewer bytes than asked for
            got = _pread(fd, view[done : min(nbytes, done + _READ_BLOCK)], first + done)
            if not got:
                raise OSError(f"{path}: unexpected end of file (truncated store array?)")
            done += got
    finally:
        os.close(fd)
    return out


# ------------------------------------------------------------------------- partitions
def divisor_chains(parts: Iterable[int]) -> list[list[int]]:
    """Group part counts into chains ``P_1 | P_2 | ... | P_k`` (each divides the next).

    Every chain is stored in one point order (its nested partition), in which every ``P`` of the
    chain is a contiguous split. ``1`` joins the first chain. Greedy in ascending order.

    >>> divisor_chains([1, 2, 4, 8])
    [[1, 2, 4, 8]]
    >>> divisor_chains([2, 3, 4, 6])
    [[2, 4], [3, 6]]
    """
    chains: list[list[int]] = []
    for p in sorted(set(parts)):
        for chain in chains:
            if p % chain[-1] == 0:
                chain.append(p)
                break
        else:
            chains.append([p])
    return chains


def nested_partition(
    points: torch.Tensor, chain: Sequence[int], method: str
) -> tuple[torch.Tensor, dict[int, list[int]]]:
    """One order in which every ``P`` in ``chain`` is a contiguous split of the points.

    Two ways, same guarantee (every coarser part is the union of consecutive finer parts):

    - **flat**, one call of :func:`meshshard.partition.partition` with ``P_max = chain[-1]``,
      coarser parts merging consecutive blocks of ``P_max / P`` parts. Used for the curve methods
      (consecutive curve chunks are the coarser curve partition) and for RCB when every ``P`` is a
      power of two (RCB halves the part count at each level, so its level-``l`` nodes are the
      ``2^l`` parts of a ``2^l``-part RCB; cuts may differ by one point when ``N`` does not divide
      evenly, as RCB aims at global cumulative targets);
    - **nested**, otherwise (e.g. RCB with ``(3, 6)``): level by level, each part of ``chain[k-1]``
      is partitioned again into ``chain[k] / chain[k-1]`` parts, so coarse parts stay compact.

    **Shapes**: ``points`` (N, 3) -> ``perm`` (N,) (new order -> original index), and the sizes
    ``{P: [size_0, ..., size_{P-1}]}`` for ``P`` in ``(1, *chain)``.
    """
    from meshshard.partition import partition

    num_points = points.shape[0]
    sizes: dict[int, list[int]] = {1: [num_points]}
    levels = [p for p in chain if p > 1]
    if not levels:
        return torch.arange(num_points), sizes
    if method != "rcb" or all(p & (p - 1) == 0 for p in levels):
        part = partition(points, levels[-1], method=method)
        fine = [int(s) for s in part.sizes]
        for p in levels:
            k = levels[-1] // p
            sizes[p] = [sum(fine[i * k : (i + 1) * k]) for i in range(p)]
        return part.perm, sizes

    perm = torch.arange(num_points)
    current = [num_points]
    prev = 1
    for p in levels:
        new_perm = torch.empty_like(perm)
        new_sizes: list[int] = []
        start = 0
        for size in current:
            block = perm[start : start + size]
            part = partition(points[block], p // prev, method=method)
            new_perm[start : start + size] = block[part.perm]
            new_sizes.extend(int(s) for s in part.sizes)
            start += size
        perm, current, prev = new_perm, new_sizes, p
        sizes[p] = list(current)
    return perm, sizes


# --------------------------------------------------------------------------- splits
def split_runs(runs: Sequence[int], fractions: Sequence[float], seed: int) -> dict[str, list[int]]:
    """Split run numbers into train/val/test by a seeded shuffle (largest-remainder counts).

    A split with a positive fraction gets at least one run when there are enough runs.
    """
    names = ("train", "val", "test")
    if len(fractions) != 3:
        raise ValueError(f"splits must have 3 fractions (train, val, test) (got {len(fractions)})")
    frac = np.asarray(fractions, dtype=np.float64)
    if (frac < 0).any() or not np.isclose(frac.sum(), 1.0, atol=1e-6):
        raise ValueError(f"splits must be non-negative and sum to 1 (got {list(fractions)})")
    n = len(runs)
    raw = frac * n
    counts = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - counts), kind="stable")[: n - counts.sum()]:
        counts[i] += 1
    for i in range(3):  # give every wanted split one run, taken from the largest
        if frac[i] > 0 and counts[i] == 0 and n >= int((frac > 0).sum()):
            counts[int(np.argmax(counts))] -= 1
            counts[i] += 1
    order = np.random.default_rng(seed).permutation(sorted(runs))
    out, start = {}, 0
    for name, c in zip(names, counts):
        out[name] = sorted(int(r) for r in order[start : start + c])
        start += c
    return out


# ------------------------------------------------------------------------- statistics
@dataclass
class FieldStats:
    """Count, mean and centred sum of squares per component (float64), mergeable exactly in order.

    Merging uses Chan et al.'s pairwise update, which is order-dependent only through rounding;
    the pipeline always merges runs in run order, so the result does not depend on how runs were
    spread over worker processes, nor on which runs a resumed run skipped.
    """

    count: int
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def of(cls, values: np.ndarray) -> FieldStats:
        v = np.asarray(values, dtype=np.float64)
        v = v.reshape(len(v), int(np.prod(v.shape[1:], dtype=np.int64)))
        mean = v.mean(axis=0) if len(v) else np.zeros(v.shape[1])
        return cls(len(v), mean, ((v - mean) ** 2).sum(axis=0))

    def merge(self, other: FieldStats) -> FieldStats:
        n = self.count + other.count
        if n == 0:
            return FieldStats(0, self.mean.copy(), self.m2.copy())
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / n)
        m2 = self.m2 + other.m2 + delta**2 * (self.count * other.count / n)
        return FieldStats(n, mean, m2)

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(self.m2 / max(self.count, 1))

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean.tolist(), "m2": self.m2.tolist()}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> FieldStats:
        return cls(int(obj["count"]), np.asarray(obj["mean"], dtype=np.float64), np.asarray(obj["m2"]))
