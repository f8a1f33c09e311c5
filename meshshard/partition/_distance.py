"""The library's one squared distance: float64, coordinates summed in a fixed order.

It sits in the geometry layer because both the exact ghost sets (:mod:`._ghosts`) and the local
neighbour kernels (:mod:`meshshard.kernels`, which import it from here) decide the closed ball
``d2 <= r * r`` with it: the same pair is inside or outside everywhere, bit for bit.
"""

from __future__ import annotations

import torch

__all__ = ["sq_dist"]


def sq_dist(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Squared Euclidean distance in float64, summed over coordinates in a fixed order.

    The fixed order (``x`` then ``y`` then ``z``) makes the value independent of the device and of
    how a reduction kernel would group the terms, so ties and the closed-ball boundary are decided
    identically everywhere.

    **Shapes:** ``a``, ``b`` ``(..., D)`` (broadcastable) -> ``(...)`` float64.
    """
    diff = a.to(torch.float64) - b.to(torch.float64)
    diff.mul_(diff)
    out = diff[..., 0].clone()
    for c in range(1, diff.shape[-1]):
        out += diff[..., c]
    return out
