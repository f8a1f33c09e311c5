"""Preprocess DrivaerML runs into a partitioned store that every rank can slice without talking.

Store layout
------------
::

    STORE/
      meta.json                        format, config, field shapes/units, train statistics,
                                       splits, per-run sizes of every P, failures
      runs/run_<i>/
        run.json                       written last: config, sizes, per-run statistics (count,
                                       mean, centred sum of squares per component)
        surface/p<Pmax>/perm.npy       int64 (N,): stored row -> original VTK cell id
        surface/p<Pmax>/<name>.npy     float32 (N,) or (N, k): pos, normals, areas, pMeanTrim, ...
        volume/p<Pmax>/...             pos, sdf, UMeanTrim, pMeanTrim, nutMeanTrim, perm

Why this layout
~~~~~~~~~~~~~~~
- **One ``.npy`` per array** (not zarr): the format is a fixed header then C-ordered rows, so
  rank ``r``'s shard ``[offset_r, offset_r + size_r)`` is one contiguous byte range that one
  ``pread`` fetches (or ``np.load(mmap_mode="r")`` maps); no chunk grid to align with the
  uneven part sizes, no compression codec to decode whole chunks. Arrays are stored raw.
  Measured against Zarr v3 stores (raw, zstd, lz4, zstd + sharding; ``benchmarks/bench_store.py``,
  README): reads 1.3-6.5x faster per rank on a 10M-cell volume and 19-48x on small surface runs,
  writes 4-11x faster; zstd saves 45% of the disk on smooth synthetic fields.
- **Nested partitions, one order per divisor chain.** Points are stored in an order in which
  every requested ``P`` is a contiguous split: ``parts`` is grouped into chains
  ``P_1 | P_2 | ... | P_k`` (:func:`~meshshard.datasets._store.divisor_chains`), and each part
  of ``P_{j-1}`` is partitioned again into ``P_j / P_{j-1}`` parts. So ``parts=(1, 2, 4, 8)``
  stores the data **once** (in ``p8/``) and a rank of a 2-rank job reads the union of two
  consecutive 8-way parts. Part counts that do not divide each other (e.g. 3 and 4) get one
  copy per chain: a different ``P`` with a different geometric split needs a different order
  to stay contiguous, and the alternative (one copy, a permutation per ``P``) turns every
  rank's read into a gather of scattered rows.
- **A run folder is the unit of atomicity**: a worker writes ``runs/.tmp-run_<i>-<uuid>/``
  completely (``run.json`` last) and renames it into place; a crash leaves only a temporary
  folder (removed on the next run), never a half-written run. A re-run skips every run whose
  ``run.json`` has the same configuration; ``meta.json`` is rewritten atomically at the end.
- **Statistics** are computed per run by the worker (count, mean and centred sum of squares in
  float64 of the stored float32 values) and merged in run order over the *training* runs with
  Chan's pairwise formula: the result does not depend on the number of workers or on which
  runs a resumed job skipped, and equals a single pass over all training data to rounding.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import multiprocessing
import os
import re
import shutil
import time
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._checks import check_choice, check_int_sequence, check_positive_int
from .._config import PARTITION_METHODS
from ..errors import DatasetError
from ._curator import CuratorDrivaerML
from ._sdf import resolve_backend, signed_distance
from ._store import (
    STORE_FORMAT,
    FieldStats,
    atomic_write_json,
    divisor_chains,
    nested_partition,
    recover_dir,
    replace_dir,
    split_runs,
)
from .drivaerml import FIELD_UNITS, DrivaerML

__all__ = ["preprocess", "PreprocessOptions", "PreprocessReport", "load_meta", "SOURCES"]

_METHODS = PARTITION_METHODS
#: Input layouts :func:`preprocess` reads.
SOURCES = ("drivaerml", "physicsnemo-curator")


@dataclass(frozen=True)
class PreprocessOptions:
    """What goes into a store: the options :func:`preprocess` and :func:`preprocess_distributed` share.

    Pass one as ``options=``, or its fields as keywords (``preprocess(src, out, parts=(1, 2), volume=True)``);
    keywords override the fields of ``options``. The fields are described in :func:`preprocess`.

    >>> PreprocessOptions(parts=(1, 2)).replace(volume=True).volume
    True
    """

    parts: Sequence[int] | int = (1, 2, 4)
    method: str = "rcb"
    surface: bool = True
    volume: bool = False
    splits: Sequence[float] = (0.8, 0.1, 0.1)
    seed: int = 0
    runs: Sequence[int] | None = None
    fields: Sequence[str] | Mapping[str, Sequence[str]] | None = None
    sdf_backend: str = "auto"
    chunk_size: int = 1_000_000

    def replace(self, *, where: str = "PreprocessOptions", **changes: Any) -> PreprocessOptions:
        """A copy with ``changes`` (field names), or a ``TypeError`` naming the unknown keywords and ``where``."""
        names = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(changes) - set(names))
        if unknown:
            raise TypeError(f"{where}: unknown keyword argument(s) {unknown} (the store options are {names})")
        return dataclasses.replace(self, **changes)

    @classmethod
    def of(cls, options: PreprocessOptions | None, changes: Mapping[str, Any], where: str) -> PreprocessOptions:
        """``options`` (default: the defaults) with ``changes``: how both entry points read their arguments."""
        if options is None:
            options = cls()
        elif not isinstance(options, cls):
            raise TypeError(f"{where}: options must be a PreprocessOptions (got {type(options).__name__})")
        return options.replace(where=where, **changes)


def with_option_keywords(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Show the :class:`PreprocessOptions` fields as keyword parameters of ``fn`` (its ``**options``) in help()."""
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    params += [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
        for f in dataclasses.fields(PreprocessOptions)
    ]
    fn.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    return fn


