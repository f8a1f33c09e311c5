"""Geometric partitioners: split a point cloud or mesh into spatially compact, contiguous parts.

>>> import torch
>>> from meshshard.partition import partition, quality, Partition
>>> points = torch.rand(1000, 3, generator=torch.Generator().manual_seed(0))
>>> part = partition(points, 4, method="rcb")
>>> part.sizes.tolist(), part.offsets.tolist()
([250, 250, 250, 250], [0, 250, 500, 750, 1000])
>>> part.owner[part.perm[250:253]].tolist()     # owner: the part of each original point
[1, 1, 1]

A :class:`Partition` is a permutation (``perm``: new order -> original index) plus per-part
``sizes``; part ``r`` is ``perm[offsets[r]:offsets[r + 1]]``. Methods: ``"rcb"`` (recursive
coordinate bisection, a k-d tree; the default), ``"morton"`` and ``"hilbert"`` (space-filling
curves). :func:`quality` measures balance and ghost counts exactly. :func:`repartition` computes
the same partition of a sharded ``ShardTensor`` cloud on its ranks, without gathering it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

#: public name -> submodule; imported on first use so that ``meshshard partition --help`` stays fast
_EXPORTS = {
    "partition": "_core",
    "MeshPartition": "_mesh",
    "partition_mesh": "_mesh",
    "Partition": "_partition",
    "ghost_counts": "_quality",
    "neighbor_radius": "_quality",
    "quality": "_quality",
    "surface_to_volume_estimate": "_quality",
    "repartition": "_repartition",  # needs the ShardTensor core: loaded only when asked for
}

if TYPE_CHECKING:  # pragma: no cover
    from ._core import partition
    from ._mesh import MeshPartition, partition_mesh
    from ._partition import Partition
    from ._quality import ghost_counts, neighbor_radius, quality, surface_to_volume_estimate
    from ._repartition import repartition


__all__ = [
    "MeshPartition",
    "Partition",
    "ghost_counts",
    "neighbor_radius",
    "partition",
    "partition_mesh",
    "quality",
    "repartition",
    "surface_to_volume_estimate",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
