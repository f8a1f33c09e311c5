"""meshshard: domain parallelism for point clouds and unstructured meshes on PyTorch.

>>> import meshshard as ms
>>> mesh = ms.init_mesh()                                   # doctest: +SKIP
>>> x = ms.ShardTensor.from_local(local, mesh, sizes=part.sizes.tolist())   # doctest: +SKIP

Not run as a doctest: ``init_mesh`` needs a process group (under ``torchrun``).

Names are imported on first use (PEP 562), so ``import meshshard`` and the ``meshshard`` command's
``--help`` do not pay for importing torch; the first ``ShardTensor``-related name imports the tensor
core (:mod:`meshshard.tensor`), which registers the sharding rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

__version__ = "0.1.0"

#: public name -> submodule that defines it
_EXPORTS = {
    "CollectiveError": "errors",
    "ShardingError": "errors",
    "UnsupportedOpError": "errors",
    "CommCounter": "comm",
    "HaloPlan": "halo",
    "init_mesh": "device_mesh",
    "ReplicatedTensor": "tensor",
    "ShardSpec": "tensor",
    "ShardTensor": "tensor",
    "scatter": "tensor",
    "register_rule": "tensor",
}
_SUBMODULES = ("datasets", "io", "nn", "ops", "partition", "planning", "training")

__all__ = [*sorted(_EXPORTS), *_SUBMODULES, "__version__"]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from . import datasets, io, nn, ops, partition, planning, training  # noqa: F401
    from .comm import CommCounter  # noqa: F401
    from .device_mesh import init_mesh  # noqa: F401
    from .errors import CollectiveError, ShardingError, UnsupportedOpError  # noqa: F401
    from .halo import HaloPlan  # noqa: F401
    from .tensor import ReplicatedTensor, ShardSpec, ShardTensor, register_rule, scatter  # noqa: F401


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, _SUBMODULES)