@dataclass
class PreprocessReport:
    """What one call of :func:`preprocess` did."""

    store: Path
    processed: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    seconds: float = 0.0
    cells: dict[str, int] = field(default_factory=dict)  # cells processed now, per kind

    @property
    def ok(self) -> bool:
        return not self.failed

    def record(self, run: int, error: str | None, cells: Mapping[str, int]) -> None:
        """Count ``run`` as processed (adding its cells per kind), or as failed with ``error``."""
        if error is not None:
            self.failed[run] = error
            return
        self.processed.append(run)
        for kind, n in cells.items():
            self.cells[kind] = self.cells.get(kind, 0) + n


@dataclass(frozen=True)
class _Task:
    data_dir: str
    store_dir: str
    run: int
    kinds: tuple[str, ...]
    fields: dict[str, tuple[str, ...]]
    chains: tuple[tuple[int, ...], ...]
    method: str
    sdf_backend: str
    chunk_size: int
    config: dict[str, Any]
    source: str = "drivaerml"
    variables: dict[str, Any] | None = None  # the curator's variable config (source="physicsnemo-curator")


def load_meta(store: str | os.PathLike[str]) -> dict[str, Any]:
    """Read ``meta.json`` of a store, checking its format."""
    path = Path(store) / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(f"store: {path} not found (run meshshard preprocess first)")
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"store: {path} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"store: {path} is not a {STORE_FORMAT} store (got a JSON {type(meta).__name__})")
    if meta.get("format") != STORE_FORMAT:
        raise ValueError(f"store: {path} is not a {STORE_FORMAT} store (format {meta.get('format')!r})")
    _check_file_names(meta, path)
    return meta


#: A name the metadata gives to a file or folder inside the store: no separator, not ``.``/``..``.
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*\Z")


