"""Point clouds and backend lists shared by the kernel and neighbour-search tests."""

from __future__ import annotations

import torch

from meshshard.kernels import torch_cluster_available

BACKENDS = ["numba", "scipy", "grid"] + (["torch_cluster"] if torch_cluster_available() else [])
# torch-cluster's CPU radius returned no neighbour for a 1-point, 1-D lattice query in one CI build (not
# reproduced with another build of the same version): the property tests check our own kernels, the
# reference tests keep torch-cluster.
OWN_BACKENDS = [b for b in BACKENDS if b != "torch_cluster"]


def grid_cloud(n, seed, dim=3, spacing=0.25, span=8, dup=0.2):
    """Points on a lattice (exact in float32: many exact-radius ties) with duplicates, in clusters."""
    g = torch.Generator().manual_seed(seed)
    pts = torch.randint(0, span, (n, dim), generator=g).float() * spacing
    pts[: n // 3] *= 0.5  # a dense cluster
    ndup = int(n * dup)
    src = torch.randint(0, n, (ndup,), generator=g)
    pts[n - ndup :] = pts[src]
    return pts
