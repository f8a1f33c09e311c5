"""A small mesh graph shared by the graph and DomainParallel tests."""

from __future__ import annotations

import torch

from meshshard.ops import cells_to_edges

N, C = 41, 5
SIZES = {1: [41], 2: [30, 11], 3: [0, 25, 16], 4: [9, 0, 20, 12]}


def graph_data():
    """Positions, features and the edge list of a small mesh graph (global ids)."""
    g = torch.Generator().manual_seed(3)
    pos = torch.rand(N, 3, generator=g, dtype=torch.float64)
    x = torch.randn(N, C, generator=g, dtype=torch.float64)
    # a surface-like triangulation of a strip plus random long-range triangles (ghosts far away)
    tri = [[i, i + 1, i + 2] for i in range(N - 2)]
    tri += torch.randint(0, N, (8, 3), generator=g).tolist()
    edges = cells_to_edges(torch.tensor(tri))
    loops = torch.tensor([[4, 17, 30], [4, 17, 30]])  # a few self loops and a duplicate edge
    edges = torch.cat([edges, loops, edges[:, :1]], 1)
    return pos, x, edges