def _check_file_names(meta: dict[str, Any], path: Path) -> None:
    """The metadata entries that become paths (runs, kinds, field names, point orders) stay inside the store.

    Readers build ``runs/run_<run>/<kind>/<order>/<field>.npy`` from them, so each must be a
    plain name (and a run an int): a crafted ``meta.json`` cannot make a reader open files
    outside the store.
    """
    names: list[tuple[str, Any]] = [("kinds", k) for k in meta.get("kinds") or []]
    fields_of = meta.get("fields") or {}
    names += [("fields", k) for k in fields_of]
    names += [(f"fields[{k!r}]", f) for k, fs in fields_of.items() if isinstance(fs, Mapping | list) for f in fs]
    order_of = meta.get("order_of") or {}
    names += [("order_of", v) for v in (order_of.values() if isinstance(order_of, Mapping) else [order_of])]
    bad = [(where, n) for where, n in names if not isinstance(n, str) or not _FILE_NAME.match(n)]
    splits = meta.get("splits") or {}
    for split, runs in splits.items() if isinstance(splits, Mapping) else [("splits", splits)]:
        for run in runs if isinstance(runs, list) else [runs]:
            if isinstance(run, bool) or not isinstance(run, int) or run < 0:
                bad.append((f"splits[{split!r}]", run))
    if bad:
        where, name = bad[0]
        raise DatasetError(
            f"store: {path}: {where} holds {name!r}, which is not a plain file name (expected letters, digits, "
            "'_', '.', '+', '-'; runs as non-negative ints): store paths cannot point outside the store"
        )


def order_key(chain: Sequence[int]) -> str:
    return f"p{chain[-1]}"


def _process_run(task: _Task) -> tuple[int, str | None, dict[str, int]]:
    """Read, measure, partition and write one run; never raises (errors are returned)."""
    runs_dir = Path(task.store_dir) / "runs"
    tmp = runs_dir / f".tmp-run_{task.run}-{uuid.uuid4().hex}"
    cells: dict[str, int] = {}
    try:
        tmp.mkdir(parents=True)
        ds = _open_source(
            task.source,
            task.data_dir,
            runs=[task.run],
            fields=task.fields if task.variables is None else task.variables,
            surface="surface" in task.kinds,
            volume="volume" in task.kinds,
        )
        info: dict[str, Any] = {"run": task.run, "config": task.config, "kinds": {}}
        for kind in task.kinds:
            raw = ds.read_surface(task.run) if kind == "surface" else ds.read_volume(task.run)
            if kind == "volume":
                raw["sdf"] = _volume_sdf(ds, task.run, raw["pos"], task.sdf_backend, task.chunk_size)
            arrays = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in raw.items()}
            num_points = len(arrays["pos"])
            cells[kind] = num_points
            kind_info: dict[str, Any] = {
                "num_points": num_points,
                "fields": {k: list(v.shape[1:]) for k, v in arrays.items()},
                "stats": {k: FieldStats.of(v).to_json() for k, v in arrays.items()},
                "orders": {},
            }
            most = max(chain[-1] for chain in task.chains)
            if most > num_points:
                raise ValueError(
                    f"the {kind} has {num_points:,} cells, fewer than the P={most} parts asked for: every part "
                    f"needs at least one cell (use parts of at most {num_points:,})"
                )
            pos = torch.from_numpy(arrays["pos"])
            for chain in task.chains:
                perm, sizes = nested_partition(pos, chain, task.method)
                order_dir = tmp / kind / order_key(chain)
                order_dir.mkdir(parents=True)
                perm_np = perm.numpy()
                np.save(order_dir / "perm.npy", perm_np)
                for name, values in arrays.items():
                    np.save(order_dir / f"{name}.npy", values[perm_np])
                kind_info["orders"][order_key(chain)] = {str(p): sizes[p] for p in (1, *chain)}
            info["kinds"][kind] = kind_info
        atomic_write_json(tmp / "run.json", info)
        replace_dir(tmp, runs_dir / f"run_{task.run}")
        return task.run, None, cells
    except Exception as err:  # one bad run must not stop the others
        shutil.rmtree(tmp, ignore_errors=True)
        return task.run, run_error(err), {}


def run_error(exc: BaseException) -> str:
    """How a failed run's error is reported and stored: ``"<ExceptionType>: <message>"``."""
    return f"{type(exc).__name__}: {exc}"


