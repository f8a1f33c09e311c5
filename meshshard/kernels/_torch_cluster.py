"""Candidate pairs from ``torch_cluster.radius`` (optional dependency).

torch-cluster truncates each query's list at ``max_num_neighbors`` in traversal order; we ask for
every point (``max_num_neighbors = N``) and normalise order and truncation ourselves.
"""

from __future__ import annotations

import math

import torch

from ._common import INFLATE

__all__ = ["available", "cluster_radius_candidates"]


def available() -> bool:
    try:
        import torch_cluster  # noqa: F401
    except ImportError:
        return False
    return True


def cluster_radius_candidates(
    points: torch.Tensor, queries: torch.Tensor, r2: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate ``(query_row, point_row)`` pairs; per-query radii use their maximum."""
    try:
        import torch_cluster
    except ImportError as exc:  # pragma: no cover - exercised only without the package
        raise ImportError(
            "backend='torch_cluster' needs torch-cluster: pip install torch-cluster "
            "(or pip install 'meshshard[cluster]')"
        ) from exc
    r2max = float(r2.max()) if isinstance(r2, torch.Tensor) else float(r2)
    radius = math.nextafter(r2max**0.5 * (1 + INFLATE), math.inf)  # > 0: torch-cluster's test is strict
    x = points.detach().to(torch.float64)
    y = queries.detach().to(torch.float64)
    edge = torch_cluster.radius(x, y, radius, max_num_neighbors=max(points.shape[0], 1))
    return edge[0].long(), edge[1].long()
