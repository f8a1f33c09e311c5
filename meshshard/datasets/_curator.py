"""Read DrivaerML runs as NVIDIA PhysicsNeMo-Curator wrote them (Zarr or NumPy), in meshshard's names and units.

The curator's external-aerodynamics ETL (``examples/external_aerodynamics`` of
``NVIDIA/physicsnemo-curator``) turns every raw run folder ``run_<i>/`` into one file per run in
its output folder: ``run_<i>.zarr`` (a Zarr group, the default) or ``run_<i>.npz`` (the legacy
NumPy form, ``np.savez``). Both hold the same arrays, all float32 (``stl_faces`` included):

===========================  =========  ===================================================
curator array                shape      meshshard array (units) and how it is recovered
===========================  =========  ===================================================
``surface_mesh_centers``     (N, 3)     surface ``pos`` [m]
``surface_normals``          (N, 3)     surface ``normals`` [1] (unit length)
``surface_areas``            (N,)       surface ``areas`` [m^2]
``surface_fields``           (N, C_s)   one array per surface variable, in the order of the
                                        variable config; every column times ``rho U^2``:
                                        ``pMeanTrim`` [Pa], ``wallShearStressMeanTrim`` (3) [Pa]
``volume_mesh_centers``      (M, 3)     volume ``pos`` [m]
``volume_fields``            (M, C_v)   one array per volume variable; columns ``0:3`` times
                                        ``U``, column ``3`` times ``rho U^2``, columns ``4:``
                                        times ``U L``: ``UMeanTrim`` (3) [m/s], ``pMeanTrim``
                                        [Pa], ``nutMeanTrim`` [m^2/s]
``stl_coordinates``          (V, 3)     vertices of the body; ``L`` = its largest extent
``stl_faces``                (3 F,)     triangle vertex indices (stored as float32): the body
                                        for the volume ``sdf`` [m] (positive outside)
``stl_centers``/``_areas``   (F, ...)   not used
===========================  =========  ===================================================

``U`` and ``rho`` are the run's own metadata: Zarr attributes ``physics_constants``
(``{"stream_velocity": 30.0, "air_density": 1.205}``, curator 1.1) or top-level
``stream_velocity`` / ``air_density`` (1.0); scalars of those names in the ``.npz``. The
non-dimensionalisation is undone exactly as the curator applied it: surface fields were divided
by ``rho U^2`` (not the dynamic pressure ``rho U^2 / 2``), volume fields column by column by
position (not by name), so a variable config in another order is undone the same way it was
done. The variable config is not stored in the files: ``variables`` must be the one the curator
ran with (default: its DrivaerML config, :data:`CURATOR_SURFACE_VARIABLES`,
:data:`CURATOR_VOLUME_VARIABLES`); a run whose field count differs is an error.

What differs from the raw-VTK path: the curator's DrivaerML config has no ``CpMeanTrim`` (it is
``2 pMeanTrim / (rho U^2)``, with the simulation's own ``rho``, which the files do not record), the
curator shuffles the volume rows (``perm`` of a store then indexes the curator's rows, not VTK
cells), and its volume reader takes mesh *vertices* with point data, where the raw path takes cell
centres with cell data.

Bounded reads. Every point array is read by row range: Zarr decodes only the chunks that overlap
``[start, stop)``; an ``.npz`` written by ``np.savez`` stores its members uncompressed, so the rows
are one contiguous byte range of the zip file, read straight into the array (a compressed
``np.savez_compressed`` member is decompressed whole). :func:`rank_rows` gives every rank a
contiguous, chunk-aligned range and :meth:`CuratorDrivaerML.read_sharded` reads it into
``ShardTensor`` s with no communication. Hand-written (not ``np.load(mmap_mode=...)``, which ignores it for
``.npz``) because no library maps a member of a zip file.
"""

from __future__ import annotations

import os
import re
import struct
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .._checks import check_choice, check_positive_real
from ..errors import DatasetError
from ._store import NpyHeader, read_rows
from .drivaerml import open_root

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from meshshard.tensor import ShardTensor

