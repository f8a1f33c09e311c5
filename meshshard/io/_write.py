"""Writers for per-rank partitions: one VTK piece per rank plus the index ParaView opens."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.distributed import ProcessGroup

from .. import comm, faults
from .._atomic import atomic_replace, atomic_replace_all
from .._checks import check_positive_int, check_radius
from .._sizes import offsets_of, owner_of
from ..errors import ShardingError
from ..halo import HaloPlan
from ..partition import MeshPartition, Partition, ghost_sets
from ..tensor import ShardSpec, ShardTensor
from ._data import Cells, Dataset, as_dataset, as_numpy, partition_sizes_and_perm
from ._vtk import (
    DUPLICATECELL,
    DUPLICATEPOINT,
    EXTENSIONS,
    Piece,
    Schema,
    check_compression,
    read_schema,
    schema_of,
    write_index,
    write_piece,
)

if TYPE_CHECKING:  # pragma: no cover
    import pyvista as pv

__all__ = ["read_partitions", "write_local_partition", "write_partition_index", "write_partitions"]

PathLike = str | os.PathLike


def _index_path(path: Any, kind: str) -> Path:
    """The index file for ``path`` (a ``.pvtp``/``.pvtu`` name or a folder); its folder is created."""
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a str or os.PathLike (got {type(path).__name__})")
    path = Path(path)
    index_ext = EXTENSIONS["poly" if kind == "points" else kind][1]
    what = {"points": "a point cloud", "poly": "a PolyData mesh", "ugrid": "a volume mesh"}[kind]
    if path.suffix in (".pvtp", ".pvtu"):
        if path.suffix != index_ext:
            raise ValueError(f"path for {what} must end with {index_ext} (got {str(path)!r})")
    elif path.suffix == "" or path.is_dir():
        path = path / f"partitions{index_ext}"
    else:
        raise ValueError(f"path must be a folder or end with .pvtp or .pvtu (got {str(path)!r})")
    if path.stem == "":
        raise ValueError(f"path needs a file name before {path.suffix} (got {str(path)!r})")
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise NotADirectoryError(f"cannot write partitions into {str(parent)!r}: it is not a folder")
    parent.mkdir(parents=True, exist_ok=True)
    if not os.access(parent, os.W_OK):
        raise PermissionError(f"cannot write partitions into {str(parent)!r}: permission denied")
    return path


def _piece_path(index: Path, rank: int) -> Path:
    piece_ext = ".vtp" if index.suffix == ".pvtp" else ".vtu"
    return index.with_name(f"{index.stem}_{rank}{piece_ext}")


def _remove_index(index: Path) -> None:
    """Drop an index left by an earlier write, so a failure now cannot leave a stale one."""
    for stale in (index, index.with_suffix(".vtpd")):
        if stale.exists():
            stale.unlink()


def _point_piece(
    points: np.ndarray,
    arrays: Mapping[str, np.ndarray],
    global_ids: np.ndarray,
    ranks: np.ndarray,
    num_ghosts: int | None,
) -> Piece:
    """A point-cloud piece; its last ``num_ghosts`` points are ghosts (``None``: no ghost arrays)."""
    n = points.shape[0]
    point_data = {"vtkProcessId": ranks.astype(np.int32), "GlobalPointIds": global_ids.astype(np.int64)}
    point_data.update(arrays)
    cell_data = {}
    if num_ghosts is not None:
        ghost = np.zeros(n, dtype=np.uint8)
        ghost[n - num_ghosts:] = DUPLICATEPOINT
        point_data["vtkGhostType"] = ghost
        cell_data["vtkGhostType"] = np.where(ghost > 0, DUPLICATECELL, 0).astype(np.uint8)
    # One vertex cell per point: ParaView draws cells, and hides ghost cells.
    return Piece("poly", points, Cells.vertices(n), point_data, cell_data)


def _rank_items(
    perm: np.ndarray, sizes: np.ndarray, ghosts: list[np.ndarray] | None
) -> Iterator[tuple[np.ndarray, int | None]]:
    """Each rank's item ids (owned in partition order, then its ghosts) and its ghost count (``None``: no ghosts)."""
    offsets = offsets_of(sizes)
    for r in range(len(sizes)):
        owned = perm[offsets[r]:offsets[r + 1]]
        if ghosts is None:
            yield owned, None
        else:
            yield np.concatenate([owned, ghosts[r]]), len(ghosts[r])


