"""Write small PhysicsNeMo-Curator outputs (Zarr or NumPy) from DrivaerML-layout runs, for tests.

Built from the curator's documented schema (``examples/external_aerodynamics`` of
``NVIDIA/physicsnemo-curator``: ``schemas.py``, the DrivaerML variable configs, the Zarr and NumPy
sinks), not from its code, and without its dependencies: the geometry comes from meshshard's own
reader, so the same synthetic runs can be read both ways and compared. What the curator does and
this writer repeats: fields concatenated in variable-config order; surface fields divided by
``rho U^2``; volume columns ``0:3`` by ``U``, ``3`` by ``rho U^2``, ``4:`` by ``U L`` (``L`` the
largest extent of the STL); normals renormalised; every array float32 (``stl_faces`` too); volume
rows shuffled with ``numpy.random.default_rng(42)``; Zarr arrays chunked to ``chunk_mb`` with the
sharding codec and Blosc-zstd level 5 (byte shuffle); the ``.npz`` written with ``np.savez``
(uncompressed) with ``filename``, ``stream_velocity`` and ``air_density`` scalars.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CURATOR_AIR_DENSITY", "CURATOR_STREAM_VELOCITY", "write_curator_runs", "volume_shuffle"]

#: The curator's constants for DrivaerML (``PhysicsConstantsCarAerodynamics``).
CURATOR_AIR_DENSITY = 1.205
CURATOR_STREAM_VELOCITY = 30.0


def volume_shuffle(num_rows: int, seed: int = 42) -> np.ndarray:
    """The curator's volume row shuffle: curator row ``k`` is raw cell ``volume_shuffle(n)[k]``."""
    return np.random.default_rng(seed).permutation(num_rows)


