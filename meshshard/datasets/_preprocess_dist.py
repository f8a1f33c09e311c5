"""Rank-parallel preprocessing: every rank of a process group builds its part of the same store.

:func:`preprocess_distributed` writes the store :func:`~meshshard.datasets.preprocess` writes
(same files, same bytes in every ``.npy``, same ``run.json`` apart from statistics, which agree
to float64 rounding), but no process handles a run's whole mesh after reading it:

* **Reading**: the files are spread over the ranks; each file is read by exactly one rank (the
  runs to do, in order, go to ranks ``0, 1, ..., W - 1, 0, ...``). A run stored as one ``.vtu``
  (or as byte pieces ``.vtu.NN.part``, which only form a file together) is read whole by its
  reader: VTK XML cannot be read in cell ranges.
* **Partitioning**: :func:`meshshard.partition.repartition` on the cell centres, ``P_max`` parts
  of each divisor chain in contiguous blocks per rank; its one ``all_to_all`` carries every
  cell's fields (and float64 centre) with it. Equal to the serial partition, so the stored
  order is the single-process one.
* **Signed distance** of the volume cells: each rank for the cells it now owns.
* **Writing**: rank 0 creates each ``.npy`` at its full size; every rank writes its rows (a
  contiguous byte range) in place; rank 0 writes ``run.json`` and renames the run folder into
  place. Statistics are per rank, merged in rank order (Chan's formula).

Memory per rank after the read: ``O(N / W)`` (its cells, their fields, histograms).

Only "flat" chains are served in parallel: the curve methods, or RCB when every part count is a
power of two (the single-process store's other case, RCB nested level by level, raises a clear
error on every rank).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh

from .. import comm, faults
from .._sizes import offsets_of
from ._preprocess import (
    PreprocessOptions,
    PreprocessReport,
    check_args,
    order_key,
    read_run_info,
    run_error,
    sdf_to_stl,
    selected_kinds,
    store_config,
    stored_fields,
    with_option_keywords,
    write_meta,
)
from ._sdf import resolve_backend
from ._store import FieldStats, atomic_write_json, divisor_chains, recover_dir, replace_dir, split_runs
from .drivaerml import DrivaerML

__all__ = ["preprocess_distributed"]


def _barrier(group: ProcessGroup | None) -> None:
    comm.all_reduce_(torch.zeros(1), group)


def _first_error(error: str | None, group: ProcessGroup | None) -> str | None:
    """The first rank's error (``"[rank r] message"``) or ``None``, the same on every rank."""
    return comm.agree(error, group).first_error()


def _names(kind: str, field_names: Mapping[str, Sequence[str]]) -> list[str]:
    """Arrays of ``kind`` in the order the single-process pipeline stores them (``sdf`` comes last)."""
    if kind == "surface":
        return ["pos", "normals", "areas", *field_names["surface"]]
    return ["pos", *field_names["volume"]]