def _cloud_pieces(
    ds: Dataset, perm: np.ndarray, sizes: np.ndarray, owner: np.ndarray, ghosts: list[np.ndarray] | None
) -> Iterator[Piece]:
    for ids, num_ghosts in _rank_items(perm, sizes, ghosts):
        arrays = {k: v[ids] for k, v in ds.point_data.items()}
        yield _point_piece(ds.points[ids], arrays, ids, owner[ids], num_ghosts)


def _mesh_pieces(
    ds: Dataset, perm: np.ndarray, sizes: np.ndarray, owner: np.ndarray, ghosts: list[np.ndarray] | None
) -> Iterator[Piece]:
    for ids, num_ghosts in _rank_items(perm, sizes, ghosts):
        is_ghost = np.arange(len(ids)) >= len(ids) - (num_ghosts or 0)
        if ds.kind == "poly":  # VTK stores verts, lines, polys, strips in that order
            order = np.argsort(ds.cells.types[ids], kind="stable")
            ids, is_ghost = ids[order], is_ghost[order]
        cells = ds.cells.gather(ids)
        point_ids, local = np.unique(cells.connectivity, return_inverse=True)
        cells.connectivity = local.reshape(-1).astype(np.int64)
        point_data = {"GlobalPointIds": point_ids}
        point_data.update({k: v[point_ids] for k, v in ds.point_data.items()})
        cell_data = {"vtkProcessId": owner[ids].astype(np.int32), "GlobalCellIds": ids}
        cell_data.update({k: v[ids] for k, v in ds.cell_data.items()})
        if num_ghosts is not None:
            # A point is a ghost when no owned cell uses it.
            used = np.zeros(len(point_ids), dtype=bool)
            used[cells.connectivity[~np.repeat(is_ghost, np.diff(cells.offsets))]] = True
            point_data["vtkGhostType"] = np.where(used, 0, DUPLICATEPOINT).astype(np.uint8)
            cell_data["vtkGhostType"] = np.where(is_ghost, DUPLICATECELL, 0).astype(np.uint8)
        yield Piece(ds.kind, ds.points[point_ids], cells, point_data, cell_data)


def write_partitions(
    data: Any,
    partition: Partition | MeshPartition,
    path: PathLike,
    fields: Any = None,
    ghost_radius: float | None = None,
    *,
    compression: str | None = None,
    field_data: Mapping[str, Any] | None = None,
) -> Path:
    """Write one VTK piece per rank and the parallel index ParaView opens.

    A point cloud is split over its points into ``<stem>_<r>.vtp`` pieces (one vertex cell per
    point) indexed by ``<stem>.pvtp``; a mesh is split over its cells (each piece holds its
    cells with their points) into ``.vtp`` (PolyData) or ``.vtu`` (other meshes) pieces indexed by
    ``.pvtp``/``.pvtu``. A ``<stem>.vtpd`` partitioned dataset (one partition per rank, same
    piece files) is written for ``pyvista.read``. Every rank gets a piece, empty or not.

    Arrays written: ``vtkProcessId`` (int32, owning rank; on points of a cloud, on cells of a
    mesh), ``GlobalPointIds`` (int64, index of the point in ``data``, set as VTK global ids),
    ``GlobalCellIds`` (meshes), the chosen fields, and with ``ghost_radius`` ``vtkGhostType``
    (uint8) on points and cells.

    Parameters
    ----------
    data
        An ``(N, 3)`` tensor/array, a pyvista/VTK dataset, a ``torch_geometric.data.Data`` (``pos``
        and node attributes) or a sample dict ``{"pos": (N, 3), name: (N, ...)}``.
    partition
        A :class:`~meshshard.partition.Partition` of the points of a cloud or of the cells of a
        mesh, or the :class:`~meshshard.partition.MeshPartition` of a mesh.
    path
        The index file (``.pvtp`` for clouds and PolyData, ``.pvtu`` for other meshes) or a folder,
        which gets ``partitions.pvtp``/``.pvtu``. Missing folders are created.
    fields
        ``None``: every named array of ``data``; a sequence of names: those; a mapping
        ``name -> array``: extra arrays with one row per point (per cell or per point of a mesh).
    ghost_radius
        Append to each piece the items owned by other ranks within this distance of one of its
        items (points of a cloud, cell centres of a mesh; closed ball), marked ``vtkGhostType = 1``
        (DUPLICATEPOINT on points, DUPLICATECELL on cells); their ``vtkProcessId`` is their owner.
    compression
        ``None`` (raw binary, fastest), ``"zlib"``, ``"lz4"`` or ``"lzma"``: VTK's compressors,
        which ParaView and pyvista read transparently.
    field_data
        Extra whole-dataset values (strings, numbers, 1-D arrays) for every piece's VTK FieldData.
        Every piece always carries ``meshshard_version``, ``method`` (the partition's),
        ``num_parts``, ``imbalance`` (largest part / mean part), ``ghost_radius`` (NaN without
        ghosts) and ``rank`` (of the piece); ``pyvista.read(piece).field_data`` shows them.

    Returns
    -------
    pathlib.Path
        The index file. It is written last, after every piece has been renamed into place; if
        anything fails, no index (and no temporary file) is left.

    **Shapes**: pieces hold ``N_local`` owned items in partition order, then ``N_ghost`` ghosts
    sorted by global id.

    Examples
    --------
    >>> import tempfile, torch, meshshard.io as msio
    >>> from meshshard.partition import Partition
    >>> part = Partition(perm=torch.tensor([2, 0, 1, 3]), sizes=torch.tensor([1, 3]))
    >>> msio.write_partitions(torch.rand(4, 3), part, f"{tempfile.mkdtemp()}/cloud.pvtp").name
    'cloud.pvtp'
    """
    ds = as_dataset(data, fields)
    perm, sizes = partition_sizes_and_perm(partition, ds)
    radius = None if ghost_radius is None else check_radius(ghost_radius, "ghost_radius")
    compression = check_compression(compression)
    index = _index_path(path, ds.kind)
    owner = np.empty(ds.num_items, dtype=np.int64)
    owner[perm] = np.repeat(np.arange(len(sizes)), sizes)
    ghosts = None if radius is None else [g.numpy() for g in ghost_sets(ds.centres(), owner, len(sizes), radius)]
    make = _cloud_pieces if ds.cells is None else _mesh_pieces
    info = _field_data(partition, sizes, radius, field_data)
    _write_all(index, _with_field_data(make(ds, perm, sizes, owner, ghosts), info), compression)
    return index


