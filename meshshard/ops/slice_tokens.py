"""The slice reduction of Transolver's physics attention, with one fused all-reduce.

Transolver (Wu et al., ICML 2024) summarises ``N`` points into ``M`` *slice tokens*

.. math::

    z_{g} = \\frac{\\sum_{n} w_{ng} f_{n}}{\\sum_{n} w_{ng} + \\varepsilon},

where ``w`` are the slice weights (a softmax over slices, per point) and ``f`` the point
features. The two sums over points are the only place where a point-sharded Transolver needs other
ranks' data. :func:`slice_tokens` computes both **unnormalised** sums on the local shard, all-reduces
them **together in one collective** (concatenated into one buffer), and only then divides, adding
``eps`` once to the global weight sum. This gives the single-process tokens exactly, for any number
of ranks and any (uneven, even empty) shards; the division after the reduction is what makes it
exact, since per-rank normalised tokens cannot be averaged back into the global ones.

For evaluation in chunks (:func:`meshshard.nn.chunked_forward`) the two steps are exposed
separately: :func:`slice_sums` accumulates local sums chunk by chunk with no communication, and
:func:`finish_slice_tokens` reduces and normalises them once.
"""

from __future__ import annotations

import torch

from .. import comm, faults
from ..errors import ShardingError
from ..tensor import ShardSpec, ShardTensor, local_of, replicated

__all__ = ["slice_tokens", "slice_sums", "finish_slice_tokens"]


def _check_pair(weights: torch.Tensor, features: torch.Tensor) -> ShardSpec | None:
    """The common ShardSpec of the operands (or ``None`` for plain tensors), after validation."""
    for name, t in (("weights", weights), ("features", features)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"Expected '{name}' to be a torch.Tensor (got {type(t).__name__})")
        if t.dim() < 2:
            raise ValueError(
                f"{name} must have shape (..., N, *) with at least 2 dims (got shape {tuple(t.shape)})"
            )
    if weights.shape[:-1] != features.shape[:-1]:
        raise ValueError(
            "weights (..., N, M) and features (..., N, C) must agree on every dim but the last "
            f"(got {tuple(weights.shape)} and {tuple(features.shape)})"
        )
    w_sharded, f_sharded = isinstance(weights, ShardTensor), isinstance(features, ShardTensor)
    if w_sharded != f_sharded:
        raise TypeError("weights and features must both be ShardTensors or both be plain tensors")
    if not w_sharded:
        return None
    spec = weights.spec
    for name, t in (("weights", weights), ("features", features)):
        if t.spec.dim != t.dim() - 2:
            raise ValueError(
                f"{name} must be sharded on the point dim {t.dim() - 2} (-2) (got shard dim {t.spec.dim})"
            )
    if not spec.same_sharding(features.spec):
        raise ShardingError(
            f"[rank {spec.rank}] slice_tokens: weights and features are sharded differently "
            f"(sizes {spec.sizes} vs {features.spec.sizes})"
        )
    return spec



