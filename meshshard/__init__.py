"""meshshard: domain parallelism for point clouds and unstructured meshes on PyTorch.

>>> import meshshard as ms
>>> mesh = ms.init_mesh()                                   # doctest: +SKIP
>>> x = ms.ShardTensor.from_local(local, mesh, sizes=part.sizes.tolist())   # doctest: +SKIP
"""

from __future__ import annotations

from . import ops  # noqa: F401  (registers the sharding rules)
from . import nn
from .comm import CommCounter
from .errors import ShardingError, UnsupportedOpError
from .mesh import init_mesh
from .tensor import ReplicatedTensor, ShardSpec, ShardTensor, scatter

__version__ = "0.1.0"

__all__ = [
    "CommCounter",
    "ReplicatedTensor",
    "ShardSpec",
    "ShardTensor",
    "ShardingError",
    "UnsupportedOpError",
    "init_mesh",
    "nn",
    "ops",
    "scatter",
    "__version__",
]