__all__ = [
    "CURATOR_SURFACE_VARIABLES",
    "CURATOR_VOLUME_VARIABLES",
    "CuratorDrivaerML",
    "CuratorRun",
    "rank_rows",
]

#: ``surface_variables`` of the curator's DrivaerML config (column order of ``surface_fields``).
CURATOR_SURFACE_VARIABLES: dict[str, str] = {"pMeanTrim": "scalar", "wallShearStressMeanTrim": "vector"}
#: ``volume_variables`` of the curator's DrivaerML config (column order of ``volume_fields``).
CURATOR_VOLUME_VARIABLES: dict[str, str] = {"UMeanTrim": "vector", "pMeanTrim": "scalar", "nutMeanTrim": "scalar"}

_COMPONENTS = {"scalar": 1, "vector": 3}
_RUN_FILE = re.compile(r"^run_(\d+)\.(zarr|npz)$")
_GEOMETRY = {
    "surface": {"pos": "surface_mesh_centers", "normals": "surface_normals", "areas": "surface_areas"},
    "volume": {"pos": "volume_mesh_centers"},
}
_FIELDS = {"surface": "surface_fields", "volume": "volume_fields"}


def rank_rows(num_rows: int, align: int, rank: int, num_ranks: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` that rank ``rank`` of ``num_ranks`` reads: contiguous, in whole chunks.

    The ``ceil(num_rows / align)`` chunks are split as evenly as possible (the first ranks get one
    more): no two ranks decode the same chunk of an array chunked by ``align`` rows, and together
    they read every row once.

    >>> [rank_rows(10, 3, r, 3) for r in range(3)]
    [(0, 6), (6, 9), (9, 10)]
    """
    if align < 1 or num_ranks < 1 or not 0 <= rank < num_ranks:
        raise ValueError(f"need align >= 1 and 0 <= rank < num_ranks (got {align}, {rank}, {num_ranks})")
    num_chunks = -(-num_rows // align)
    base, extra = divmod(num_chunks, num_ranks)
    first = rank * base + min(rank, extra)
    count = base + (1 if rank < extra else 0)
    return min(first * align, num_rows), min((first + count) * align, num_rows)


def _npz_member(path: Path, name: str) -> NpyHeader | None:
    """Where the ``.npy`` data of an uncompressed ``.npz`` member starts (``None`` when compressed)."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(f"{name}.npy")
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)
        if local[:4] != b"PK\x03\x04":
            raise DatasetError(f"{path}: corrupt zip local header for {name}")
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        f.seek(info.header_offset + 30 + name_len + extra_len)
        version = np.lib.format.read_magic(f)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        if version not in read_header:
            raise DatasetError(f"{path}: {name} has unsupported .npy version {version}")
        shape, fortran, dtype = read_header[version](f)
        offset = f.tell()
    if np.dtype(dtype).hasobject:  # Python objects: a pickle inside, never read
        raise DatasetError(f"{path}: array {name!r} holds Python objects (dtype object); expected numbers")
    if fortran:
        return None
    return NpyHeader(tuple(shape), np.dtype(dtype), offset)


class CuratorRun:
    """One curator output file (``run_<i>.zarr`` or ``run_<i>.npz``): shapes, row ranges, metadata."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.format = "zarr" if self.path.suffix == ".zarr" else "npz"
        self._headers: dict[str, NpyHeader | None] = {}
        if self.format == "zarr":
            try:
                import zarr
            except ImportError as err:  # pragma: no cover - zarr is a dependency
                raise ImportError("reading curator .zarr runs needs zarr>=3: pip install zarr") from err
            try:
                self._group = zarr.open_group(self.path, mode="r")
            except Exception as err:
                raise DatasetError(f"{self.path}: not a readable Zarr group ({type(err).__name__}: {err})") from None
            self.arrays = set(self._group.array_keys())
        else:
            try:
                with zipfile.ZipFile(self.path) as zf:
                    names = zf.namelist()
            except (zipfile.BadZipFile, OSError) as err:
                raise DatasetError(f"{self.path}: not a readable .npz file ({err})") from None
            self.arrays = {n[: -len(".npy")] for n in names if n.endswith(".npy")}

    def __repr__(self) -> str:
        return f"CuratorRun({str(self.path)!r})"

    def require(self, name: str) -> None:
        if name not in self.arrays:
            raise DatasetError(f"{self.path.name}: array {name!r} missing (has {sorted(self.arrays)})")

    def shape(self, name: str) -> tuple[int, ...]:
        self.require(name)
        if self.format == "zarr":
            return tuple(self._group[name].shape)
        header = self._header(name)
        if header is not None:
            return header.shape
        return tuple(self._load_member(name).shape)

    def chunk_rows(self, name: str) -> int:
        """Rows per storage chunk of ``name`` (1 for an ``.npz``: any row range is one read)."""
        self.require(name)
        return int(self._group[name].chunks[0]) if self.format == "zarr" else 1

    def _header(self, name: str) -> NpyHeader | None:
        if name not in self._headers:
            self._headers[name] = _npz_member(self.path, name)
        return self._headers[name]

    def read(self, name: str, start: int | None = None, stop: int | None = None) -> np.ndarray:
        """Rows ``[start, stop)`` of array ``name`` (all rows by default), reading only those chunks."""
        self.require(name)
        if self.format == "zarr":
            array = self._group[name]
            if np.dtype(array.dtype).hasobject:  # decoding would unpickle: refused before any chunk is read
                raise DatasetError(f"{self.path}: array {name!r} holds Python objects (dtype object); expected numbers")
            return np.asarray(array[slice(start, stop)])
        header = self._header(name)
        if header is None:  # compressed member: no byte range to seek to
            return self._load_member(name)[slice(start, stop)]
        if not header.shape:  # a 0-d metadata scalar
            return self._load_member(name)
        lo, hi, _ = slice(start, stop).indices(header.shape[0])
        return read_rows(self.path, lo, max(lo, hi), header)

    def _load_member(self, name: str) -> np.ndarray:
        """A whole ``.npz`` member, numbers only: a member of Python objects is refused, never unpickled."""
        with np.load(self.path, allow_pickle=False) as npz:
            try:
                return np.asarray(npz[name])
            except ValueError as err:  # numpy: "Object arrays cannot be loaded when allow_pickle=False"
                raise DatasetError(f"{self.path}: array {name!r} cannot be read as numbers ({err})") from None

    def constant(self, key: str) -> float:
        """``stream_velocity`` or ``air_density`` from the run's metadata."""
        if self.format == "zarr":
            attrs = self._group.attrs.asdict()
            value = (attrs.get("physics_constants") or {}).get(key, attrs.get(key))
        else:
            value = None
            if key in self.arrays:
                value = self._load_member(key).item()
        if value is None:
            where = "attributes 'physics_constants' or top level" if self.format == "zarr" else "scalar arrays"
            raise DatasetError(f"{self.path.name}: metadata {key!r} missing (looked in {where})")
        return _positive(value, f"{self.path.name}: metadata {key!r}")


def _positive(value: object, name: str) -> float:
    """``value`` as a positive finite float (:func:`~meshshard._checks.check_positive_real`), else a DatasetError."""
    if isinstance(value, np.generic):
        value = value.item()
    try:
        return check_positive_real(value, name)
    except (TypeError, ValueError) as err:
        raise DatasetError(str(err)) from None


def _variables(spec: Sequence[str] | Mapping[str, str] | None, default: dict[str, str]) -> dict[str, int]:
    """Variable config -> ``{name: components}`` in column order."""
    from .drivaerml import FIELD_COMPONENTS

    if spec is None:
        spec = default
    if isinstance(spec, str):
        raise TypeError("fields must be a sequence of names or a dict {name: 'scalar' | 'vector'} (got str)")
    out: dict[str, int] = {}
    if isinstance(spec, Mapping):
        for name, kind in spec.items():
            if kind not in _COMPONENTS:
                raise ValueError(f"variable {name!r} must be 'scalar' or 'vector' (got {kind!r})")
            out[name] = _COMPONENTS[kind]
        return out
    for name in spec:
        if name not in FIELD_COMPONENTS:
            raise ValueError(
                f"variable {name!r} has no known component count: give fields as the curator's "
                f"variable config, {{name: 'scalar' | 'vector'}}"
            )
        out[name] = FIELD_COMPONENTS[name]
    return out


@dataclass(frozen=True)
class _Layout:
    surface: dict[str, int]
    volume: dict[str, int]


class CuratorDrivaerML:
    """DrivaerML runs in a PhysicsNeMo-Curator output folder, read as the raw reader reads them.

    Same interface as :class:`~meshshard.datasets.DrivaerML` where the pipeline uses it
    (``runs``, ``read_surface``, ``read_volume``, ``surface_fields``, ``volume_fields``) plus
    :meth:`body` (the STL for the signed distance). Arrays come back in meshshard's names and SI
    units (table in :mod:`meshshard.datasets._curator`).

    Every run is checked when the object is made (metadata and array shapes only, no data):
    a missing array, a field count that does not match the variable config, rows that disagree
    between arrays, or a folder that mixes ``.zarr`` and ``.npz`` runs raise one
    :class:`~meshshard.datasets.DatasetError` naming the run and the array.

    Parameters
    ----------
    root:
        The curator's output folder (``run_<i>.zarr`` or ``run_<i>.npz`` files).
    runs:
        Run numbers (default: all).
    fields:
        The curator's variable config: ``{"surface": {...}, "volume": {...}}`` of
        ``{name: "scalar" | "vector"}`` in column order, or lists of known DrivaerML names.
        Default: the curator's DrivaerML config.
    surface, volume:
        Which meshes to read (and check).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        runs: Sequence[int] | None = None,
        fields: Mapping[str, Any] | Sequence[str] | None = None,
        surface: bool = True,
        volume: bool = False,
    ) -> None:
        self.root = open_root(root, surface, volume)
        found: dict[int, list[Path]] = {}
        for p in self.root.iterdir():
            m = _RUN_FILE.match(p.name)
            if m:
                found.setdefault(int(m.group(1)), []).append(p)
        if not found:
            raw = any(p.is_dir() and re.match(r"^run_\d+$", p.name) for p in self.root.iterdir())
            hint = " (it holds raw run_<i>/ folders: use source='drivaerml')" if raw else ""
            raise FileNotFoundError(f"root: no run_<i>.zarr or run_<i>.npz in {self.root}{hint}")
        formats = {p.suffix for paths in found.values() for p in paths}
        if len(formats) > 1:
            both = sorted(r for r, paths in found.items() if len(paths) > 1)
            if both:
                raise DatasetError(f"run_{both[0]}: both run_{both[0]}.zarr and run_{both[0]}.npz in {self.root}")
            first = {fmt: min(r for r, ps in found.items() if ps[0].suffix == fmt) for fmt in formats}
            raise DatasetError(
                f"{self.root}: mixed formats, run_{first['.zarr']}.zarr and run_{first['.npz']}.npz; "
                "give a folder of one format"
            )
        if runs is None:
            self.runs = sorted(found)
        else:
            self.runs = [int(r) for r in runs]
            missing = sorted(set(self.runs) - set(found))
            if missing:
                raise FileNotFoundError(f"runs: no run_<i>.zarr/.npz in {self.root} for run(s) {missing}")
        self._paths = {r: found[r][0] for r in self.runs}
        self.format = next(iter(formats)).lstrip(".")
        self.surface = surface
        self.volume = volume
        if isinstance(fields, Mapping) and set(fields) <= {"surface", "volume"}:
            specs = {k: fields.get(k) for k in ("surface", "volume")}
        else:
            specs = {"surface": fields, "volume": fields}
        self._layout = _Layout(
            surface=_variables(specs["surface"], CURATOR_SURFACE_VARIABLES) if surface else {},
            volume=_variables(specs["volume"], CURATOR_VOLUME_VARIABLES) if volume else {},
        )
        self.surface_fields = tuple(self._layout.surface)
        self.volume_fields = tuple(self._layout.volume)
        for run in self.runs:
            self.check(run)

    def __len__(self) -> int:
        return len(self.runs)

    def __repr__(self) -> str:
        return f"CuratorDrivaerML(root={str(self.root)!r}, format={self.format!r}, runs={len(self.runs)})"

    @property
    def variables(self) -> dict[str, dict[str, str]]:
        """The variable config in use, in the curator's form (``{"surface": {name: "scalar" | "vector"}}``)."""
        kind_of = {c: k for k, c in _COMPONENTS.items()}
        return {
            kind: {name: kind_of[c] for name, c in getattr(self._layout, kind).items()}
            for kind in ("surface", "volume")
            if getattr(self, kind)
        }

    def open(self, run: int) -> CuratorRun:
        """The file of run number ``run``."""
        return CuratorRun(self._paths[run])

    def num_points(self, run: int, kind: str) -> int:
        return self.open(run).shape(_GEOMETRY[kind]["pos"])[0]

    def check(self, run: int) -> None:
        """Check one run's arrays against the variable config (shapes only)."""
        f = self.open(run)
        for kind in ("surface", "volume"):
            if not getattr(self, kind):
                continue
            variables = getattr(self._layout, kind)
            pos = _GEOMETRY[kind]["pos"]
            num = f.shape(pos)
            if len(num) != 2 or num[1] != 3:
                raise DatasetError(f"{f.path.name}: array {pos!r} must have shape (N, 3) (got {num})")
            for name in [*_GEOMETRY[kind].values(), _FIELDS[kind]]:
                shape = f.shape(name)
                if shape[0] != num[0]:
                    raise DatasetError(f"{f.path.name}: array {name!r} has {shape[0]} rows, {pos!r} has {num[0]}")
            columns = f.shape(_FIELDS[kind])
            want = sum(variables.values())
            got = columns[1] if len(columns) == 2 else 1
            if got != want:
                config = ", ".join(f"{n}:{c}" for n, c in variables.items())
                raise DatasetError(
                    f"{f.path.name}: array {_FIELDS[kind]!r} has {got} columns, the variable config "
                    f"({config}) needs {want}; pass fields= with the curator's {kind}_variables"
                )
        if self.volume:
            f.require("stl_coordinates")
            f.require("stl_faces")
        for key in ("stream_velocity", "air_density"):
            f.constant(key)

    def body(self, run: int) -> tuple[np.ndarray, np.ndarray]:
        """The STL body of ``run``: vertices (V, 3) float64 and triangles (F, 3) int64."""
        f = self.open(run)
        vertices = f.read("stl_coordinates").astype(np.float64).reshape(-1, 3)
        flat = f.read("stl_faces").reshape(-1)
        faces = np.rint(flat).astype(np.int64)
        if len(flat) % 3 or not np.array_equal(faces, flat) or (faces < 0).any() or (faces >= len(vertices)).any():
            raise DatasetError(
                f"{f.path.name}: array 'stl_faces' must be 3 F vertex indices in [0, {len(vertices)}) "
                f"(got {len(flat)} values in [{flat.min(initial=0)}, {flat.max(initial=0)}])"
            )
        return vertices, faces.reshape(-1, 3)

    def sdf(self, run: int, points: np.ndarray, backend: str = "auto", chunk_size: int = 1_000_000) -> np.ndarray:
        """Signed distance [m] of ``points`` (M, 3) to the run's body (positive outside), as the raw path's ``sdf``.

        Duplicated STL vertices are merged first (``trimesh``), as loading the ``.stl`` does on the
        raw path, so the sign comes from the same pseudonormals.
        """
        import trimesh

        from ._sdf import signed_distance

        vertices, faces = self.body(run)
        body = trimesh.Trimesh(vertices, faces, process=True)
        if len(body.faces) == 0:
            raise DatasetError(f"{self.open(run).path.name}: array 'stl_faces' holds no triangles")
        return signed_distance(points, body.vertices, body.faces, backend=backend, chunk_size=chunk_size)

    def _scales(self, f: CuratorRun, kind: str, columns: int) -> np.ndarray:
        velocity, density = f.constant("stream_velocity"), f.constant("air_density")
        if kind == "surface":
            return np.full(columns, density * velocity**2)
        vertices = f.read("stl_coordinates").astype(np.float64).reshape(-1, 3)
        extent = float((vertices.max(0) - vertices.min(0)).max()) if len(vertices) else 0.0
        # the body's length scales the turbulent viscosity: zero would silently zero those columns
        length = _positive(extent, f"{f.path.name}: the body's length (largest extent of 'stl_coordinates')")
        scale = np.full(columns, velocity * length)
        scale[:3] = velocity
        scale[3:4] = density * velocity**2
        return scale

    def _read(self, run: int, kind: str, rows: tuple[int, int] | None) -> dict[str, np.ndarray]:
        f = self.open(run)
        start, stop = rows if rows is not None else (None, None)
        out = {name: f.read(array, start, stop).astype(np.float64) for name, array in _GEOMETRY[kind].items()}
        if "areas" in out:
            out["areas"] = out["areas"].reshape(-1)
        values = f.read(_FIELDS[kind], start, stop).astype(np.float64)
        values = values if values.ndim == 2 else values.reshape(-1, 1)
        values *= self._scales(f, kind, values.shape[1])
        col = 0
        for name, width in getattr(self._layout, kind).items():
            block = values[:, col : col + width]
            out[name] = block[:, 0] if width == 1 else block
            col += width
        return out

    def read_surface(self, run: int, rows: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
        """Surface of ``run`` (rows ``[start, stop)`` only, if given): ``pos``, ``normals``, ``areas``, fields."""
        return self._read(run, "surface", rows)

    def read_volume(self, run: int, rows: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
        """Volume of ``run`` (rows ``[start, stop)`` only, if given): ``pos`` and fields (no ``sdf``)."""
        return self._read(run, "volume", rows)

    def read_sharded(
        self, run: int, kind: str, mesh: DeviceMesh, sdf_backend: str | None = None
    ) -> dict[str, ShardTensor]:
        """This rank's contiguous piece of ``kind`` of ``run`` as float32 ``ShardTensor`` s, in file order.

        Rank ``r`` of the mesh's last (domain) axis reads only rows :meth:`rank_rows` (whole
        chunks; no rank reads the whole array) and builds each tensor with every rank's row count,
        which every rank derives from the file's shapes and chunks. The pieces are in the curator's
        row order, not a geometric partition: hand ``"pos"`` to a parallel partitioner to
        redistribute. With ``sdf_backend`` (volume only), each rank also computes ``"sdf"`` of its
        own points against the body (read whole: it is small).

        **Communication:** none.
        """
        from meshshard.tensor import ShardTensor

        check_choice(kind, "kind", tuple(_GEOMETRY))
        if not getattr(self, kind):
            raise ValueError(f"this reader was made with {kind}=False")
        axis = mesh.ndim - 1
        num_ranks, rank = mesh.size(axis), mesh.get_local_rank(axis)
        ranges = [self.rank_rows(run, kind, r, num_ranks) for r in range(num_ranks)]
        sizes = [stop - start for start, stop in ranges]
        arrays = self._read(run, kind, ranges[rank])
        if sdf_backend is not None:
            if kind != "volume":
                raise ValueError("sdf_backend is for the volume (got kind='surface')")
            arrays["sdf"] = self.sdf(run, arrays["pos"], backend=sdf_backend)
        return {
            name: ShardTensor.from_local(
                torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)), mesh, sizes=sizes, dim=0
            )
            for name, values in arrays.items()
        }

    def rank_rows(self, run: int, kind: str, rank: int, num_ranks: int) -> tuple[int, int]:
        """The contiguous rows of ``kind`` that rank ``rank`` of ``num_ranks`` reads.

        Aligned to the largest chunk of the arrays of ``kind``; an array chunked more finely (the
        curator sizes chunks to ~1 MB per array, so ``areas`` has more rows per chunk than
        ``pos``) may decode one boundary chunk on two ranks.
        """
        f = self.open(run)
        pos = _GEOMETRY[kind]["pos"]
        align = max(f.chunk_rows(name) for name in (*_GEOMETRY[kind].values(), _FIELDS[kind]))
        return rank_rows(f.shape(pos)[0], align, rank, num_ranks)