def _field_data(
    partition: Partition | MeshPartition, sizes: np.ndarray, radius: float | None, extra: Mapping[str, Any] | None
) -> dict[str, Any]:
    from .. import __version__

    part = partition.cells if isinstance(partition, MeshPartition) else partition
    mean = sizes.sum() / max(len(sizes), 1)
    info: dict[str, Any] = {
        "meshshard_version": __version__,
        "method": str(part.method),
        "num_parts": len(sizes),
        "imbalance": float(sizes.max() / mean) if mean > 0 else float("nan"),
        "ghost_radius": float("nan") if radius is None else float(radius),
    }
    info.update(extra or {})
    return info


def _with_field_data(pieces: Iterator[Piece], info: dict[str, Any]) -> Iterator[Piece]:
    for rank, piece in enumerate(pieces):
        piece.field_data = {**info, "rank": rank}
        yield piece


def _write_all(index: Path, pieces: Iterator[Piece], compression: str | None) -> None:
    """Write every piece to a temporary name, rename them all, then write the index."""
    _remove_index(index)
    schema: Schema | None = None

    def items() -> Iterator[tuple[Path, Any]]:
        nonlocal schema
        for rank, piece in enumerate(pieces):
            schema = schema or schema_of(piece)
            yield _piece_path(index, rank), lambda tmp, piece=piece: write_piece(piece, tmp, compression)

    targets = atomic_replace_all(items())
    if schema is None:
        raise ValueError("partition has no parts")
    write_index(index, schema, [target.name for target in targets])


def _local_rows(value: Rows, name: str, n: int) -> np.ndarray:
    array = as_numpy(value, name)
    if array.ndim == 0 or array.shape[0] != n:
        raise ValueError(f"{name} must have {n} rows (got shape {tuple(array.shape)})")
    return array


#: What :func:`write_local_partition` takes as per-rank rows: a tensor, an array or a ShardTensor.
Rows = torch.Tensor | np.ndarray | ShardTensor


