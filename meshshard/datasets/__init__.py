"""DrivaerML data: a synthetic generator, a reader, a preprocessing pipeline and a sharded loader.

- :func:`make_synthetic_drivaerml` writes car-like runs in the real DrivaerML file layout;
- :class:`DrivaerML` reads a DrivaerML-layout folder into point clouds of cell centres;
- :class:`CuratorDrivaerML` reads PhysicsNeMo-Curator's DrivaerML outputs (Zarr or NumPy) the same
  way, in meshshard's names and units (``preprocess(..., source="physicsnemo-curator")``);
- :func:`preprocess` (CLI: ``meshshard preprocess``) partitions runs into a store where every
  rank's shard is one contiguous slice of each array;
- :class:`DrivaerMLDataset` loads whole samples, or under a device mesh only this rank's shard
  as ``ShardTensor`` s, with no communication.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from ..errors import DatasetError

#: public name -> submodule; imported on first use so that ``meshshard preprocess --help`` stays fast
_EXPORTS = {
    "CuratorDrivaerML": "_curator",
    "PreprocessOptions": "_preprocess",
    "PreprocessReport": "_preprocess",
    "load_meta": "_preprocess",
    "preprocess": "_preprocess",
    "FIELD_UNITS": "drivaerml",
    "SURFACE_FIELDS": "drivaerml",
    "VOLUME_FIELDS": "drivaerml",
    "DrivaerML": "drivaerml",
    "DrivaerMLDataset": "drivaerml_dataset",
    "RHO": "synthetic",
    "U_INF": "synthetic",
    "make_synthetic_drivaerml": "synthetic",
    # for the CLI and meshshard.testing (importable from the package, not user API: not in __all__)
    "CURATOR_SURFACE_VARIABLES": "_curator",
    "CURATOR_VOLUME_VARIABLES": "_curator",
    "preprocess_distributed": "_preprocess_dist",
}

if TYPE_CHECKING:  # pragma: no cover
    from ._curator import CuratorDrivaerML
    from ._preprocess import PreprocessOptions, PreprocessReport, load_meta, preprocess
    from .drivaerml import FIELD_UNITS, SURFACE_FIELDS, VOLUME_FIELDS, DrivaerML
    from .drivaerml_dataset import DrivaerMLDataset
    from .synthetic import RHO, U_INF, make_synthetic_drivaerml

__all__ = [
    "CuratorDrivaerML",
    "DatasetError",
    "DrivaerML",
    "DrivaerMLDataset",
    "FIELD_UNITS",
    "PreprocessOptions",
    "PreprocessReport",
    "RHO",
    "SURFACE_FIELDS",
    "U_INF",
    "VOLUME_FIELDS",
    "load_meta",
    "make_synthetic_drivaerml",
    "preprocess",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
