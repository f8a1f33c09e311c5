"""``Transolver``: a point-cloud PDE surrogate built on physics attention; exact chunked inference."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as _checkpoint

from ..ops.physics_attention import finish_slice_tokens, slice_sums
from ..tensor import ShardTensor
from ..tensor._rules._common import wrap
from .physics_attention import PhysicsAttention, _check_dtype_and_device, _check_positive_int

__all__ = ["Transolver", "TransolverBlock", "chunked_forward"]


def _mlp(dim_in: int, dim_hidden: int, dim_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim_in, dim_hidden), nn.GELU(), nn.Linear(dim_hidden, dim_out))


class TransolverBlock(nn.Module):
    """One Transolver layer: ``x + PhysicsAttention(LN(x))``, then ``x + MLP(LN(x))``.

    Parameters
    ----------
    dim, heads, slice_num:
        Hidden channels ``C``, heads ``H`` (``C`` must be divisible by ``H``), slices ``M``.
    mlp_ratio:
        Hidden width of the MLP is ``mlp_ratio * dim``.
    dropout:
        Dropout of the attention.
    checkpoint:
        Recompute the block's activations in backward (``torch.utils.checkpoint``, non-reentrant)
        instead of keeping them; only while autograd records.

    **Shapes:** ``(B, N, C)`` -> ``(B, N, C)`` (or ``(N, C)``), sharded like the input.

    **Communication:** that of :class:`PhysicsAttention`: one ``all_reduce`` forward, one backward;
    with ``checkpoint=True`` the forward is recomputed in backward, so backward runs **two**
    all-reduces (the recomputed forward's and the gradient's), on every rank alike.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        slice_num: int,
        mlp_ratio: float = 2,
        dropout: float = 0.0,
        *,
        checkpoint: bool = False,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        _check_positive_int(dim, "dim")
        _check_positive_int(heads, "heads")
        if dim % heads:
            raise ValueError(f"dim must be divisible by heads (got dim={dim}, heads={heads})")
        if mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio must be positive (got {mlp_ratio})")
        self.checkpoint = bool(checkpoint)
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = PhysicsAttention(dim, heads, dim // heads, slice_num, dropout, eps=eps)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = _mlp(dim, int(round(dim * mlp_ratio)), dim)

    def _forward(self, x: torch.Tensor, dropout_seed: int | None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), dropout_seed)
        return x + self.mlp(self.ln_2(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # drawn outside the checkpoint so that the recomputation uses the same attention mask
        seed = self.attn.next_dropout_seed()
        if self.checkpoint and torch.is_grad_enabled():
            return _checkpoint(self._forward, x, seed, use_reentrant=False)
        return self._forward(x, seed)


class Transolver(nn.Module):
    """Transolver for irregular meshes and point clouds (Wu et al., ICML 2024).

    A preprocessing MLP lifts the point inputs to ``n_hidden`` channels (plus a learned
    per-channel offset), ``n_layers`` :class:`TransolverBlock` s mix information through
    :class:`PhysicsAttention`, and ``LayerNorm -> Linear`` maps to the outputs. Reference
    configurations: ShapeNet-Car ``n_hidden=256, n_layers=8, n_head=8, slice_num=32, mlp_ratio=2``;
    DrivaerML (PhysicsNeMo) ``slice_num=512``.

    Weights start as in Transolver: linear layers truncated-normal (std 0.02) with zero bias, layer
    norms at identity, except the slice projections, which stay orthogonal.

    The same module runs on a plain tensor and on a :class:`~meshshard.tensor.ShardTensor` sharded
    on the point dim (*non-invasive* domain parallelism). Follow backward by
    :func:`meshshard.nn.sync_gradients` to obtain the single-process parameter gradients.

    Parameters
    ----------
    in_dim, out_dim:
        Channels per point in and out.
    n_hidden, n_layers, n_head, slice_num, mlp_ratio:
        Width ``C``, depth ``L``, heads ``H`` (``C % H == 0``), slices ``M``, MLP width ratio.
    dropout:
        Dropout in the attention.
    checkpoint:
        Gradient checkpointing of every block (see :class:`TransolverBlock`).
    eps:
        Slice-weight regulariser of the token normalisation.

    **Shapes:** ``x`` ``(N, in_dim)`` or ``(B, N, in_dim)`` -> ``(N, out_dim)`` or ``(B, N, out_dim)``;
    a ShardTensor sharded on ``N`` gives a ShardTensor with the same sharding.

    **Communication** (ShardTensor input): ``L`` ``all_reduce`` s forward, one per layer, each of
    ``B * H * M * (C / H + 1)`` values; ``L`` backward (``2 L`` with ``checkpoint=True``).

    >>> model = Transolver(3, 1, n_hidden=16, n_layers=2, n_head=2, slice_num=4)
    >>> model(torch.randn(20, 3)).shape
    torch.Size([20, 1])
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        n_hidden: int = 256,
        n_layers: int = 8,
        n_head: int = 8,
        slice_num: int = 32,
        mlp_ratio: float = 2,
        dropout: float = 0.0,
        *,
        checkpoint: bool = False,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        _check_positive_int(in_dim, "in_dim")
        _check_positive_int(out_dim, "out_dim")
        _check_positive_int(n_hidden, "n_hidden")
        _check_positive_int(n_layers, "n_layers")
        _check_positive_int(n_head, "n_head")
        _check_positive_int(slice_num, "slice_num")
        if n_hidden % n_head:
            raise ValueError(
                f"n_hidden must be divisible by n_head (got n_hidden={n_hidden}, n_head={n_head})"
            )
        self.in_dim, self.out_dim = in_dim, out_dim
        self.preprocess = _mlp(in_dim, 2 * n_hidden, n_hidden)
        self.placeholder = nn.Parameter(torch.rand(n_hidden) / n_hidden)
        self.blocks = nn.ModuleList(
            TransolverBlock(n_hidden, n_head, slice_num, mlp_ratio, dropout, checkpoint=checkpoint, eps=eps)
            for _ in range(n_layers)
        )
        self.ln_out = nn.LayerNorm(n_hidden)
        self.head = nn.Linear(n_hidden, out_dim)
        self._init_weights()

    def _init_weights(self) -> None:
        slice_projections = {id(b.attn.in_project_slice) for b in self.blocks}
        for m in self.modules():
            if isinstance(m, nn.Linear) and id(m) not in slice_projections:
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    @property
    def checkpoint(self) -> bool:
        """Whether the blocks use gradient checkpointing (settable)."""
        return all(b.checkpoint for b in self.blocks)

    @checkpoint.setter
    def checkpoint(self, value: bool) -> None:
        for b in self.blocks:
            b.checkpoint = bool(value)

    def _check_input(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"Expected 'x' to be a torch.Tensor (got {type(x).__name__})")
        if x.dim() not in (2, 3) or x.shape[-1] != self.in_dim:
            raise ValueError(
                f"x must have shape (N, {self.in_dim}) or (B, N, {self.in_dim}) (got {tuple(x.shape)})"
            )
        if isinstance(x, ShardTensor) and x.shard_dim != x.dim() - 2:
            raise ValueError(
                f"x must be sharded on the point dim {x.dim() - 2} (got shard dim {x.shard_dim})"
            )
        _check_dtype_and_device(x, self)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Per-point lifting to the hidden width: ``(..., N, in_dim)`` -> ``(..., N, n_hidden)``."""
        return self.preprocess(x) + self.placeholder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Predict ``(..., N, out_dim)`` from ``x`` ``(..., N, in_dim)``."""
        self._check_input(x)
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_out(h))

    def chunked_forward(self, x: torch.Tensor, chunk_size: int) -> torch.Tensor:
        """Exact inference in chunks of points; see :func:`chunked_forward`."""
        return chunked_forward(self, x, chunk_size)


@torch.no_grad()
def chunked_forward(model: Transolver, x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Evaluate ``model(x)`` exactly, holding the activations of only ``chunk_size`` points at a time.

    Physics attention couples all points only through the slice sums ``sum_n w f`` and
    ``sum_n w``. Per layer, pass 1 runs the points chunk by chunk and accumulates those sums; the
    tokens are then normalised and attended once; pass 2 runs the chunks again and writes each
    chunk's layer output (the attention output needs only the point itself and the global tokens).
    The slice statistics are those of the whole cloud, so the result equals ``model(x)`` to
    floating-point rounding for any ``chunk_size`` (unlike chunked inference that attends within each
    chunk, which changes the answer). Memory: the hidden state ``N x n_hidden`` plus one chunk's
    activations. Runs without autograd and in eval mode (dropout off); the model's mode is restored.

    Works on a ShardTensor too (each rank chunks its own shard): the local sums of all chunks are
    all-reduced once per layer.

    Parameters
    ----------
    model:
        A :class:`Transolver`.
    x:
        ``(N, in_dim)`` or ``(B, N, in_dim)``, a plain tensor or a ShardTensor sharded on ``N``.
    chunk_size:
        Points per chunk (the last chunk may be smaller).

    **Shapes:** as :meth:`Transolver.forward`.

    **Communication** (ShardTensor input): ``L`` ``all_reduce`` s, one per layer, as the full forward.
    Compute: the slice-weight projections run twice per layer.
    """
    if not isinstance(model, Transolver):
        raise TypeError(f"Expected 'model' to be a Transolver (got {type(model).__name__})")
    _check_positive_int(chunk_size, "chunk_size")
    model._check_input(x)
    spec = x.spec if isinstance(x, ShardTensor) else None
    local = x.to_local() if spec is not None else x
    unbatched = local.dim() == 2
    if unbatched:
        local = local.unsqueeze(0)
    was_training = model.training
    model.eval()
    try:
        out = _chunked(model, local, chunk_size, spec)
    finally:
        model.train(was_training)
    if unbatched:
        out = out.squeeze(0)
    return wrap(out, spec, out.dim() - 2) if spec is not None else out


def _chunked(model: Transolver, x: torch.Tensor, chunk_size: int, spec) -> torch.Tensor:
    b, n = x.shape[0], x.shape[1]
    spans = [(s, min(s + chunk_size, n)) for s in range(0, n, chunk_size)]
    h = x.new_empty((b, n, model.placeholder.shape[0]))
    for s, e in spans:
        h[:, s:e] = model.embed(x[:, s:e])
    for block in model.blocks:
        attn = block.attn
        sum_wf = x.new_zeros((b, attn.heads, attn.slice_num, attn.dim_head))
        sum_w = x.new_zeros((b, attn.heads, attn.slice_num))
        for s, e in spans:
            u = block.ln_1(h[:, s:e])
            wf, w = slice_sums(attn.slice_weights(u), attn.point_features(u))
            sum_wf += wf
            sum_w += w
        tokens = attn.attend(finish_slice_tokens(sum_wf, sum_w, attn.eps, spec))
        for s, e in spans:
            hc = h[:, s:e]
            hc = hc + attn.deslice(tokens, attn.slice_weights(block.ln_1(hc)))
            h[:, s:e] = hc + block.mlp(block.ln_2(hc))
    out = x.new_empty((b, n, model.out_dim))
    for s, e in spans:
        out[:, s:e] = model.head(model.ln_out(h[:, s:e]))
    return out
