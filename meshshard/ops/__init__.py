"""Sharded operations built on the tensor core: ball query, kNN, slice tokens, the parallel partitioner."""

from __future__ import annotations

from .graph import ShardedEdges, ShardedGraph, cells_to_edges, shard_edges, simulate_graph_halo
from .metrics import relative_l2_error
from .neighbors import Neighbors, ball_query, knn
from .parallel_partition import repartition
from .slice_tokens import finish_slice_tokens, slice_sums, slice_tokens

__all__: list[str] = [
    "ShardedGraph", "ShardedEdges", "shard_edges", "cells_to_edges",
    "simulate_graph_halo", "Neighbors", "ball_query", "knn", "slice_tokens",
    "slice_sums", "finish_slice_tokens", "relative_l2_error", "repartition",
]
