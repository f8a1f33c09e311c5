"""``PhysicsAttention``: Transolver's and Transolver++'s attention over learned slices of an irregular mesh."""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn

from .. import faults
from .._checks import check_choice, check_positive_int
from .._keyed_random import gumbel_noise, seeded_rand, step_seed
from ..ops.slice_tokens import slice_tokens
from ..tensor import ShardTensor, wrap

__all__ = ["PhysicsAttention"]

_INSTANCES = itertools.count()  # default seeds: construction order, the same on every rank


def check_inputs(
    x: torch.Tensor, channels: int, module: nn.Module, point_ids: torch.Tensor | None = None
) -> None:
    """What a model over points takes (:class:`PhysicsAttention`, ``Transolver``): features ``x``
    (:func:`check_point_features`) and optional ``point_ids`` (:func:`check_point_ids`). Metadata
    only, so every rank decides alike."""
    check_point_features(x, channels, module)
    check_point_ids(point_ids, x)


def check_point_features(x: torch.Tensor, channels: int, module: nn.Module) -> None:
    """``x`` as a model over points takes it: a floating ``(N, channels)`` or ``(B, N, channels)`` tensor on
    ``module``'s device, a ShardTensor sharded along the points (metadata only: no sync)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"Expected 'x' to be a torch.Tensor (got {type(x).__name__})")
    if x.dim() not in (2, 3) or x.shape[-1] != channels:
        raise ValueError(f"x must have shape (N, {channels}) or (B, N, {channels}) (got {tuple(x.shape)})")
    if isinstance(x, ShardTensor) and x.shard_dim != x.dim() - 2:
        raise ValueError(f"x must be sharded on the point dim {x.dim() - 2} (got shard dim {x.shard_dim})")
    check_dtype_and_device(x, module)


def check_dtype_and_device(x: torch.Tensor, module: nn.Module) -> None:
    """Floating ``x`` on the device of ``module``'s parameters (metadata only: no sync)."""
    if not x.is_floating_point():
        raise TypeError(f"x must be floating-point (got {x.dtype})")
    p = next(module.parameters(), None)
    if p is not None and x.device != p.device:
        raise ValueError(f"x is on device {x.device} but the model's parameters are on device {p.device}")


VARIANTS = ("plain", "plus")


def check_variant(variant: str) -> str:
    return check_choice(variant, "variant", VARIANTS)


def check_temperature_range(temperature_range: tuple[float, float] | None) -> tuple[float, float] | None:
    if temperature_range is None:
        return None
    low, high = (float(t) for t in temperature_range)
    if not 0.0 < low <= high:
        raise ValueError(f"temperature_range must satisfy 0 < low <= high (got {temperature_range})")
    return low, high


