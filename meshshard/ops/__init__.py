"""Sharded operations and the sharding rules of ``ShardTensor``.

Importing this package registers every rule (local, shape, reduction/contraction); the
point-cloud ops that need other ranks' data (ball query, kNN) live here too.
"""

from __future__ import annotations

from . import _rules_local, _rules_reduce, _rules_shape  # noqa: F401  (registration side effects)
from .graph import ShardedGraph, cells_to_edges, simulate_graph_halo
from .neighbors import Neighbors, ball_query, knn
from .physics_attention import finish_slice_tokens, slice_sums, slice_tokens

__all__: list[str] = [
    "ShardedGraph",
    "cells_to_edges",
    "simulate_graph_halo",
    "Neighbors", "ball_query", "knn", "slice_tokens", "slice_sums", "finish_slice_tokens"]
