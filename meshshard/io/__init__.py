"""VTK output and pictures of per-rank partitions, ready for ParaView.

:func:`write_partitions` writes one piece per rank (``.vtp``/``.vtu``) and the parallel index
(``.pvtp``/``.pvtu``) ParaView opens, with ``vtkProcessId``, global ids, fields and, given a ghost
radius, ghosts marked by ``vtkGhostType``. :func:`write_local_partition` does the same from a
distributed run, each rank writing its own piece (:func:`write_partition_index` indexes pieces
written without a process group). :func:`read_partitions` reads an index back (pyvista cannot
read ``.pvtp``). :func:`read_mesh` reads a mesh file or raises one clear error (VTK itself logs
and returns an empty mesh for a corrupt file); ``meshshard.io.read_cell_mesh`` (not user API) reads a VTK XML
file with chosen cell fields into the one cell container of io (``_data.Dataset`` / ``_data.Cells``),
for :mod:`meshshard.datasets`. :func:`render_partitions` draws an off-screen PNG coloured by rank;
:func:`plot_partition_quality` a bar chart of points and ghosts per rank.

>>> import meshshard as ms                                                  # doctest: +SKIP
>>> part = ms.partition.partition_mesh(car, 8)                             # doctest: +SKIP
>>> index = ms.io.write_partitions(car, part, "out/car.pvtp", ghost_radius=0.02)  # doctest: +SKIP
>>> ms.io.render_partitions(car, part, "out/car.png")                      # doctest: +SKIP

Not run as a doctest: ``car`` stands for a surface mesh of your own, and rendering needs an off-screen
OpenGL context.

Files: ``car.pvtp`` (open this in ParaView), ``car_0.vtp`` ... ``car_7.vtp`` (one per rank) and
``car.vtpd`` (``pyvista.read`` gives a PartitionedDataSet, one partition per rank).
"""

from __future__ import annotations

from ._read import MeshReadError, read_mesh, read_points
from ._read import read_cell_mesh as read_cell_mesh  # for meshshard.datasets (importable, not user API)
from ._render import plot_partition_quality, rank_colors, render_partitions
from ._write import read_partitions, write_local_partition, write_partition_index, write_partitions

__all__ = [
    "MeshReadError",
    "plot_partition_quality",
    "read_mesh",
    "read_points",
    "rank_colors",
    "render_partitions",
    "read_partitions",
    "write_local_partition",
    "write_partition_index",
    "write_partitions",
]
