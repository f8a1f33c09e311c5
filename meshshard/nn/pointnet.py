"""A PointNet-style surrogate in plain PyTorch: the proof that such code runs domain-parallel unchanged.

Nothing here knows about meshshard: ``Conv1d`` (kernel 1), ``BatchNorm1d``, ``ReLU``, a global max
over the points and the global feature repeated to every point, on the channels-first layout
``(B, C, N)``. Fed a ShardTensor sharded along the points (dim 2), every op dispatches to a sharding
rule: the convolutions are local, BatchNorm's statistics and the max pooling are all-reduced, and
the concatenation narrows the replicated global feature to this rank's points.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import faults
from .._checks import check_positive_int

__all__ = ["PointNetSurrogate"]


def _block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv1d(c_in, c_out, 1), nn.BatchNorm1d(c_out), nn.ReLU())


class PointNetSurrogate(nn.Module):
    """Per-point fields from per-point features, PointNet segmentation style.

    Parameters
    ----------
    in_dim, out_dim:
        Input features and predicted fields per point.
    width:
        Channels of the per-point layers.
    global_dim:
        Channels of the global feature (max over all points), appended to every point.

    Shapes: input ``(B, in_dim, N)``, output ``(B, out_dim, N)``.

    **Communication** (sharded along N): per ``BatchNorm1d`` one fused ``all_reduce`` forward and one
    backward; the global max pooling two ``all_reduce`` forward and one backward; nothing else.
    """

    def __init__(self, in_dim: int = 6, out_dim: int = 4, width: int = 64, global_dim: int = 128) -> None:
        super().__init__()
        for name, value in (("in_dim", in_dim), ("out_dim", out_dim), ("width", width), ("global_dim", global_dim)):
            check_positive_int(value, name)
        self.local = nn.Sequential(_block(in_dim, width), _block(width, width))
        self.to_global = _block(width, global_dim)
        self.head = nn.Sequential(_block(width + global_dim, width), nn.Conv1d(width, out_dim, 1))

    @faults.layer
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.local(x)
        g = self.to_global(h).max(dim=2, keepdim=True)[0]  # (B, global_dim, 1): the whole shape
        return self.head(torch.cat([h, g.repeat(1, 1, x.shape[2])], dim=1))
