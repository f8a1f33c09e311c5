"""Neural-network modules that run on plain tensors and on ShardTensors alike.

The graph modules (``DomainParallel``, ``MeshGraphNet``, ``MeshGraphNetBlock``) import
torch-geometric, which takes seconds: they load on first use.
"""

from __future__ import annotations

from .._lazy import lazy_exports
from .parallel import sync_gradients
from .physics_attention import PhysicsAttention
from .point_conv import PointConv
from .pointnet import PointNetSurrogate
from .transolver import Transolver, TransolverBlock, TransolverConfig, chunked_forward

__all__ = [
    "DomainParallel",
    "MeshGraphNet",
    "MeshGraphNetBlock",
    "sync_gradients",
    "PhysicsAttention",
    "PointConv",
    "PointNetSurrogate",
    "Transolver",
    "TransolverBlock",
    "TransolverConfig",
    "chunked_forward",
]

_LAZY = {"DomainParallel": "domain_parallel", "MeshGraphNet": "meshgraphnet", "MeshGraphNetBlock": "meshgraphnet"}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