@faults.entry
def write_local_partition(
    local_points: Rows,
    path: PathLike,
    *,
    fields: Mapping[str, Rows] | None = None,
    global_ids: Rows | None = None,
    ghost_points: Rows | None = None,
    ghost_fields: Mapping[str, Rows] | None = None,
    ghost_global_ids: Rows | None = None,
    ghost_ranks: Rows | None = None,
    halo: HaloPlan | None = None,
    compression: str | None = None,
    rank: int | None = None,
    num_ranks: int | None = None,
    group: ProcessGroup | None = None,
) -> Path:
    """Write this rank's piece of a distributed point cloud; rank 0 then writes the index.

    Each rank writes ``<stem>_<rank>.vtp`` next to the index from its local tensors (plain or
    :class:`~meshshard.ShardTensor`); nothing is gathered. Under an initialised process group
    every rank must call this; once all pieces are in place rank 0 writes ``<stem>.pvtp`` and
    ``<stem>.vtpd``. Without a process group only the piece is written: call
    :func:`write_partition_index` once every piece exists.

    Parameters
    ----------
    local_points
        ``(N_local, 3)`` owned points.
    path
        The ``.pvtp`` index (or a folder), the same on every rank.
    fields
        ``name -> (N_local, ...)`` arrays; the same names and dtypes on every rank.
    global_ids
        ``(N_local,)`` global index of each point. Default: the ShardTensor's offset plus the local
        index (its partition-order index; pass ``partition.shard_indices(rank)`` for original
        ids), or for plain tensors under a process group the same from one ``all_gather_object``
        of the local sizes.
    ghost_points, ghost_fields, ghost_global_ids, ghost_ranks
        ``(N_ghost, 3)`` ghost points with their fields, global ids and owning ranks (e.g. from a
        halo exchange), marked ``vtkGhostType = 1``. Give them on every rank or on none.
    halo
        A :class:`~meshshard.halo.HaloPlan` of these points: its ghosts are written (coordinates,
        global indices, owners, and each field through ``halo.exchange``) instead of the
        ``ghost_*`` arguments. Its global indices are in partition order, like the default
        ``global_ids`` of a ShardTensor.
    compression
        As for :func:`write_partitions`.
    rank, num_ranks, group
        Default: the ShardTensor's domain group, else the default process group, and this
        process's rank and the size of that group.

    Returns
    -------
    pathlib.Path
        The index file.

    Raises
    ------
    ShardingError
        On the healthy ranks when another rank failed (that rank raises its own error); no index
        is written then.

    **Communication**: under a process group, two all-reduces of one int32 over ``group`` (every
    piece written? the index written?), plus one ``all_gather_object`` of an int when global ids
    must be derived from plain tensors, plus with ``halo`` one ``halo.exchange`` (an
    ``all_to_all``) per field.
    """
    spec: ShardSpec | None = local_points.spec if isinstance(local_points, ShardTensor) else None
    seat = _seat(rank, num_ranks, spec.group if spec is not None and group is None else group)
    if not seat.collective and global_ids is None and spec is None:
        raise ValueError("global_ids is required when no process group is initialised")
    ghosts = _ghost_rows(halo, fields, ghost_points, ghost_fields, ghost_global_ids, ghost_ranks)

    # From here on, errors are held until every rank has joined the collectives, so one rank's
    # bad input fails all ranks instead of leaving them waiting.
    error: BaseException | None = None
    index = piece = points = None
    try:
        index, compression = _local_target(path, compression, seat)
        points = as_dataset(local_points).points
    except Exception as exc:
        error = exc
    if global_ids is None:
        global_ids = _default_global_ids(0 if points is None else points.shape[0], spec, seat)
    if error is None:
        try:
            piece = _local_piece(points, seat.rank, fields, global_ids, ghosts)
            atomic_replace(_piece_path(index, seat.rank), lambda tmp: write_piece(piece, tmp, compression))
        except Exception as exc:
            error = exc
    if seat.collective:
        _publish_index(index, piece, error, seat)
    elif error is not None:
        raise error
    return index


@dataclass(frozen=True)
class _Seat:
    """Where :func:`write_local_partition` writes from: its rank of ``num_ranks``, and the group it agrees over."""

    rank: int
    num_ranks: int
    group: ProcessGroup | None
    #: Whether a process group is initialised (then every rank calls, and rank 0 writes the index).
    collective: bool


