"""Reader for folders in the DrivaerML layout (real downloads or :func:`make_synthetic_drivaerml`)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import DatasetError
from ..io import read_cell_mesh
from ._geometry import polygon_normals_areas

__all__ = ["DrivaerML", "SURFACE_FIELDS", "VOLUME_FIELDS", "FIELD_UNITS", "FIELD_COMPONENTS", "read_csv_row"]

#: Cell-data fields of ``boundary_i.vtp`` in DrivaerML.
SURFACE_FIELDS: tuple[str, ...] = ("pMeanTrim", "CpMeanTrim", "wallShearStressMeanTrim")
#: Cell-data fields of ``volume_i.vtu`` in DrivaerML.
VOLUME_FIELDS: tuple[str, ...] = ("UMeanTrim", "pMeanTrim", "nutMeanTrim")
#: Units of the DrivaerML fields and of the derived geometry.
FIELD_UNITS: dict[str, str] = {
    "pMeanTrim": "Pa",
    "CpMeanTrim": "1",
    "wallShearStressMeanTrim": "Pa",
    "UMeanTrim": "m/s",
    "nutMeanTrim": "m^2/s",
    "pos": "m",
    "normals": "1",
    "areas": "m^2",
    "sdf": "m",
}
#: Number of components of the known fields (checked on read).
FIELD_COMPONENTS: dict[str, int] = {
    "pMeanTrim": 1,
    "CpMeanTrim": 1,
    "wallShearStressMeanTrim": 3,
    "UMeanTrim": 3,
    "nutMeanTrim": 1,
}

_RUN_DIR = re.compile(r"^run_(\d+)$")


def read_csv_row(path: str | os.PathLike[str]) -> dict[str, float]:
    """Read a one-row CSV with a header (``force_mom_i.csv``, ``geo_parameters_i.csv``) as floats."""
    path = Path(path)
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if len(lines) < 2:
        raise DatasetError(f"{path}: expected a header row and a value row (got {len(lines)} non-empty lines)")
    names = [n.strip() for n in lines[0].split(",")]
    try:
        values = [float(v) for v in lines[1].split(",")]
    except ValueError as err:
        raise DatasetError(f"{path}: non-numeric value in row 2 ({err})") from None
    if len(values) != len(names):
        raise DatasetError(f"{path}: {len(names)} column names but {len(values)} values")
    return dict(zip(names, values))


def _select_fields(
    fields: Sequence[str] | Mapping[str, Sequence[str]] | None, kind: str, default: tuple[str, ...]
) -> tuple[str, ...]:
    if fields is None:
        return default
    if isinstance(fields, Mapping):
        unknown = set(fields) - {"surface", "volume"}
        if unknown:
            raise ValueError(f"fields keys must be 'surface' or 'volume' (got {sorted(unknown)})")
        chosen = fields.get(kind, default)
    elif isinstance(fields, str):
        raise TypeError("fields must be a sequence of names or a dict {'surface': [...], 'volume': [...]} (got str)")
    else:
        chosen = fields
    return tuple(chosen)


def open_root(root: str | os.PathLike[str], surface: bool, volume: bool) -> Path:
    """``root`` as a Path after the checks every DrivaerML reader makes (raw folders and curator output)."""
    path = Path(root)
    if not path.is_dir():
        raise FileNotFoundError(f"root: {path} is not a directory")
    if not (surface or volume):
        raise ValueError("at least one of surface, volume must be True (got both False)")
    return path


class DrivaerML:
    """Runs of a DrivaerML-layout folder as point clouds of cell centres.

    Every run ``i`` is a folder ``root/run_i`` with ``boundary_i.vtp`` (surface),
    ``volume_i.vtu`` or its pieces ``volume_i.vtu.NN.part`` (volume), ``force_mom_i.csv`` and
    ``geo_parameters_i.csv``. DrivaerML stores fields as **cell data**; a sample turns each cell
    into a point at its vertex-mean centre.

    Parameters
    ----------
    root:
        The folder holding ``run_i`` sub-folders.
    runs:
        Run numbers to use (default: every ``run_i`` folder, sorted by ``i``).
    fields:
        Field names to read: a list (for every loaded kind) or ``{"surface": [...], "volume": [...]}``.
        Default: :data:`SURFACE_FIELDS` and :data:`VOLUME_FIELDS`.
    surface, volume:
        Which meshes to load per sample.

    Sample layout (``ds[k]``), float32 tensors:

    - ``"run"``: the run number ``i``;
    - ``"surface"``: ``"pos"`` (N, 3) cell centres [m], ``"normals"`` (N, 3) outward unit normals,
      ``"areas"`` (N,) [m^2], and the fields: ``pMeanTrim`` (N,) [Pa], ``CpMeanTrim`` (N,),
      ``wallShearStressMeanTrim`` (N, 3) [Pa];
    - ``"volume"``: ``"pos"`` (M, 3) cell centres, ``UMeanTrim`` (M, 3) [m/s], ``pMeanTrim`` (M,) [Pa],
      ``nutMeanTrim`` (M,) [m^2/s];
    - ``"forces"``, ``"geo_parameters"``: the CSV rows as ``dict[str, float]`` when the files exist.

    Examples
    --------
    >>> import tempfile, meshshard as ms
    >>> root = tempfile.mkdtemp()
    >>> _ = ms.datasets.make_synthetic_drivaerml(root, 2, surface_cells=2000, volume_cells=0)
    >>> ds = ms.datasets.DrivaerML(root)
    >>> len(ds), ds[0]["run"], ds[0]["surface"]["pos"].shape[1]
    (2, 1, 3)
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        runs: Sequence[int] | None = None,
        fields: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
        surface: bool = True,
        volume: bool = False,
    ) -> None:
        self.root = open_root(root, surface, volume)
        found = sorted(int(m.group(1)) for p in self.root.iterdir() if p.is_dir() and (m := _RUN_DIR.match(p.name)))
        if runs is None:
            if not found:
                curated = any(re.match(r"^run_\d+\.(zarr|npz)$", p.name) for p in self.root.iterdir())
                hint = " (it holds PhysicsNeMo-Curator run_<i>.zarr/.npz: use source='physicsnemo-curator')"
                raise FileNotFoundError(f"root: no run_<i> folders in {self.root}{hint if curated else ''}")
            self.runs = found
        else:
            self.runs = [int(r) for r in runs]
            missing = sorted(set(self.runs) - set(found))
            if missing:
                raise FileNotFoundError(f"runs: no folder run_<i> in {self.root} for run(s) {missing}")
        self.surface = surface
        self.volume = volume
        self.surface_fields = _select_fields(fields, "surface", SURFACE_FIELDS) if surface else ()
        self.volume_fields = _select_fields(fields, "volume", VOLUME_FIELDS) if volume else ()

    def __len__(self) -> int:
        return len(self.runs)

    def __repr__(self) -> str:
        runs = list(self.runs)
        if len(runs) > 8 and runs == list(range(runs[0], runs[0] + len(runs))):
            shown = f"range({runs[0]}, {runs[-1] + 1})"
        else:
            shown = str(runs)
        return f"DrivaerML({str(self.root)!r}, surface={self.surface}, volume={self.volume}, runs={shown})"

    def run_dir(self, run: int) -> Path:
        """Folder of run number ``run``."""
        return self.root / f"run_{run}"

    def surface_path(self, run: int) -> Path:
        return self.run_dir(run) / f"boundary_{run}.vtp"

    def stl_path(self, run: int) -> Path:
        return self.run_dir(run) / f"drivaer_{run}.stl"

    def volume_parts(self, run: int) -> tuple[Path, list[Path]]:
        """``volume_i.vtu`` and, when it is absent, its sorted ``.NN.part`` pieces."""
        path = self.run_dir(run) / f"volume_{run}.vtu"
        if path.is_file():
            return path, []
        parts = sorted(self.run_dir(run).glob(f"volume_{run}.vtu.*.part"))
        if not parts:
            raise FileNotFoundError(f"{path}: file not found (and no {path.name}.NN.part pieces)")
        return path, parts

    def read_surface(self, run: int, fields: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Surface of ``run`` as numpy arrays: ``pos``, ``normals``, ``areas`` (float64) and fields."""
        names = self.surface_fields if fields is None else tuple(fields)
        mesh = read_cell_mesh(self.surface_path(run), names, FIELD_COMPONENTS)
        cells = mesh.cells
        normals, areas = polygon_normals_areas(mesh.points, cells.connectivity, cells.offsets)
        out = {
            "pos": mesh.centres(),
            "normals": normals,
            "areas": areas,
        }
        out.update(mesh.cell_data)
        return out

    def read_volume(self, run: int, fields: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Volume of ``run`` as numpy arrays: ``pos`` (float64 cell centres) and fields."""
        names = self.volume_fields if fields is None else tuple(fields)
        path, parts = self.volume_parts(run)
        mesh = read_cell_mesh(path, names, FIELD_COMPONENTS, parts=parts)
        out = {"pos": mesh.centres()}
        out.update(mesh.cell_data)
        return out

    def forces(self, run: int) -> dict[str, float]:
        """The row of ``force_mom_i.csv``."""
        path = self.run_dir(run) / f"force_mom_{run}.csv"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: file not found")
        return read_csv_row(path)

    def geo_parameters(self, run: int) -> dict[str, float]:
        """The row of ``geo_parameters_i.csv``."""
        path = self.run_dir(run) / f"geo_parameters_{run}.csv"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: file not found")
        return read_csv_row(path)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
            raise TypeError(f"index must be an int (got {type(index).__name__})")
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} runs")
        run = self.runs[index]
        sample: dict[str, Any] = {"run": run}
        if self.surface:
            sample["surface"] = _to_tensors(self.read_surface(run))
        if self.volume:
            sample["volume"] = _to_tensors(self.read_volume(run))
        for key, name in (("forces", "force_mom"), ("geo_parameters", "geo_parameters")):
            path = self.run_dir(run) / f"{name}_{run}.csv"
            if path.is_file():
                sample[key] = read_csv_row(path)
        return sample


def _to_tensors(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in arrays.items()}