def _zarr_layout(array: np.ndarray, chunk_mb: float, chunks_per_shard: int) -> tuple[tuple, tuple]:
    row_bytes = array.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
    rows = max(1, min(len(array), int(chunk_mb * 2**20) // row_bytes))
    shard_rows = min(rows * chunks_per_shard, -(-len(array) // rows) * rows)
    return (rows, *array.shape[1:]), (shard_rows, *array.shape[1:])


def write_curator_runs(
    raw_root: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    fmt: str = "zarr",
    surface: bool = True,
    volume: bool = True,
    runs: Sequence[int] | None = None,
    variables: Mapping[str, Mapping[str, str]] | None = None,
    chunk_mb: float = 1.0,
    chunks_per_shard: int = 1000,
    air_density: float = CURATOR_AIR_DENSITY,
    stream_velocity: float = CURATOR_STREAM_VELOCITY,
    metadata_version: str = "1.1",
) -> list[Path]:
    """Write ``run_<i>.zarr`` (or ``.npz``) for every ``run_<i>`` of a DrivaerML-layout folder.

    ``variables`` is the curator's variable config ``{"surface": {name: "scalar" | "vector"},
    "volume": {...}}`` (default: its DrivaerML config). ``metadata_version="1.0"`` writes the
    constants as top-level Zarr attributes instead of ``physics_constants``. Returns the paths.
    """
    import trimesh

    from meshshard.datasets import CURATOR_SURFACE_VARIABLES, CURATOR_VOLUME_VARIABLES
    from meshshard.datasets.drivaerml import DrivaerML

    if fmt not in ("zarr", "npz"):
        raise ValueError(f"fmt must be 'zarr' or 'npz' (got {fmt!r})")
    variables = dict(variables or {})
    surface_vars = list(variables.get("surface", CURATOR_SURFACE_VARIABLES))
    volume_vars = list(variables.get("volume", CURATOR_VOLUME_VARIABLES))
    raw = DrivaerML(raw_root, runs=runs, fields={"surface": surface_vars, "volume": volume_vars}, volume=volume)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    q = air_density * stream_velocity**2
    constants = {"air_density": air_density, "stream_velocity": stream_velocity}
    written = []
    for run in raw.runs:
        arrays = _stl_arrays(trimesh.load(raw.stl_path(run), force="mesh"))
        vertices = arrays["stl_coordinates"]
        if surface:
            arrays |= _surface_arrays(raw.read_surface(run), surface_vars, q)
        if volume:
            arrays |= _volume_arrays(raw.read_volume(run), volume_vars, vertices, q, stream_velocity)
        name = f"run_{run}"
        meta = _run_meta(name, vertices, arrays, surface, volume)
        if fmt == "zarr":
            path = out / f"{name}.zarr"
            meta |= {"physics_constants": constants} if metadata_version == "1.1" else constants
            _write_zarr(path, meta, arrays, chunk_mb, chunks_per_shard)
        else:
            path = out / f"{name}.npz"
            with open(path, "wb") as f:
                np.savez(f, **arrays, filename=name, **constants)
        written.append(path)
    return written


def _stl_arrays(body: Any) -> dict[str, np.ndarray]:
    """The body's STL arrays as the curator stores them (float32, faces flattened)."""
    return {
        "stl_coordinates": np.asarray(body.vertices, dtype=np.float32),
        "stl_faces": np.asarray(body.faces).reshape(-1).astype(np.float32),
        "stl_centers": np.asarray(body.triangles_center, dtype=np.float32),
        "stl_areas": np.asarray(body.area_faces, dtype=np.float32),
    }


def _surface_arrays(s: Mapping[str, np.ndarray], names: Sequence[str], q: float) -> dict[str, np.ndarray]:
    """Surface centres, unit normals, areas and the fields over the dynamic pressure ``q``."""
    fields = np.concatenate([s[n].reshape(len(s[n]), -1).astype(np.float32) for n in names], axis=1)
    normals = s["normals"] / np.linalg.norm(s["normals"], axis=1, keepdims=True)
    return {
        "surface_mesh_centers": s["pos"].astype(np.float32),
        "surface_normals": normals.astype(np.float32),
        "surface_areas": s["areas"].astype(np.float32),
        "surface_fields": (fields / np.float32(q)).astype(np.float32),
    }


def _volume_arrays(
    v: Mapping[str, np.ndarray], names: Sequence[str], vertices: np.ndarray, q: float, stream_velocity: float
) -> dict[str, np.ndarray]:
    """Volume centres and non-dimensional fields (velocity, pressure, turbulent viscosity), shuffled."""
    fields = np.concatenate([v[n].reshape(len(v[n]), -1).astype(np.float32) for n in names], axis=1)
    length = np.float32((vertices.max(0) - vertices.min(0)).max())
    fields[:, :3] /= np.float32(stream_velocity)
    fields[:, 3:4] /= np.float32(q)
    fields[:, 4:] /= np.float32(stream_velocity) * length
    shuffle = volume_shuffle(len(fields))
    return {"volume_mesh_centers": v["pos"].astype(np.float32)[shuffle], "volume_fields": fields[shuffle]}


def _run_meta(
    name: str, vertices: np.ndarray, arrays: Mapping[str, np.ndarray], surface: bool, volume: bool
) -> dict[str, Any]:
    """The curator's per-run metadata: file name, kind, body bounds and STL sizes."""
    lo, hi = vertices.min(0).tolist(), vertices.max(0).tolist()
    return {
        "filename": name,
        "dataset_type": "combined" if surface and volume else ("surface" if surface else "volume"),
        "x_bound": [lo[0], hi[0]],
        "y_bound": [lo[1], hi[1]],
        "z_bound": [lo[2], hi[2]],
        "num_points": len(vertices),
        "num_faces": len(arrays["stl_faces"]),
        "decimation_reduction": None,
        "decimation_algo": None,
    }


def _write_zarr(
    path: Path, meta: dict[str, Any], arrays: Mapping[str, np.ndarray], chunk_mb: float, chunks_per_shard: int
) -> None:
    """One run's Zarr group: the metadata as attributes, each array Blosc-zstd compressed, chunked and sharded."""
    import zarr

    meta = {**meta, "zarr_format": zarr.__version__}
    group = zarr.open_group(zarr.storage.LocalStore(path), mode="w")
    group.attrs.update(meta)
    codec = zarr.codecs.BloscCodec(cname="zstd", clevel=5, shuffle=zarr.codecs.BloscShuffle.shuffle)
    for key, values in arrays.items():
        chunks, shards = _zarr_layout(values, chunk_mb, chunks_per_shard)
        group.create_array(name=key, data=values, chunks=chunks, shards=shards, compressors=codec)
