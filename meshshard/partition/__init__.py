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
the same partition of a sharded ``ShardTensor`` cloud on its ranks, without gathering it; it is
defined above the tensor core (:mod:`meshshard.ops.parallel_partition`, also ``ms.ops.repartition``)
and only named here. The building blocks the packages above share (``ghost_sets``, ``cell_centres``,
``rcb``...) are importable from this package too, outside ``__all__``: they are not user API.
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
    # The parallel partitioner lives above the tensor core, in meshshard.ops.parallel_partition (the
    # leading dot climbs to meshshard). The name stays here for the public API, resolved on first
    # access only: importing meshshard.partition never loads the layers above it.
    "repartition": ".ops.parallel_partition",
}
#: building blocks for the layers above (halo, kernels, io, datasets, planning, the parallel partitioner):
#: importable from the package, so nothing outside it imports a private module, but not user API (not in
#: ``__all__``)
_SHARED = {
    "POLY_SECTIONS": "_cells",
    "MeshArrays": "_cells",
    "cell_centres": "_cells",
    "mesh_arrays": "_cells",
    "sq_dist": "_distance",
    "ghost_sets": "_ghosts",
    "ShardedOps": "_rcb",
    "cum_fractions": "_rcb",
    "monotone_cuts": "_rcb",
    "rcb": "_rcb",
    "DEFAULT_BITS": "_sfc",
    "hilbert_keys": "_sfc",
    "morton_keys": "_sfc",
    "quantize": "_sfc",
    "check_method": "_validate",
    "quantize_weights": "_validate",
}
_EXPORTS.update(_SHARED)

if TYPE_CHECKING:  # pragma: no cover
    from ..ops.parallel_partition import repartition
    from ._cells import POLY_SECTIONS, MeshArrays, cell_centres, mesh_arrays  # noqa: F401
    from ._core import partition
    from ._distance import sq_dist  # noqa: F401
    from ._ghosts import ghost_sets  # noqa: F401
    from ._mesh import MeshPartition, partition_mesh
    from ._partition import Partition
    from ._quality import ghost_counts, neighbor_radius, quality, surface_to_volume_estimate
    from ._rcb import ShardedOps, cum_fractions, monotone_cuts, rcb  # noqa: F401
    from ._sfc import DEFAULT_BITS, hilbert_keys, morton_keys, quantize  # noqa: F401
    from ._validate import check_method, quantize_weights  # noqa: F401


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