@faults.entry
@with_option_keywords
def preprocess_distributed(
    data_dir: str | os.PathLike[str],
    store_dir: str | os.PathLike[str],
    options: PreprocessOptions | None = None,
    *,
    mesh: DeviceMesh | None = None,
    **changes: Any,
) -> PreprocessReport:
    """Build the store of :func:`~meshshard.datasets.preprocess` with every rank of a process group.

    Call it on every rank (e.g. ``torchrun ... meshshard preprocess --volume``); ``options`` (or its
    fields as keywords) as for :func:`~meshshard.datasets.preprocess` (``workers`` is replaced by the ranks). Needs a
    CPU process group (gloo). See the module docstring for who reads, partitions and writes what.

    Returns the same :class:`PreprocessReport` on every rank.

    **Communication**: per run and kind, a few small collectives (errors, sizes, barriers,
    statistics) plus those of :func:`meshshard.partition.repartition` for each divisor chain.
    """
    import meshshard as ms
    from meshshard.ops.parallel_partition import repartition_with_payload

    started = time.perf_counter()
    if mesh is None:
        mesh = ms.init_mesh(backend="gloo")
    group = mesh.get_group(mesh.ndim - 1)
    rank = mesh.get_local_rank(mesh.ndim - 1)
    world = mesh.size(mesh.ndim - 1)
    opts = PreprocessOptions.of(options, changes, "preprocess_distributed")
    method, surface, volume, splits, seed = opts.method, opts.surface, opts.volume, opts.splits, opts.seed
    parts = check_args(opts.parts, method, surface, volume, 1, opts.chunk_size)
    chains = tuple(tuple(c) for c in divisor_chains(parts))
    for chain in chains:
        levels = [p for p in chain if p > 1]
        if method == "rcb" and any(p & (p - 1) for p in levels):
            raise ValueError(
                f"rank-parallel preprocessing serves RCB part counts that are powers of two, or any counts with "
                f"morton/hilbert (got parts {list(parts)} with rcb: chain {list(chain)} is partitioned level by level)"
            )
    sdf_backend = resolve_backend(opts.sdf_backend) if volume else opts.sdf_backend
    kinds = selected_kinds(surface, volume)
    source = DrivaerML(data_dir, runs=opts.runs, fields=opts.fields, surface=surface, volume=volume)
    field_names = stored_fields(source, kinds)
    config = store_config(method, chains, kinds, field_names)
    split = split_runs(source.runs, splits, seed)

    store = Path(store_dir)
    runs_dir = store / "runs"
    if rank == 0:
        runs_dir.mkdir(parents=True, exist_ok=True)
        for stale in runs_dir.glob(".tmp-run_*"):
            shutil.rmtree(stale, ignore_errors=True)
        for run in source.runs:
            recover_dir(runs_dir / f"run_{run}")
    _barrier(group)

    report = PreprocessReport(store=store)
    job = _Job(
        source, kinds, field_names, chains, method, sdf_backend, opts.chunk_size, config, mesh, group, rank, world,
        repartition_with_payload,
    )  # fmt: skip
    todo = []
    for run in source.runs:
        info = read_run_info(runs_dir / f"run_{run}")
        (report.skipped if info is not None and info.get("config") == config else todo).append(run)
    for j, run in enumerate(todo):
        tmp = runs_dir / f".tmp-run_{run}-ranks{world}"
        reader = j % world
        error, cells = _run(job, run, tmp, runs_dir, reader)
        report.record(run, error, cells)
        if error is not None and rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        _barrier(group)
    if rank == 0:
        write_meta(store, source, split, report, config, parts, chains, kinds, seed, splits, sdf_backend)
    _barrier(group)
    report.seconds = time.perf_counter() - started
    return report


@dataclass(frozen=True)
class _Job:
    """What every run of one :func:`preprocess_distributed` call shares: the source, the options, the ranks."""

    source: DrivaerML
    kinds: tuple[str, ...]
    field_names: Mapping[str, Sequence[str]]
    chains: tuple[tuple[int, ...], ...]
    method: str
    sdf_backend: str
    chunk_size: int
    config: dict[str, Any]
    mesh: DeviceMesh
    group: ProcessGroup | None
    rank: int
    world: int
    repartition_fn: Callable[..., Any]


def _run(job: _Job, run: int, tmp: Path, runs_dir: Path, reader: int) -> tuple[str | None, dict[str, int]]:
    """Process one run on every rank; returns the first rank's error (same on every rank) and cell counts."""
    cells: dict[str, int] = {}
    info: dict[str, Any] = {"run": run, "config": job.config, "kinds": {}}
    error = None
    if job.rank == 0:
        try:
            tmp.mkdir(parents=True)
        except OSError as exc:
            error = run_error(exc)
    if (error := _first_error(error, job.group)) is not None:
        return error, cells
    for kind in job.kinds:
        error, kind_info = _run_kind(job, run, kind, tmp, reader)
        if error is not None:
            return error, cells
        info["kinds"][kind] = kind_info
        cells[kind] = kind_info["num_points"]
    error = None
    if job.rank == 0:
        try:
            atomic_write_json(tmp / "run.json", info)
            replace_dir(tmp, runs_dir / f"run_{run}")
        except Exception as exc:
            error = run_error(exc)
    return _first_error(error, job.group), cells


