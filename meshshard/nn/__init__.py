"""Neural-network modules that run on plain tensors and on ShardTensors alike."""

from __future__ import annotations

from .domain_parallel import DomainParallel
from .meshgraphnet import MeshGraphNet, MeshGraphNetBlock
from .parallel import sync_gradients
from .physics_attention import PhysicsAttention
from .point_conv import PointConv
from .transolver import Transolver, TransolverBlock, chunked_forward

__all__ = [
    "DomainParallel",
    "MeshGraphNet",
    "MeshGraphNetBlock",
    "sync_gradients",
    "PhysicsAttention",
    "PointConv",
    "Transolver",
    "TransolverBlock",
    "chunked_forward",
]
