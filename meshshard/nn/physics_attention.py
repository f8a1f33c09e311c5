"""``PhysicsAttention``: Transolver's attention over learned slices of an irregular mesh."""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.physics_attention import slice_tokens
from ..tensor import ShardTensor

__all__ = ["PhysicsAttention"]

_INSTANCES = itertools.count()  # default dropout seeds: construction order, the same on every rank


def _check_positive_int(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Expected '{name}' to be an int (got {type(value).__name__})")
    if value < 1:
        raise ValueError(f"{name} must be positive (got {value})")
    return value


def _check_dtype_and_device(x: torch.Tensor, module: nn.Module) -> None:
    """Floating ``x`` on the device of ``module``'s parameters (metadata only: no sync)."""
    if not x.is_floating_point():
        raise TypeError(f"x must be floating-point (got {x.dtype})")
    p = next(module.parameters(), None)
    if p is not None and x.device != p.device:
        raise ValueError(f"x is on device {x.device} but the model's parameters are on device {p.device}")


class PhysicsAttention(nn.Module):
    r"""Physics attention for irregular meshes (Transolver, Wu et al., ICML 2024).

    Each head projects the points twice, :math:`\tilde x = W_x x` and :math:`f = W_f x`
    (``in_project_x``, ``in_project_fx``), assigns every point softly to ``slice_num`` slices

    .. math::

        w_{n} = \operatorname{softmax}\!\left(W_s \tilde x_n / \tau_h\right),

    summarises the points into slice tokens :math:`z_g = \sum_n w_{ng} f_n / (\sum_n w_{ng} + \varepsilon)`,
    runs scaled dot-product attention among the ``slice_num`` tokens (``to_q``, ``to_k``, ``to_v``),
    maps the attended tokens back to the points, :math:`y_n = \sum_g w_{ng} z'_g`, and projects the
    concatenated heads (``to_out``, with dropout).

    The temperature :math:`\tau_h` is a learnable parameter per head, initialised to 0.5 as in
    Transolver and **clamped to** ``temperature_range`` (default ``[0.1, 5]``) when used: Transolver++
    (Luo et al., 2025) observes that an unconstrained temperature can collapse the slice weights to
    one-hot (``tau -> 0``) or to uniform (``tau`` large), both of which stall training. Outside the
    range the clamp passes no gradient to :math:`\tau_h`, which keeps it at the bound until the other
    parameters pull it back. The slice projection ``W_s`` starts orthogonal.

    The module is ordinary PyTorch (the *non-invasive* model): on a
    :class:`~meshshard.tensor.ShardTensor` sharded on the point dim every step is local except the
    two sums over points, which :func:`meshshard.ops.slice_tokens` all-reduces in one fused
    collective; the attention among tokens then runs replicated on every rank.

    Parameters
    ----------
    dim:
        Channels of the input and output, ``C``.
    heads:
        Number of heads ``H``.
    dim_head:
        Channels per head ``D``.
    slice_num:
        Number of slices (tokens) ``M``.
    dropout:
        Dropout on the token attention weights and after the output projection.
    dropout_seed:
        Seed of the attention-dropout masks (default: this module's construction index in the
        process, which is the same on every rank when every rank builds the same model).
    eps:
        Added to the global slice-weight sums before normalising the tokens.
    temperature_range:
        ``(low, high)`` clamp of the per-head temperature.

    **Shapes:** ``x`` ``(N, C)`` or ``(B, N, C)`` -> same shape. With a ShardTensor sharded on ``N``
    (dim 0, or 1 with a batch dim), ``N`` is ``N_local`` and the result has the same sharding.

    **Dropout on shards.** The attention among tokens is replicated: every rank must drop the same
    attention weights, or the ranks' tokens (and gradients) drift apart. Its masks therefore come
    from a generator private to the module, seeded with ``(dropout_seed, step)`` where ``step``
    counts training forwards, and not from the global RNG, which ranks advance differently
    (point-wise dropout draws ``N_local``-dependent numbers). The dropout after ``to_out`` is
    point-wise and uses the global RNG, as usual.

    **Communication** (ShardTensor input): one ``all_reduce`` of ``B * H * M * (D + 1)`` values
    forward, one of the same size backward; none on a plain tensor.

    >>> attn = PhysicsAttention(16, heads=2, dim_head=8, slice_num=4)
    >>> attn(torch.randn(10, 16)).shape
    torch.Size([10, 16])
    """

    def __init__(
        self,
        dim: int,
        heads: int = 8,
        dim_head: int = 64,
        slice_num: int = 32,
        dropout: float = 0.0,
        *,
        eps: float = 1e-5,
        temperature_range: tuple[float, float] = (0.1, 5.0),
        dropout_seed: int | None = None,
    ) -> None:
        super().__init__()
        _check_positive_int(dim, "dim")
        _check_positive_int(heads, "heads")
        _check_positive_int(dim_head, "dim_head")
        _check_positive_int(slice_num, "slice_num")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1) (got {dropout})")
        if eps < 0:
            raise ValueError(f"eps must be non-negative (got {eps})")
        low, high = (float(t) for t in temperature_range)
        if not 0.0 < low <= 0.5 <= high:
            raise ValueError(
                f"temperature_range must satisfy 0 < low <= 0.5 <= high (got {temperature_range})"
            )
        self.dim, self.heads, self.dim_head, self.slice_num = dim, heads, dim_head, slice_num
        self.dropout, self.eps, self.temperature_range = float(dropout), float(eps), (low, high)
        inner = heads * dim_head
        self.in_project_x = nn.Linear(dim, inner)
        self.in_project_fx = nn.Linear(dim, inner)
        self.in_project_slice = nn.Linear(dim_head, slice_num)
        nn.init.orthogonal_(self.in_project_slice.weight)
        self.temperature = nn.Parameter(torch.full((heads, 1, 1), 0.5))
        self.to_q = nn.Linear(dim_head, dim_head, bias=False)
        self.to_k = nn.Linear(dim_head, dim_head, bias=False)
        self.to_v = nn.Linear(dim_head, dim_head, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, dim), nn.Dropout(dropout))
        self.dropout_seed = next(_INSTANCES) if dropout_seed is None else int(dropout_seed)
        self._dropout_step = 0

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads}, dim_head={self.dim_head}, slice_num={self.slice_num}"

    # The forward is split into the steps that chunked inference interleaves differently.
    def _split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """``(B, N, H * D)`` -> ``(B, H, N, D)``."""
        return t.unflatten(-1, (self.heads, self.dim_head)).transpose(-3, -2)

    def slice_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Soft assignment of each point to the slices: ``(B, N, C)`` -> ``(B, H, N, M)``, rows sum to 1."""
        low, high = self.temperature_range
        inv_tau = 1.0 / self.temperature.clamp(low, high)  # (H, 1, 1)
        # softmax((W_s x + b_s) / tau) with 1/tau folded into a per-head copy of the (small) slice
        # projection: the (B, H, N, M) logits are then not kept for backward.
        weight = self.in_project_slice.weight.t() * inv_tau  # (H, D, M)
        bias = self.in_project_slice.bias * inv_tau  # (H, 1, M)
        logits = torch.matmul(self._split_heads(self.in_project_x(x)), weight) + bias
        return torch.softmax(logits, dim=-1)

    def point_features(self, x: torch.Tensor) -> torch.Tensor:
        """The per-head features ``f`` that the slices average: ``(B, N, C)`` -> ``(B, H, N, D)``."""
        return self._split_heads(self.in_project_fx(x))

    def next_dropout_seed(self) -> int | None:
        """Seed of the next training forward's attention-dropout mask; ``None`` without dropout."""
        if not (self.training and self.dropout > 0):
            return None
        self._dropout_step += 1
        return (self.dropout_seed * 1_000_003 + self._dropout_step) % 2**63

    def attend(self, tokens: torch.Tensor, dropout_seed: int | None = None) -> torch.Tensor:
        """Attention among the slice tokens: ``(B, H, M, D)`` -> ``(B, H, M, D)`` (replicated work).

        With ``dropout_seed`` the attention weights are dropped with a mask drawn from a generator
        seeded with it (identical on every rank); without, no attention dropout.
        """
        q, k, v = self.to_q(tokens), self.to_k(tokens), self.to_v(tokens)
        scale = 1.0 / math.sqrt(self.dim_head)
        if dropout_seed is None:
            return F.scaled_dot_product_attention(q, k, v, scale=scale)
        attn = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * scale, dim=-1)
        gen = torch.Generator(device=attn.device)
        gen.manual_seed(dropout_seed)
        keep = torch.rand(attn.shape, generator=gen, device=attn.device, dtype=attn.dtype) >= self.dropout
        return torch.matmul(attn * keep / (1.0 - self.dropout), v)

    def deslice(self, tokens: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Broadcast attended tokens back to the points and project: -> ``(B, N, C)`` (local)."""
        out = torch.matmul(weights, tokens)  # (B, H, N, D): sum_g w_ng z'_g
        return self.to_out(out.transpose(-3, -2).flatten(-2))

    def forward(self, x: torch.Tensor, dropout_seed: int | None = None) -> torch.Tensor:
        """Apply physics attention to ``x`` of shape ``(N, C)`` or ``(B, N, C)``.

        ``dropout_seed`` fixes the attention-dropout mask (used by checkpointed blocks so that the
        recomputation draws the same mask); by default the next one is drawn.
        """
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"Expected 'x' to be a torch.Tensor (got {type(x).__name__})")
        if x.dim() not in (2, 3) or x.shape[-1] != self.dim:
            raise ValueError(
                f"x must have shape (N, {self.dim}) or (B, N, {self.dim}) (got {tuple(x.shape)})"
            )
        if isinstance(x, ShardTensor) and x.shard_dim != x.dim() - 2:
            raise ValueError(
                f"x must be sharded on the point dim {x.dim() - 2} (got shard dim {x.shard_dim} of shape "
                f"{tuple(x.global_shape)})"
            )
        _check_dtype_and_device(x, self)
        unbatched = x.dim() == 2
        if unbatched:
            x = x.unsqueeze(0)
        w = self.slice_weights(x)
        z = slice_tokens(w, self.point_features(x), self.eps)  # the only collective
        if dropout_seed is None:
            dropout_seed = self.next_dropout_seed()
        y = self.deslice(self.attend(z, dropout_seed), w)
        return y.squeeze(0) if unbatched else y