def _run_kind(job: _Job, run: int, kind: str, tmp: Path, reader: int) -> tuple[str | None, dict[str, Any]]:
    """One kind of one run: read on ``reader``, repartition per divisor chain, write every order's rows."""
    import meshshard as ms

    names = _names(kind, job.field_names)
    # 1. The reader reads the whole file; the others hold no cells.
    error, pos64, arrays = _read_kind(job, run, kind, names, reader)
    if (error := _first_error(error, job.group)) is not None:
        return error, {}
    num_points, ndims, widths = _agree_layout(job, pos64, arrays, names, reader)
    n_local = pos64.shape[0]
    if job.rank != reader:
        arrays = {name: np.zeros((0, widths[name]) if ndims[name] == 2 else 0, np.float32) for name in names}
    sizes = [num_points if r == reader else 0 for r in range(job.world)]
    x = ms.ShardTensor.from_local(torch.from_numpy(arrays["pos"].reshape(n_local, 3)), job.mesh, sizes=sizes)
    payload = np.concatenate(
        [pos64.view(np.uint8).reshape(n_local, 24)]
        + [arrays[name].reshape(n_local, widths[name]).view(np.uint8) for name in names],
        axis=1,
    )
    del arrays
    kind_info: dict[str, Any] = {"num_points": num_points, "fields": {}, "stats": {}, "orders": {}}
    for c, chain in enumerate(job.chains):
        moved, perm, offset, chain_sizes = _chain_rows(job, x, payload, chain, num_points)
        local = _unpack(moved, names, ndims, widths)
        error = None
        try:
            if kind == "volume":
                local["sdf"] = np.ascontiguousarray(
                    sdf_to_stl(job.source.stl_path(run), local.pop("_pos64"), job.sdf_backend, job.chunk_size),
                    dtype=np.float32,
                )
            local.pop("_pos64", None)
        except Exception as exc:
            error = run_error(exc)
        if (error := _first_error(error, job.group)) is not None:
            return error, kind_info
        if c == 0:
            kind_info["fields"] = {k: list(v.shape[1:]) for k, v in local.items()}
            kind_info["stats"] = {k: _merged_stats(v, job.group).to_json() for k, v in local.items()}
        key = order_key(chain)
        error = _write_rows(tmp / kind / key, {"perm": perm, **local}, num_points, offset, job.rank, job.group)
        if error is not None:
            return error, kind_info
        kind_info["orders"][key] = {str(p): chain_sizes[p] for p in (1, *chain)}
    return None, kind_info


def _read_kind(
    job: _Job, run: int, kind: str, names: list[str], reader: int
) -> tuple[str | None, np.ndarray, dict[str, np.ndarray]]:
    """On ``reader``: the run's float64 positions and float32 arrays (or the error); elsewhere nothing."""
    arrays: dict[str, np.ndarray] = {}
    pos64 = np.zeros((0, 3))
    if job.rank != reader:
        return None, pos64, arrays
    try:
        raw = job.source.read_surface(run) if kind == "surface" else job.source.read_volume(run)
        pos64 = np.ascontiguousarray(raw["pos"], dtype=np.float64)
        arrays = {k: np.ascontiguousarray(raw[k], dtype=np.float32) for k in names}
    except Exception as exc:  # one bad run must not stop the others
        return run_error(exc), np.zeros((0, 3)), {}
    return None, pos64, arrays