def _seat(rank: int | None, num_ranks: int | None, group: ProcessGroup | None) -> _Seat:
    """Check ``rank``/``num_ranks``, defaulting them to this process's rank in ``group`` and its size."""
    state = comm.group_rank_and_size(group)
    group_rank, group_size = state if state is not None else (-1, 0)
    rank = group_rank if rank is None else rank
    num_ranks = group_size if num_ranks is None else num_ranks
    if not isinstance(rank, int) or not isinstance(num_ranks, int) or not 0 <= rank < num_ranks:
        raise ValueError(f"rank must satisfy 0 <= rank < num_ranks (got rank={rank}, num_ranks={num_ranks})")
    if state is not None and (rank, num_ranks) != (group_rank, group_size):
        raise ValueError(
            f"rank/num_ranks ({rank}/{num_ranks}) differ from the process group's ({group_rank}/{group_size})"
        )
    return _Seat(rank, num_ranks, group, state is not None)


@dataclass(frozen=True)
class _Ghosts:
    """The ghost rows of a :func:`write_local_partition` piece: points, their fields, global ids, owning ranks."""

    points: Rows
    fields: Mapping[str, Rows] | None
    global_ids: Rows | None
    ranks: Rows | None


def _ghost_rows(
    halo: HaloPlan | None,
    fields: Mapping[str, Rows] | None,
    ghost_points: Rows | None,
    ghost_fields: Mapping[str, Rows] | None,
    ghost_global_ids: Rows | None,
    ghost_ranks: Rows | None,
) -> _Ghosts | None:
    """The ghost rows to write: from ``halo`` (collective), from the ``ghost_*`` arguments, or none."""
    given = [n for n, v in (("ghost_fields", ghost_fields), ("ghost_global_ids", ghost_global_ids),
                            ("ghost_ranks", ghost_ranks)) if v is not None]  # fmt: skip
    if halo is not None:
        if ghost_points is not None:
            raise ValueError("give either halo or ghost_points, not both")
        if given:
            raise ValueError(f"a halo supplies the ghosts' fields, ids and ranks: drop {', '.join(given)}")
        return _halo_ghosts(halo, fields)
    if ghost_points is None:
        if given:
            raise ValueError(f"{', '.join(given)} describe ghost rows: give ghost_points (or a halo) with them")
        return None
    return _Ghosts(ghost_points, ghost_fields, ghost_global_ids, ghost_ranks)


def _halo_ghosts(halo: HaloPlan, fields: Mapping[str, Rows] | None) -> _Ghosts:
    """The ghosts of ``halo``, each field exchanged through it (collective: call on every rank)."""
    global_ids = halo.ghost_global_index
    ranks = owner_of(global_ids, halo.offsets)
    # Collective: every rank exchanges every field, before anything can fail locally.
    exchanged = {k: halo.exchange(v)[halo.num_owned:] for k, v in dict(fields or {}).items()}
    return _Ghosts(halo.ghost_points, exchanged, global_ids, ranks)


def _local_target(path: PathLike, compression: str | None, seat: _Seat) -> tuple[Path, str | None]:
    """The ``.pvtp`` index and the checked compression; rank 0 of a group drops an earlier index."""
    index = _index_path(path, "points")
    if index.suffix != ".pvtp":
        raise ValueError(f"a distributed point cloud is written as .pvtp (got {str(index)!r})")
    compression = check_compression(compression)
    if seat.collective and seat.rank == 0:
        _remove_index(index)
    return index, compression


def _default_global_ids(n: int, spec: ShardSpec | None, seat: _Seat) -> np.ndarray:
    """The partition-order ids of this rank's ``n`` points: from the spec, else one all-gather of the sizes."""
    if spec is not None:
        return np.arange(n, dtype=np.int64) + int(spec.offsets[seat.rank])
    sizes = comm.all_gather_object(n, seat.group)
    return np.arange(n, dtype=np.int64) + offsets_of(sizes)[seat.rank]


def _publish_index(index: Path | None, piece: Piece | None, error: BaseException | None, seat: _Seat) -> None:
    """Agree that every piece is in place, then rank 0 writes the index and all agree that it did.

    Raises this rank's ``error``, or a ShardingError naming what failed elsewhere.
    """
    pieces = comm.agree(_verdict(error), seat.group)
    if error is not None:
        raise error
    if pieces.failed:
        raise ShardingError(f"rank {seat.rank}: another rank failed to write its piece; no index was written "
                            f"({pieces.first_error()})")
    if seat.rank == 0:
        try:
            write_index(index, schema_of(piece), [_piece_path(index, r).name for r in range(seat.num_ranks)])
        except Exception as exc:
            error = exc
    if comm.agree(_verdict(error), seat.group).failed:
        if error is not None:
            raise error
        raise ShardingError(f"rank {seat.rank}: rank 0 failed to write the index {index}")