def _open_source(source: str, data_dir: Any, **kwargs: Any) -> DrivaerML | CuratorDrivaerML:
    """The reader of ``source``: raw DrivaerML folders, or a PhysicsNeMo-Curator output folder."""
    check_choice(source, "source", SOURCES)
    return DrivaerML(data_dir, **kwargs) if source == "drivaerml" else CuratorDrivaerML(data_dir, **kwargs)


def _volume_sdf(
    ds: DrivaerML | CuratorDrivaerML, run: int, points: np.ndarray, backend: str, chunk_size: int
) -> np.ndarray:
    if isinstance(ds, DrivaerML):
        return sdf_to_stl(ds.stl_path(run), points, backend, chunk_size)
    return ds.sdf(run, points, backend=backend, chunk_size=chunk_size)


def sdf_to_stl(stl_path: Path, points: np.ndarray, backend: str, chunk_size: int) -> np.ndarray:
    import trimesh

    if not stl_path.is_file():
        raise FileNotFoundError(f"{stl_path}: file not found (needed for the volume signed distance)")
    body = trimesh.load(stl_path, force="mesh")  # merges STL's duplicated vertices (pseudonormals)
    if len(body.faces) == 0:
        raise ValueError(f"{stl_path}: no triangles (corrupt STL?)")
    return signed_distance(points, body.vertices, body.faces, backend=backend, chunk_size=chunk_size)


def _worker_init(threads: int) -> None:
    torch.set_num_threads(threads)


def read_run_info(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "run.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _refuse_to_drop(
    store: Path,
    runs: Sequence[int],
    kinds: tuple[str, ...],
    parts: tuple[int, ...],
    field_names: dict[str, tuple[str, ...]],
) -> None:
    """Raise before touching ``store`` if this configuration would delete data it already holds.

    A run whose configuration changed is rewritten from scratch, so a re-run without ``volume``
    (or with fewer part counts or fields) would silently replace what is there. What the store
    holds is read from ``meta.json`` and from the ``run.json`` of every run this call would touch.
    """
    held_kinds: set[str] = set()
    held_parts: set[int] = set()
    held_fields: dict[str, set[str]] = {}

    def note(kinds_: Any, parts_: Any, fields_: Any) -> None:
        held_kinds.update(kinds_ or ())
        held_parts.update(int(p) for p in parts_ or ())
        for kind, names in (fields_ or {}).items():
            held_fields.setdefault(kind, set()).update(names)

    meta_path = store / "meta.json"
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
            note(meta.get("kinds"), meta.get("parts"), meta.get("config", {}).get("fields"))
        except (OSError, ValueError, AttributeError):
            pass
    for run in runs:
        info = read_run_info(store / "runs" / f"run_{run}")
        if info is not None and isinstance(info.get("config"), dict):
            config = info["config"]
            note(config.get("kinds"), [p for chain in config.get("chains", []) for p in chain], config.get("fields"))
    lost = []
    if held_kinds - set(kinds):
        lost.append(" and ".join(sorted(held_kinds - set(kinds))) + " data")
    if held_parts - set(parts):
        lost.append("partitions for P in " + str(sorted(held_parts - set(parts))))
    for kind in sorted(held_kinds & set(kinds)):
        missing = held_fields.get(kind, set()) - set(field_names.get(kind, ()))
        if missing:
            lost.append(f"{kind} fields {sorted(missing)}")
    if not lost:
        return
    keep_kinds = sorted(held_kinds | set(kinds))
    keep_parts = sorted(held_parts | set(parts))
    flags = " ".join(f"--{k}" for k in keep_kinds) + " --parts " + " ".join(str(p) for p in keep_parts)
    raise ValueError(
        f"the store {store} holds {'; '.join(lost)}, which this run would delete (it asks for "
        f"{' and '.join(kinds)}, P in {list(parts)}). To keep them, run again with {flags} "
        f"(Python: surface={'surface' in keep_kinds}, volume={'volume' in keep_kinds}, parts={tuple(keep_parts)}"
        f"{', and the same fields' if any('fields' in x for x in lost) else ''}); to rebuild without them, "
        "delete the store first or write a new one"
    )


