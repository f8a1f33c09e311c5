"""Reading a mesh file with one clear error instead of VTK's console noise and an empty mesh.

VTK readers do not raise on a file they cannot parse (a text file named ``.vtp``, a truncated
download): they log errors to stderr and return an empty dataset, which then flows through a
pipeline as "0 cells". :func:`read_mesh` silences the logging, keeps the first error VTK reported,
and raises :class:`MeshReadError` when the file could not be read or holds nothing.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from pathlib import Path
from typing import Any

__all__ = ["MeshReadError", "read_mesh", "MESH_SUFFIXES"]

#: File types :func:`read_mesh` accepts (pyvista/VTK readers), lower case.
MESH_SUFFIXES = (".vtp", ".vtu", ".vtk", ".stl", ".ply", ".obj")


class MeshReadError(ValueError):
    """A mesh file is not readable (wrong format, truncated) or holds no points."""


def _clean(message: str) -> str:
    line = next((s for s in reversed(message.strip().splitlines()) if s.strip()), message)
    return re.sub(r"\s*\(0x[0-9a-fA-F]+\)", "", line).strip()


def read_mesh(path: str | os.PathLike[str]) -> Any:
    """Read a ``.vtp/.vtu/.vtk/.stl/.ply/.obj`` file with pyvista; raise one clear error when it fails.

    Raises
    ------
    FileNotFoundError
        ``path`` is not a file.
    MeshReadError
        The suffix is not a mesh format, VTK could not parse the file, or it holds no points.
    """
    import pyvista as pv
    from pyvista.core.utilities.observers import VtkErrorCatcher
    from vtkmodules.vtkCommonCore import vtkLogger

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not a file" if path.exists() else f"{path}: file not found")
    if path.suffix.lower() not in MESH_SUFFIXES:
        raise MeshReadError(f"{path}: not a mesh file (expected one of {', '.join(MESH_SUFFIXES)})")
    verbosity = vtkLogger.GetCurrentVerbosityCutoff()
    vtkLogger.SetStderrVerbosity(vtkLogger.VERBOSITY_OFF)
    logging.disable(logging.CRITICAL)  # pyvista re-logs VTK errors through the root logger
    try:
        with warnings.catch_warnings(), VtkErrorCatcher(raise_errors=False, send_to_logging=False) as caught:
            warnings.simplefilter("ignore")
            try:
                mesh = pv.read(str(path))
            except Exception as exc:  # VTK and pyvista raise many types
                raise MeshReadError(f"{path}: cannot read it ({type(exc).__name__}: {_clean(str(exc))})") from None
    finally:
        logging.disable(logging.NOTSET)
        vtkLogger.SetStderrVerbosity(verbosity)
    errors = [_clean(str(e)) for e in caught.events if "ERROR" in str(e).upper()]
    if errors:
        raise MeshReadError(f"{path}: not a valid {path.suffix} file, or truncated ({errors[0]})")
    if isinstance(mesh, pv.MultiBlock):
        mesh = mesh.combine()
    if mesh is None or mesh.n_points == 0:
        raise MeshReadError(f"{path}: the file holds no points (empty or truncated)")
    return mesh
