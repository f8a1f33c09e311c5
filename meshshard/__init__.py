"""meshshard: domain parallelism for point clouds and unstructured meshes on PyTorch.

>>> import meshshard as ms
>>> mesh = ms.init_mesh()                                   # doctest: +SKIP
>>> x = ms.ShardTensor.from_local(local, mesh, sizes=part.sizes.tolist())   # doctest: +SKIP
"""

from __future__ import annotations

from . import nn, ops
from .comm import CommCounter
from .errors import CollectiveError, ShardingError, UnsupportedOpError
from .halo import HaloPlan
from .mesh import init_mesh
from .tensor import ReplicatedTensor, ShardSpec, ShardTensor, register_rule, scatter

__version__ = "0.1.0"

__all__ = [
    "CollectiveError",
    "CommCounter",
    "HaloPlan",
    "ReplicatedTensor",
    "ShardSpec",
    "ShardTensor",
    "ShardingError",
    "UnsupportedOpError",
    "datasets",
    "init_mesh",
    "io",
    "nn",
    "ops",
    "partition",
    "register_rule",
    "scatter",
    "__version__",
]

_LAZY = ("datasets", "io", "partition")  # heavier imports (VTK, trimesh), loaded on first use


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'meshshard' has no attribute {name!r}")