class PhysicsAttention(nn.Module):
    r"""Physics attention for irregular meshes: Transolver (Wu et al., ICML 2024) and Transolver++.

    Each head projects the points, :math:`\tilde x = W_x x` (``in_project_x``), and assigns every
    point softly to ``slice_num`` slices; the slice tokens average the point features :math:`f`,

    .. math::

        w_{n} = \operatorname{softmax}\!\left(\frac{W_s \tilde x_n + b_s}{\tau}\right), \qquad
        z_g = \frac{\sum_n w_{ng} f_n}{\sum_n w_{ng} + \varepsilon},

    then scaled dot-product attention runs among the ``slice_num`` tokens (``to_q``, ``to_k``,
    ``to_v``), the attended tokens go back to the points, :math:`y_n = \sum_g w_{ng} z'_g`, and the
    concatenated heads are projected (``to_out``, with dropout).

    ``variant="plain"`` (Transolver, as in the authors' ``Physics_Attention_Irregular_Mesh``):
    :math:`f = W_f x` (``in_project_fx``) and :math:`\tau = \tau_h` a learnable temperature per
    head (``temperature``, initialised to 0.5), **not clamped** unless ``temperature_range`` is
    given (then clamped to it when used; outside the range the clamp passes no gradient to
    :math:`\tau_h`). Dropout also drops attention weights among the tokens.

    ``variant="plus"`` (Transolver++, Luo et al., ICML 2025, as in the authors'
    ``Physics_Attention_1D_Eidetic``): the tokens average :math:`f = \tilde x` itself (no
    ``in_project_fx``); the temperature is *adaptive*, per point and head,
    :math:`\tau_n = \max(\tau_h + \mathrm{GELU}(W_2\,\mathrm{GELU}(W_1 \tilde x_n + b_1) + b_2), 0.01)`
    (``temperature`` is the base :math:`\tau_h`, ``proj_temperature`` the two-layer projection), and
    in training the slice weights are Gumbel-softmax, :math:`\operatorname{softmax}((W_s \tilde x_n
    + b_s + g_n) / \tau_n)` with standard Gumbel noise :math:`g`; in evaluation the noise is left
    out (the deterministic form; the authors' released code draws noise in evaluation too). The
    attention among tokens has no dropout, as published.

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
        Dropout after the output projection (and, plain variant, on the token attention weights).
    variant:
        ``"plain"`` (Transolver) or ``"plus"`` (Transolver++).
    eps:
        Added to the global slice-weight sums before normalising the tokens (published: ``1e-5``).
    temperature_range:
        ``(low, high)`` clamp of the per-head temperature (plain variant), or ``None`` (published:
        no clamp). The plus variant always clamps the adaptive temperature below at 0.01, as published.
    seed:
        Seed of the module's random draws that must agree across ranks (attention dropout, Gumbel
        noise); default: this module's construction index in the process, which is the same on
        every rank when every rank builds the same model.

    **Shapes:** ``x`` ``(N, C)`` or ``(B, N, C)`` -> same shape. With a ShardTensor sharded on ``N``
    (dim 0, or 1 with a batch dim) the result has the same sharding.

    **Randomness on shards.** Every draw that must be the same on every rank, or the same as a
    single process, comes from the pair ``(seed, rng_step)``, where ``rng_step`` counts training
    forwards (settable, e.g. on resume), not from the global RNG, which ranks advance differently:

    * attention dropout (replicated work): one generator seeded from the pair, identical on every rank;
    * Gumbel noise (per point): a counter-based hash of the pair and the point's **global id**, so
      a point gets the same noise on any number of ranks. The global id of local row ``i`` is
      ``x.offsets[rank] + i`` (its position in the concatenation of the shards, i.e. in the
      single-process tensor); pass ``point_ids`` to key the noise by other ids instead (for example
      the mesh's original point ids, which makes the noise independent of the partitioning too).

    ``rng_step`` is kept in a CPU int64 tensor, so ``torch.compile`` of a model in training takes the
    step as data of the graph: one graph, not one per step (a Python int would be a guarded constant).

    The dropout after ``to_out`` is point-wise: on a plain tensor it uses the global RNG, as usual; on a
    ShardTensor its mask is keyed by the global element index (``meshshard/tensor/_rules/_random.py``), so
    a P-rank run drops what a 1-rank ShardTensor run drops (one small ``all_gather`` for the seed).

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
        variant: str = "plain",
        eps: float = 1e-5,
        temperature_range: tuple[float, float] | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        check_positive_int(dim, "dim")
        check_positive_int(heads, "heads")
        check_positive_int(dim_head, "dim_head")
        check_positive_int(slice_num, "slice_num")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1) (got {dropout})")
        if eps < 0:
            raise ValueError(f"eps must be non-negative (got {eps})")
        self.variant = check_variant(variant)
        self.temperature_range = check_temperature_range(temperature_range)
        if self.variant == "plus" and self.temperature_range is not None:
            raise ValueError("temperature_range applies to variant='plain' only (plus clamps at 0.01 below)")
        self.dim, self.heads, self.dim_head, self.slice_num = dim, heads, dim_head, slice_num
        self.dropout, self.eps = float(dropout), float(eps)
        inner = heads * dim_head
        self.in_project_x = nn.Linear(dim, inner)
        if self.variant == "plain":
            self.in_project_fx = nn.Linear(dim, inner)
        else:
            self.proj_temperature = nn.Sequential(
                nn.Linear(dim_head, slice_num), nn.GELU(), nn.Linear(slice_num, 1), nn.GELU()
            )
        self.in_project_slice = nn.Linear(dim_head, slice_num)
        nn.init.orthogonal_(self.in_project_slice.weight)
        self.temperature = nn.Parameter(torch.full((heads, 1, 1), 0.5))
        self.to_q = nn.Linear(dim_head, dim_head, bias=False)
        self.to_k = nn.Linear(dim_head, dim_head, bias=False)
        self.to_v = nn.Linear(dim_head, dim_head, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, dim), nn.Dropout(dropout))
        self.seed = next(_INSTANCES) if seed is None else int(seed)
        # the step counter is a tensor (a plain attribute: no state_dict entry, kept on the CPU by .to()):
        # compiled, it is a graph input, mutated in place; a Python int would be a guarded constant of the
        # graph, so every training step of torch.compile(model) would compile a new graph
        self._rng_step = torch.zeros((), dtype=torch.int64)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, heads={self.heads}, dim_head={self.dim_head}, slice_num={self.slice_num}, "
            f"variant={self.variant!r}"
        )

    # The forward is split into the steps that chunked inference interleaves differently.
    def _split_heads(self, t: torch.Tensor) -> torch.Tensor:
        """``(B, N, H * D)`` -> ``(B, H, N, D)``."""
        return t.unflatten(-1, (self.heads, self.dim_head)).transpose(-3, -2)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x_mid, f)``: the slice-assignment projection and the features the slices average.

        ``(B, N, C)`` -> two ``(B, H, N, D)``; for ``variant="plus"`` both are ``x_mid``.
        """
        x_mid = self._split_heads(self.in_project_x(x))
        if self.variant == "plus":
            return x_mid, x_mid
        return x_mid, self._split_heads(self.in_project_fx(x))

    def weights(
        self, x_mid: torch.Tensor, seed: int | None = None, point_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Slice weights from ``x_mid`` ``(B, H, N, D)`` -> ``(B, H, N, M)``, rows sum to 1.

        ``seed`` (plus variant, training) adds the Gumbel noise of that seed (an int, or a 0-d int64
        tensor holding one: the same noise); ``None``: no noise.
        """
        if self.variant == "plain":
            tau = self.temperature
            if self.temperature_range is not None:
                tau = tau.clamp(*self.temperature_range)
            inv_tau = 1.0 / tau  # (H, 1, 1)
            # softmax((W_s x + b_s) / tau) with 1/tau folded into a per-head copy of the (small) slice
            # projection: the (B, H, N, M) logits are then not kept for backward.
            weight = self.in_project_slice.weight.t() * inv_tau  # (H, D, M)
            bias = self.in_project_slice.bias * inv_tau  # (H, 1, M)
            return torch.softmax(torch.matmul(x_mid, weight) + bias, dim=-1)
        tau = (self.temperature + self.proj_temperature(x_mid)).clamp(min=0.01)  # (B, H, N, 1)
        logits = self.in_project_slice(x_mid)
        if seed is not None:
            logits = logits + self._gumbel(logits, seed, point_ids)
        return torch.softmax(logits / tau, dim=-1)

    def _gumbel(self, logits: torch.Tensor, seed: int, point_ids: torch.Tensor | None) -> torch.Tensor:
        """Gumbel noise shaped like ``logits`` ``(B, H, N, M)``, keyed by the points' global ids."""
        spec = logits.spec if isinstance(logits, ShardTensor) else None
        local = logits.to_local() if spec is not None else logits
        b, h, n, m = local.shape
        if point_ids is None:
            start = spec.offsets[spec.rank] if spec is not None else 0
            ids = torch.arange(start, start + n, device=local.device)
        else:
            ids = point_ids.to_local() if isinstance(point_ids, ShardTensor) else point_ids
        noise = gumbel_noise(ids.to(local.device), b, h, m, seed, local.dtype)
        return wrap(noise, spec, 2) if spec is not None else noise

    def slice_weights(
        self, x: torch.Tensor, seed: int | None = None, point_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Soft assignment of each point to the slices: ``(B, N, C)`` -> ``(B, H, N, M)``, rows sum to 1."""
        return self.weights(self._split_heads(self.in_project_x(x)), seed, point_ids)

    def point_features(self, x: torch.Tensor) -> torch.Tensor:
        """The per-head features ``f`` that the slices average: ``(B, N, C)`` -> ``(B, H, N, D)``."""
        return self.project(x)[1]

    @property
    def rng_step(self) -> int:
        """Training forwards that drew random numbers so far (settable, e.g. on resume)."""
        return int(self._rng_step)

    @rng_step.setter
    def rng_step(self, value: int) -> None:
        self._rng_step.fill_(int(value))

    def next_seed(self) -> int | torch.Tensor | None:
        """Seed of the next training forward's random draws; ``None`` if it draws none (eval, no dropout).

        Advances ``rng_step`` when a seed is returned. Eagerly the seed is a Python int; when compiled,
        the same value as a 0-d int64 tensor (:func:`~meshshard._keyed_random.step_seed`), so that the
        step is data of the graph, not a guarded constant.
        """
        if not self.training or (self.variant == "plain" and self.dropout == 0):
            return None
        self._rng_step.add_(1)
        base = (self.seed * 1_000_003) % 2**63
        if torch.compiler.is_compiling():
            return step_seed(base, self._rng_step)
        return (base + int(self._rng_step)) % 2**63

    def attend(self, tokens: torch.Tensor, seed: int | None = None) -> torch.Tensor:
        """Attention among the slice tokens: ``(B, H, M, D)`` -> ``(B, H, M, D)`` (replicated work).

        With ``seed`` (plain variant with dropout) the attention weights are dropped with a mask
        drawn from a generator seeded with it (identical on every rank); else no attention dropout.
        """
        q, k, v = self.to_q(tokens), self.to_k(tokens), self.to_v(tokens)
        scale = 1.0 / math.sqrt(self.dim_head)
        if seed is None or self.variant == "plus" or self.dropout == 0:
            return F.scaled_dot_product_attention(q, k, v, scale=scale)
        attn = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * scale, dim=-1)
        if torch.compiler.is_compiling():  # a Generator cannot be made in a graph: the same draws, as a graph op
            keep = seeded_rand(torch.as_tensor(seed), list(attn.shape), attn.dtype, attn.device) >= self.dropout
        else:
            gen = torch.Generator(device=attn.device)
            gen.manual_seed(seed)
            keep = torch.rand(attn.shape, generator=gen, device=attn.device, dtype=attn.dtype) >= self.dropout
        return torch.matmul(attn * keep / (1.0 - self.dropout), v)

    def deslice(self, tokens: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Broadcast attended tokens back to the points and project: -> ``(B, N, C)`` (local)."""
        out = torch.matmul(weights, tokens)  # (B, H, N, D): sum_g w_ng z'_g
        return self.to_out(out.transpose(-3, -2).flatten(-2))

    @faults.layer
    def forward(
        self, x: torch.Tensor, seed: int | None = None, point_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Apply physics attention to ``x`` of shape ``(N, C)`` or ``(B, N, C)``.

        ``seed`` fixes this forward's random draws (checkpointed blocks pass it so that the
        recomputation draws the same); by default :meth:`next_seed` is drawn. ``point_ids``: see
        the class docstring (``(N,)`` integers; a ShardTensor sharded like ``x``'s points when
        ``x`` is one).
        """
        check_inputs(x, self.dim, self, point_ids)
        unbatched = x.dim() == 2
        if unbatched:
            x = x.unsqueeze(0)
        if seed is None:
            seed = self.next_seed()
        x_mid, f = self.project(x)
        w = self.weights(x_mid, seed, point_ids)
        z = slice_tokens(w, f, self.eps)  # the only collective
        y = self.deslice(self.attend(z, seed), w)
        return y.squeeze(0) if unbatched else y


def check_point_ids(point_ids: torch.Tensor | None, x: torch.Tensor) -> None:
    """``point_ids`` must be ``(N,)`` integers, sharded like the points of ``x`` when ``x`` is sharded.

    Decided from sharding metadata only, so every rank decides alike.
    """
    if point_ids is None:
        return
    if not isinstance(point_ids, torch.Tensor) or point_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            "Expected 'point_ids' to be an int32/int64 tensor "
            f"(got {getattr(point_ids, 'dtype', type(point_ids).__name__)})"
        )
    if isinstance(x, ShardTensor):
        if not isinstance(point_ids, ShardTensor):
            raise TypeError("point_ids must be a ShardTensor sharded like x's points when x is a ShardTensor")
        if point_ids.dim() != 1 or point_ids.sharding_sizes != x.sharding_sizes:
            raise ValueError(
                f"point_ids must be 1-d and sharded like x's points (sizes {x.sharding_sizes}; got "
                f"{point_ids.dim()}-d with sizes {point_ids.sharding_sizes})"
            )
        return
    if isinstance(point_ids, ShardTensor):
        raise TypeError("point_ids is a ShardTensor but x is a plain tensor")
    n = x.shape[-2]
    if tuple(point_ids.shape) != (n,):
        raise ValueError(f"point_ids must have shape ({n},), one id per point (got {tuple(point_ids.shape)})")
