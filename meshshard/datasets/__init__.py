"""DrivaerML data: a synthetic generator, a reader, a preprocessing pipeline and a sharded loader.

- :func:`make_synthetic_drivaerml` writes car-like runs in the real DrivaerML file layout;
- :class:`DrivaerML` reads a DrivaerML-layout folder into point clouds of cell centres;
"""

from __future__ import annotations

from ._vtk import DatasetError
from .drivaerml import FIELD_UNITS, SURFACE_FIELDS, VOLUME_FIELDS, DrivaerML
from .synthetic import RHO, U_INF, make_synthetic_drivaerml

__all__ = [
    "DatasetError",
    "DrivaerML",
    "FIELD_UNITS",
    "RHO",
    "SURFACE_FIELDS",
    "U_INF",
    "VOLUME_FIELDS",
    "make_synthetic_drivaerml",
]