def _agree_layout(
    job: _Job, pos64: np.ndarray, arrays: dict[str, np.ndarray], names: list[str], reader: int
) -> tuple[int, dict[str, int], dict[str, int]]:
    """The reader's point count and each array's ndim and width, on every rank (one all-reduce)."""
    shape = torch.zeros(1 + 2 * len(names), dtype=torch.long)
    if job.rank == reader:
        shape[0] = pos64.shape[0]
        for i, name in enumerate(names):
            shape[1 + 2 * i] = arrays[name].ndim
            shape[2 + 2 * i] = 1 if arrays[name].ndim == 1 else arrays[name].shape[1]
    shape = comm.all_reduce_(shape, job.group).tolist()
    ndims = {name: shape[1 + 2 * i] for i, name in enumerate(names)}
    widths = {name: shape[2 + 2 * i] for i, name in enumerate(names)}
    return shape[0], ndims, widths


def _chain_rows(
    job: _Job, x: Any, payload: np.ndarray, chain: tuple[int, ...], num_points: int
) -> tuple[np.ndarray, np.ndarray, int, dict[int, list[int]]]:
    """This rank's rows in the partition order of ``chain``: payload rows, original ids, global offset, sizes."""
    levels = [p for p in chain if p > 1]
    chain_sizes = {1: [num_points]}
    if not levels:  # P = 1 only: the original order, written by the reader
        return payload, np.arange(payload.shape[0], dtype=np.int64), 0, chain_sizes
    moved_payload = torch.from_numpy(payload)
    _, ids, moved, part_sizes = job.repartition_fn(x, job.method, num_parts=levels[-1], payload=moved_payload)
    for p in levels:
        k = levels[-1] // p
        chain_sizes[p] = [sum(part_sizes[i * k : (i + 1) * k]) for i in range(p)]
    return moved.numpy(), ids.to_local().numpy(), offsets_of(ids.sharding_sizes)[job.rank], chain_sizes


def _unpack(rows: np.ndarray, names: list[str], ndims: dict[str, int], widths: dict[str, int]) -> dict[str, np.ndarray]:
    """Split payload rows back into ``_pos64`` (float64) and the float32 arrays."""
    n = rows.shape[0]
    out = {"_pos64": np.ascontiguousarray(rows[:, :24]).view(np.float64).reshape(n, 3)}
    col = 24
    for name in names:
        w = 4 * widths[name]
        values = np.ascontiguousarray(rows[:, col : col + w]).view(np.float32).reshape(n, widths[name])
        out[name] = values if ndims[name] == 2 else values.reshape(n)
        col += w
    return out


def _merged_stats(values: np.ndarray, group: ProcessGroup | None) -> FieldStats:
    """Statistics of the sharded ``values``: each rank's, merged in rank order (one all_gather)."""
    mine = FieldStats.of(values)
    k = mine.mean.size
    vec = torch.from_numpy(np.concatenate([[float(mine.count)], mine.mean, mine.m2]))
    table = comm.all_gather(vec, group).numpy()
    merged = None
    for row in table:
        s = FieldStats(int(row[0]), row[1 : 1 + k].copy(), row[1 + k :].copy())
        merged = s if merged is None else merged.merge(s)
    return merged


def _write_rows(
    order_dir: Path, arrays: dict[str, np.ndarray], num_points: int, offset: int, rank: int, group: ProcessGroup | None
) -> str | None:
    """Rank 0 creates every ``.npy`` at full size; each rank writes its rows in place."""
    error = None
    if rank == 0:
        try:
            order_dir.mkdir(parents=True)
            for name, local in arrays.items():
                shape = (num_points, *local.shape[1:])
                mm = np.lib.format.open_memmap(order_dir / f"{name}.npy", mode="w+", dtype=local.dtype, shape=shape)
                del mm
        except Exception as exc:
            error = run_error(exc)
    if (error := _first_error(error, group)) is not None:
        return error
    try:
        for name, local in arrays.items():
            if local.shape[0]:
                mm = np.lib.format.open_memmap(order_dir / f"{name}.npy", mode="r+")
                mm[offset : offset + local.shape[0]] = local
                mm.flush()
                del mm
    except Exception as exc:
        error = run_error(exc)
    return _first_error(error, group)