def slice_sums(weights: torch.Tensor, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The unnormalised slice sums over the points held here: ``sum_n w f`` and ``sum_n w``.

    Purely local (a ShardTensor's local shard is used as it is): no communication.

    **Shapes:** ``weights`` ``(..., N_local, M)``, ``features`` ``(..., N_local, C)`` ->
    ``(..., M, C)`` and ``(..., M)`` as plain tensors.

    **Precision:** half-precision operands (float16, bfloat16, also under autocast) are summed in
    float32 and the sums returned in float32: ``sum_n w`` grows like ``N / M``, past float16's
    largest value (65504) from about a million points at 16 slices, and an overflowed sum makes
    the tokens ``inf / inf = NaN``. float32 and float64 are summed in their own dtype.

    **Communication:** none.
    """
    _check_pair(weights, features)
    w, f = local_of(weights), local_of(features)
    acc = torch.promote_types(torch.promote_types(w.dtype, f.dtype), torch.float32)
    with torch.autocast(w.device.type, enabled=False):  # autocast would run the matmul in float16 again
        w, f = w.to(acc), f.to(acc)
        return torch.matmul(w.transpose(-1, -2), f), w.sum(dim=-2)


@faults.entry
def finish_slice_tokens(
    sum_wf: torch.Tensor,
    sum_w: torch.Tensor,
    eps: float = 1e-5,
    spec: ShardSpec | None = None,
) -> torch.Tensor:
    """Reduce per-rank slice sums over the domain group (one all-reduce) and normalise.

    Parameters
    ----------
    sum_wf, sum_w:
        This rank's ``sum_n w f`` ``(..., M, C)`` and ``sum_n w`` ``(..., M)`` (plain tensors).
    eps:
        Added once to the **global** weight sum.
    spec:
        The sharding of the points the sums were taken over; ``None`` for a single process (no
        communication, plain result).

    **Shapes:** ``(..., M, C)``, ``(..., M)`` -> tokens ``(..., M, C)``, replicated.

    **Communication:** one ``all_reduce`` of ``prod(...) * M * (C + 1)`` elements (both sums in one
    buffer), and one of the same size in backward. None with ``spec=None`` or one rank.
    """
    if eps < 0:
        raise ValueError(f"eps must be non-negative (got {eps})")
    if sum_wf.shape[:-1] != sum_w.shape:
        raise ValueError(
            "sum_wf (..., M, C) and sum_w (..., M) disagree "
            f"(got {tuple(sum_wf.shape)} and {tuple(sum_w.shape)})"
        )
    if spec is not None:
        c = sum_wf.shape[-1]
        fused = torch.cat([sum_wf, sum_w.unsqueeze(-1)], dim=-1)  # (..., M, C + 1): one buffer
        fused = comm.all_reduce(fused, spec.group)
        sum_wf, sum_w = fused.split([c, 1], dim=-1)
    else:
        sum_w = sum_w.unsqueeze(-1)
    tokens = sum_wf / (sum_w + eps)
    if spec is None:
        return tokens
    return replicated(tokens, spec)


@faults.entry
def slice_tokens(weights: torch.Tensor, features: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Slice tokens ``z = sum_n w f / (sum_n w + eps)`` over all points, sharded or not.

    Parameters
    ----------
    weights:
        Slice weights ``w`` (typically a softmax over the last dim), a plain tensor or a
        ShardTensor sharded on the point dim (``-2``).
    features:
        Point features ``f``, sharded like ``weights``.
    eps:
        Added once, after the reduction, to the global weight sum (Transolver uses ``1e-5``).

    Returns
    -------
    torch.Tensor
        The tokens; a :class:`~meshshard.tensor.ReplicatedTensor` (identical on every rank of the
        domain group, carrying partial gradients) when the inputs are sharded.

    **Shapes:** ``weights`` ``(..., N, M)``, ``features`` ``(..., N, C)`` -> ``(..., M, C)``; with
    ShardTensors ``N`` is ``N_local`` and the result is over all ``N_global`` points.

    **Communication:** one ``all_reduce`` of ``prod(...) * M * (C + 1)`` elements forward (``sum w f``
    and ``sum w`` fused into one buffer), one of the same size backward. The division happens after
    the reduction, so the result equals the single-process tokens to rounding.

    >>> w = torch.softmax(torch.randn(5, 3), dim=-1)
    >>> slice_tokens(w, torch.randn(5, 2)).shape
    torch.Size([3, 2])
    """
    spec = _check_pair(weights, features)
    sum_wf, sum_w = slice_sums(weights, features)
    tokens = finish_slice_tokens(sum_wf, sum_w, eps, spec)
    # normalised tokens are of the features' size again: back to their dtype (a no-op from float32 up)
    return tokens.to(torch.promote_types(weights.dtype, features.dtype))
