"""Point clouds and backend lists shared by the kernel and neighbour-search tests."""

from __future__ import annotations

import pytest
import torch

from meshshard.kernels import torch_cluster_available

#: Why torch-cluster's tests skip: it is an opt-in peer (it compiles from source, ~31 min on 2 cores).
NO_TORCH_CLUSTER = "torch-cluster (an opt-in peer) is not installed: `make test-peers` (or `make test PEERS=1`) " \
    "builds it once (~31 min on 2 cores) and runs these tests"
needs_torch_cluster = pytest.mark.skipif(not torch_cluster_available(), reason=NO_TORCH_CLUSTER)

# torch-cluster's CPU radius returned no neighbour for a 1-point, 1-D lattice query in one CI build (not
# reproduced with another build of the same version): the property tests check our own kernels, the
# reference tests keep torch-cluster.
OWN_BACKENDS = ["numba", "scipy", "grid"]
BACKENDS = [*OWN_BACKENDS, pytest.param("torch_cluster", marks=needs_torch_cluster)]


def grid_cloud(n, seed, dim=3, spacing=0.25, span=8, dup=0.2):
    """Points on a lattice (exact in float32: many exact-radius ties) with duplicates, in clusters."""
    g = torch.Generator().manual_seed(seed)
    pts = torch.randint(0, span, (n, dim), generator=g).float() * spacing
    pts[: n // 3] *= 0.5  # a dense cluster
    ndup = int(n * dup)
    src = torch.randint(0, n, (ndup,), generator=g)
    pts[n - ndup :] = pts[src]
    return pts