def check_args(
    parts: Sequence[int], method: str, surface: bool, volume: bool, workers: int, chunk_size: int
) -> tuple[int, ...]:
    if isinstance(parts, int) and not isinstance(parts, bool):
        parts = (parts,)
    parts = check_int_sequence(parts, "parts", minimum=1, nonempty=True)
    check_choice(method, "method", _METHODS)
    if not (surface or volume):
        raise ValueError("at least one of surface, volume must be True (got both False)")
    check_positive_int(workers, "workers")
    check_positive_int(chunk_size, "chunk_size")
    return tuple(sorted({int(p) for p in parts}))


@with_option_keywords
def preprocess(
    data_dir: str | os.PathLike[str],
    store_dir: str | os.PathLike[str],
    options: PreprocessOptions | None = None,
    *,
    workers: int = 2,
    progress: bool = True,
    source: str = "drivaerml",
    **changes: Any,
) -> PreprocessReport:
    """Read DrivaerML runs, partition them and write a sharded store.

    The store holds ``meta.json`` and ``runs/run_<i>/<kind>/p<P>/<array>.npy`` in partition order;
    the layout and why it is what it is are in the docstring of
    :mod:`meshshard.datasets._preprocess`.

    Per run (in parallel over ``workers`` processes): read the surface and/or volume cells
    (:class:`DrivaerML`), compute the signed distance of volume cell centres to
    ``drivaer_i.stl`` (``sdf``, positive outside, ``chunk_size`` points at a time), partition the
    cell centres into every ``P`` of ``parts`` (nested, so each ``P`` is a contiguous split) and
    write every array in that order. Then merge the per-run statistics over the training runs and
    write ``meta.json``.

    Parameters
    ----------
    (``options``: a :class:`PreprocessOptions` holding ``parts`` to ``chunk_size``; or give those as keywords.)

    data_dir:
        A DrivaerML-layout folder (``run_i/boundary_i.vtp``, ...), or with
        ``source="physicsnemo-curator"`` a PhysicsNeMo-Curator output folder (``run_i.zarr`` or
        ``run_i.npz``; arrays, units and checks in :mod:`meshshard.datasets._curator`).
    store_dir:
        Output folder (created). Runs already there with the same configuration are skipped.
    parts:
        Part counts ``P`` the store must serve; ``P = 1`` (whole samples) is always served.
    method:
        Partitioner of :func:`meshshard.partition.partition`: ``"rcb"``, ``"morton"``, ``"hilbert"``.
    surface, volume:
        Which meshes to store.
    workers:
        Worker processes (``1``: in this process). Each worker uses ``cpu_count // workers``
        torch threads.
    splits:
        Train/val/test fractions; runs are assigned by a shuffle seeded with ``seed``.
    seed:
        Seed of the split.
    runs:
        Run numbers to process (default: every ``run_i`` folder).
    fields:
        Fields to store, as for :class:`DrivaerML` (default: all DrivaerML fields). For the curator
        source: the curator's variable config, ``{"surface": {name: "scalar" | "vector"},
        "volume": {...}}`` in column order (default: its DrivaerML config).
    sdf_backend:
        ``"auto"`` (warp if installed, else libigl), ``"igl"`` or ``"warp"``.
    progress:
        Show a tqdm progress bar over runs.
    source:
        ``"drivaerml"`` (raw VTK runs) or ``"physicsnemo-curator"`` (its Zarr or NumPy output; read
        by row ranges, so the volume ``sdf`` uses the run's ``stl_coordinates``/``stl_faces``).
        Each run is still read whole by one worker and partitioned in that process; the
        rank-parallel read (:meth:`CuratorDrivaerML.read_sharded`: each rank its chunk range, as
        ``ShardTensor`` s) is there for the parallel partitioner to take over.

    Workers are *spawned* processes (forking a process that already runs torch/OpenMP threads is
    unsafe), so a script that calls this with ``workers > 1`` needs the usual
    ``if __name__ == "__main__":`` guard.

    Returns
    -------
    PreprocessReport
        Processed, skipped and failed runs (with the error of each failed run). Failures are
        also reported as a ``UserWarning``; the other runs and ``meta.json`` are still written.
    """
    started = time.perf_counter()
    opts = PreprocessOptions.of(options, changes, "preprocess")
    method, surface, volume, splits, seed = opts.method, opts.surface, opts.volume, opts.splits, opts.seed
    parts = check_args(opts.parts, method, surface, volume, workers, opts.chunk_size)
    sdf_backend = resolve_backend(opts.sdf_backend) if volume else opts.sdf_backend
    kinds = selected_kinds(surface, volume)
    reader = _open_source(source, data_dir, runs=opts.runs, fields=opts.fields, surface=surface, volume=volume)
    variables = reader.variables if isinstance(reader, CuratorDrivaerML) else None
    field_names = stored_fields(reader, kinds)
    chains = tuple(tuple(c) for c in divisor_chains(parts))
    config = store_config(method, chains, kinds, field_names, source)
    split = split_runs(reader.runs, splits, seed)

    store = Path(store_dir)
    _refuse_to_drop(store, reader.runs, kinds, parts, field_names)
    runs_dir = store / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    for stale in runs_dir.glob(".tmp-run_*"):  # left by a killed earlier job
        shutil.rmtree(stale, ignore_errors=True)

    report = PreprocessReport(store=store)
    todo = []
    for run in reader.runs:
        recover_dir(runs_dir / f"run_{run}")  # a crash inside replace_dir may have left only the backup
        info = read_run_info(runs_dir / f"run_{run}")
        if info is not None and info.get("config") == config:
            report.skipped.append(run)
        else:
            todo.append(
                _Task(
                    str(Path(data_dir).resolve()),
                    str(store.resolve()),
                    run,
                    kinds,
                    field_names,
                    chains,
                    method,
                    sdf_backend,
                    opts.chunk_size,
                    config,
                    source,
                    variables,
                )  # fmt: skip
            )

    results = _run_tasks(todo, workers, progress)
    for run, error, cells in sorted(results, key=lambda r: r[0]):
        report.record(run, error, cells)

    write_meta(store, reader, split, report, config, parts, chains, kinds, seed, splits, sdf_backend)
    report.seconds = time.perf_counter() - started
    if report.failed:
        lines = "; ".join(f"run {r}: {msg}" for r, msg in report.failed.items())
        warnings.warn(f"preprocess: {len(report.failed)} run(s) failed and were left out: {lines}", stacklevel=2)
    return report


