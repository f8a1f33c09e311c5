"""Neural-network modules that run on plain tensors and on ShardTensors alike."""

from __future__ import annotations

from .parallel import sync_gradients

__all__ = ["sync_gradients"]
