"""Neural-network modules that run on plain tensors and on ShardTensors alike."""

from __future__ import annotations

from .parallel import sync_gradients
from .physics_attention import PhysicsAttention
from .point_conv import PointConv
from .pointnet import PointNetSurrogate
from .transolver import Transolver, TransolverBlock, chunked_forward

__all__ = [
    "sync_gradients",
    "PhysicsAttention",
    "PointConv",
    "PointNetSurrogate",
    "Transolver",
    "TransolverBlock",
    "chunked_forward",
]