def selected_kinds(surface: bool, volume: bool) -> tuple[str, ...]:
    """The kinds a store holds, in store order: ``("surface",)``, ``("volume",)`` or both."""
    return tuple(k for k, on in (("surface", surface), ("volume", volume)) if on)


def stored_fields(reader: Any, kinds: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The field names ``reader`` yields for each stored kind (``surface_fields``/``volume_fields``)."""
    names = {"surface": reader.surface_fields, "volume": reader.volume_fields}
    return {k: tuple(v) for k, v in names.items() if k in kinds}


def store_config(
    method: str,
    chains: tuple[tuple[int, ...], ...],
    kinds: tuple[str, ...],
    field_names: Mapping[str, Sequence[str]],
    source: str = "drivaerml",
) -> dict[str, Any]:
    """A run's configuration as ``run.json`` holds it (JSON types): a run is redone when it differs."""
    config: dict[str, Any] = {
        "method": method,
        "chains": [list(c) for c in chains],
        "kinds": list(kinds),
        "fields": field_names,
    }
    if source != "drivaerml":
        config["source"] = source
    return json.loads(json.dumps(config))  # the form it takes in run.json, for comparison


def _run_tasks(todo: list[_Task], workers: int, progress: bool) -> list[tuple[int, str | None, dict[str, int]]]:
    """``(run, error, cells)`` of every task: in this process, or over ``workers`` spawned processes."""
    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), desc="preprocess", unit="run", disable=not progress or not todo)
    results: list[tuple[int, str | None, dict[str, int]]] = []
    if workers == 1 or len(todo) <= 1:
        for task in todo:
            results.append(_process_run(task))
            bar.update()
    else:
        from .._spawn import check_main_guard

        check_main_guard("preprocess(workers > 1)")
        num = min(workers, len(todo))
        threads = max(1, (os.cpu_count() or 1) // num)
        context = multiprocessing.get_context("spawn")  # fork is unsafe once torch/OpenMP threads exist
        with ProcessPoolExecutor(num, mp_context=context, initializer=_worker_init, initargs=(threads,)) as pool:
            futures = {pool.submit(_process_run, task): task.run for task in todo}
            for future in as_completed(futures):
                try:
                    results.append(future.result())
                except BrokenProcessPool as err:  # a worker died (killed for memory, or a bad start)
                    hint = (
                        " (a worker process died: out of memory? When calling preprocess from a script,"
                        " guard it with `if __name__ == '__main__':`, as spawned workers import it again)"
                    )
                    results.append((futures[future], run_error(err) + hint, {}))
                bar.update()
    bar.close()
    return results


def write_meta(
    store: Path,
    source: DrivaerML | CuratorDrivaerML,
    split: dict[str, list[int]],
    report: PreprocessReport,
    config: dict[str, Any],
    parts: tuple[int, ...],
    chains: tuple[tuple[int, ...], ...],
    kinds: tuple[str, ...],
    seed: int,
    fractions: Sequence[float],
    sdf_backend: str,
) -> None:
    infos = {}
    for run in source.runs:
        info = read_run_info(store / "runs" / f"run_{run}")
        if run not in report.failed and info is not None and info.get("config") == config:
            infos[run] = info
    order_of = {"1": order_key(chains[0])}
    for chain in chains:
        for p in chain:
            order_of.setdefault(str(p), order_key(chain))

    fields: dict[str, dict[str, Any]] = {}
    stats: dict[str, dict[str, Any]] = {}
    runs_meta: dict[str, Any] = {}
    train = [r for r in split["train"] if r in infos]
    for kind in kinds:
        shapes = next((info["kinds"][kind]["fields"] for info in infos.values()), {})
        fields[kind] = {
            name: {"shape": shape, "dtype": "float32", "units": FIELD_UNITS.get(name, "")}
            for name, shape in shapes.items()
        }
        merged: dict[str, FieldStats] = {}
        for run in train:  # run order: deterministic whatever the worker count
            for name, obj in infos[run]["kinds"][kind]["stats"].items():
                s = FieldStats.from_json(obj)
                merged[name] = s if name not in merged else merged[name].merge(s)
        stats[kind] = {
            name: {"mean": s.mean.tolist(), "std": s.std.tolist(), "count": s.count} for name, s in merged.items()
        }
    for run, info in infos.items():
        runs_meta[str(run)] = {
            kind: {
                "num_points": info["kinds"][kind]["num_points"],
                "sizes": {p: info["kinds"][kind]["orders"][key][p] for p, key in order_of.items()},
            }
            for kind in kinds
        }
    meta = {
        "format": STORE_FORMAT,
        "source": str(source.root.resolve()),
        "method": config["method"],
        "parts": list(parts),
        "kinds": list(kinds),
        "orders": {order_key(c): [1, *c] if c[0] != 1 else list(c) for c in chains},
        "order_of": order_of,
        "fields": fields,
        "stats": stats,
        "stats_over": "train",
        "splits": {name: [r for r in runs if r in infos] for name, runs in split.items()},
        "split_fractions": list(fractions),
        "seed": seed,
        "sdf_backend": sdf_backend if "volume" in kinds else None,
        "runs": runs_meta,
        "failed": {str(r): msg for r, msg in report.failed.items()},
        "config": config,
    }
    atomic_write_json(store / "meta.json", meta)