def _verdict(error: BaseException | None) -> str | None:
    return None if error is None else f"{type(error).__name__}: {error}"


def _local_piece(
    points: np.ndarray,
    rank: int,
    fields: Mapping[str, Rows] | None,
    global_ids: Rows,
    ghosts: _Ghosts | None,
) -> Piece:
    """Check and assemble the piece of :func:`write_local_partition` (owned rows, then ghosts)."""
    n = points.shape[0]
    arrays = {k: _local_rows(v, f"fields[{k!r}]", n) for k, v in dict(fields or {}).items()}
    ids = _local_rows(global_ids, "global_ids", n).reshape(-1)
    ranks = np.full(n, rank, dtype=np.int32)
    if ghosts is None:
        return _point_piece(points, arrays, ids, ranks, None)
    g_points = as_dataset(ghosts.points).points.astype(points.dtype)
    g = g_points.shape[0]
    if ghosts.global_ids is None or ghosts.ranks is None:
        raise ValueError("ghost_points needs ghost_global_ids and ghost_ranks")
    g_fields = dict(ghosts.fields or {})
    if set(g_fields) != set(arrays):
        raise ValueError(
            f"ghost_fields must have the keys of fields {sorted(arrays)} (got {sorted(g_fields)})"
        )
    arrays = {
        k: np.concatenate([v, _local_rows(g_fields[k], f"ghost_fields[{k!r}]", g).astype(v.dtype)])
        for k, v in arrays.items()
    }
    ids = np.concatenate([ids, _local_rows(ghosts.global_ids, "ghost_global_ids", g).reshape(-1)])
    ranks = np.concatenate([ranks, _local_rows(ghosts.ranks, "ghost_ranks", g).reshape(-1)])
    return _point_piece(np.concatenate([points, g_points]), arrays, ids, ranks, g)


def write_partition_index(path: PathLike, num_ranks: int) -> Path:
    """Write the ``.pvtp``/``.pvtu`` (and ``.vtpd``) index for pieces ``<stem>_0 .. <stem>_{P-1}``.

    For pieces written without a process group (:func:`write_local_partition` in separate jobs).
    The arrays declared are read from piece 0; every piece must exist.
    """
    num_ranks = check_positive_int(num_ranks, "num_ranks")
    as_path = Path(path) if isinstance(path, str | os.PathLike) else path
    kind = "ugrid" if isinstance(as_path, Path) and as_path.suffix == ".pvtu" else "poly"
    index = _index_path(path, kind)
    pieces = [_piece_path(index, r) for r in range(num_ranks)]
    missing = [p.name for p in pieces if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"cannot index {index.name}: missing pieces {missing}")
    write_index(index, read_schema(pieces[0], kind), [p.name for p in pieces])
    return index


def read_partitions(path: PathLike) -> pv.DataSet:
    """Read a ``.pvtp``/``.pvtu`` index (all pieces appended) or ``.vtpd`` as a pyvista object.

    ``pyvista.read`` handles ``.pvtu`` and ``.vtpd`` but not ``.pvtp``; this reads all three.
    Ghosts are kept: select ``vtkGhostType == 0`` to drop them.
    """
    import pyvista as pv

    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a str or os.PathLike (got {type(path).__name__})")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no partition index at {str(path)!r}")
    if path.suffix == ".pvtp":
        from vtkmodules.vtkIOXML import vtkXMLPPolyDataReader as Reader
    elif path.suffix == ".pvtu":
        from vtkmodules.vtkIOXML import vtkXMLPUnstructuredGridReader as Reader
    elif path.suffix == ".vtpd":
        return pv.read(path)
    else:
        raise ValueError(f"path must end with .pvtp, .pvtu or .vtpd (got {str(path)!r})")
    import xml.etree.ElementTree as ET

    try:
        sources = [piece.get("Source") for piece in ET.parse(path).getroot().iter("Piece")]
    except ET.ParseError as exc:
        raise ValueError(f"{str(path)!r} is not a valid VTK XML index: {exc}") from None
    missing = [s for s in sources if not s or not (path.parent / s).is_file()]
    if missing:
        raise FileNotFoundError(f"{path.name} references missing pieces {missing}")
    reader = Reader()
    reader.SetFileName(str(path))
    reader.Update()
    return pv.wrap(reader.GetOutput())
