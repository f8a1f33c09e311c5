"""Error metrics that CFD surrogate papers report, sharded or not."""

from __future__ import annotations

import torch

__all__ = ["relative_l2_error"]


def relative_l2_error(
    pred: torch.Tensor,
    target: torch.Tensor,
    dim: int = 0,
    reduction: str = "none",
    eps: float = 0.0,
) -> torch.Tensor:
    """Relative L2 error ``||pred - target||_2 / ||target||_2`` over the points, per sample and per field.

    Parameters
    ----------
    pred, target:
        Tensors of the same shape, e.g. ``(N, C)`` (points, fields) or ``(B, N, C)``; plain tensors or
        ShardTensors sharded alike along the points.
    dim:
        The points dim, reduced by the norms (default 0).
    reduction:
        ``"none"``: one error per remaining index (``(C,)`` or ``(B, C)``: per sample and per field);
        ``"mean"``: their mean.
    eps:
        Added to ``||target||_2`` (0: a zero target gives ``inf``/``nan``, as the formula does).

    Returns
    -------
    torch.Tensor
        Replicated (the same on every rank) when the inputs are sharded along ``dim``.

    **Communication:** with ShardTensors sharded along ``dim``: one ``all_reduce`` of
    ``2 * result size`` elements (both squared norms fused); backward: one of the same size.
    """
    if reduction not in ("none", "mean"):
        raise ValueError(f"reduction must be 'none' or 'mean' (got {reduction!r})")
    if pred.shape != target.shape:
        raise ValueError(f"pred and target must have the same shape (got {tuple(pred.shape)} and "
                         f"{tuple(target.shape)})")
    d = dim % pred.dim()
    diff = pred - target
    sums = torch.stack([diff * diff, target * target]).sum(d + 1)  # one reduction for both norms
    err = sums[0].sqrt() / (sums[1].sqrt() + eps)
    return err.mean() if reduction == "mean" else err
