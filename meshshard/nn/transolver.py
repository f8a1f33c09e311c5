"""``Transolver``: a point-cloud PDE surrogate built on physics attention; Transolver++; exact chunked inference.

The default model is the authors' irregular-mesh Transolver (``thuml/Transolver``: ``Model``,
``Transolver_block``, ``Physics_Attention_Irregular_Mesh``), computation for computation:
``MLP(in -> 2C -> C) + placeholder``, then ``L`` pre-norm blocks ``x + Attn(LN(x))``,
``x + MLP(LN(x))`` (``C -> mlp_ratio C -> C``, GELU), then ``LN -> Linear`` (the authors keep this
head inside their last block as ``ln_3``/``mlp2``; here it is ``ln_out``/``head``, the same
computation). ``variant="plus"`` is Transolver++ (``thuml/Transolver_plus``), see
:class:`~meshshard.nn.PhysicsAttention`. :meth:`Transolver.from_reference` and
:meth:`Transolver.reference_state_dict` convert weights from and to the authors' and PhysicsNeMo's
naming (``meshshard/nn/_reference.py`` documents the mapping).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as _checkpoint

from .. import faults
from .._checks import check_choice, check_positive_int
from .._config import TransolverConfig
from ..ops.slice_tokens import finish_slice_tokens, slice_sums
from ..tensor import ShardTensor, tracing, wrap
from .physics_attention import (
    PhysicsAttention,
    check_inputs,
    check_temperature_range,
    check_variant,
)

__all__ = ["Transolver", "TransolverBlock", "TransolverConfig", "chunked_forward"]

INITS = ("published", "orthogonal")


def _mlp(dim_in: int, dim_hidden: int, dim_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim_in, dim_hidden), nn.GELU(), nn.Linear(dim_hidden, dim_out))


class TransolverBlock(nn.Module):
    """One Transolver layer: ``x + PhysicsAttention(LN(x))``, then ``x + MLP(LN(x))``.

    Parameters
    ----------
    dim, heads, slice_num:
        Hidden channels ``C``, heads ``H`` (``C`` must be divisible by ``H``), slices ``M``.
    mlp_ratio:
        Hidden width of the MLP is ``round(mlp_ratio * dim)``.
    dropout:
        Dropout of the attention.
    variant, eps, temperature_range:
        Of the :class:`PhysicsAttention`.
    checkpoint:
        Recompute the block's activations in backward (``torch.utils.checkpoint``, non-reentrant)
        instead of keeping them; only while autograd records. (Transolver++ trains this way.)

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
        variant: str = "plain",
        checkpoint: bool = False,
        eps: float = 1e-5,
        temperature_range: tuple[float, float] | None = None,
    ) -> None:
        super().__init__()
        check_positive_int(dim, "dim")
        check_positive_int(heads, "heads")
        if dim % heads:
            raise ValueError(f"dim must be divisible by heads (got dim={dim}, heads={heads})")
        if mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio must be positive (got {mlp_ratio})")
        self.checkpoint = bool(checkpoint)
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = PhysicsAttention(
            dim, heads, dim // heads, slice_num, dropout, variant=variant, eps=eps,
            temperature_range=temperature_range,
        )
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = _mlp(dim, int(round(dim * mlp_ratio)), dim)

    def _forward(self, x: torch.Tensor, seed: int | None, point_ids: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), seed, point_ids)
        return x + self.mlp(self.ln_2(x))

    @faults.layer
    def forward(self, x: torch.Tensor, point_ids: torch.Tensor | None = None) -> torch.Tensor:
        # drawn outside the checkpoint so that the recomputation draws the same noise and masks
        seed = self.attn.next_seed()
        if self.checkpoint and torch.is_grad_enabled():
            if isinstance(x, ShardTensor) and tracing():
                return _checkpoint_shards(self._forward, x, seed, point_ids)
            return _checkpoint(self._forward, x, seed, point_ids, use_reentrant=False)
        return self._forward(x, seed, point_ids)


def _checkpoint_shards(fn, x: ShardTensor, seed, point_ids):
    """``checkpoint(fn, x, seed, point_ids)`` traced by ``torch.compile`` on a ShardTensor ``x``.

    Dynamo turns a checkpoint into a higher-order op whose operands would be ShardTensors, and such an op
    reaches ``__torch_function__``, where the body's ops no longer dispatch to the sharding rules. So the
    checkpointed function takes and returns the **local** shards: it rewraps them with their (static) specs,
    runs the block through its rules (its collectives inside the recomputed region) and unwraps the result,
    which is sharded like ``x`` (a block maps each point's channels).
    """
    spec = x.spec
    ids_spec = point_ids.spec if isinstance(point_ids, ShardTensor) else None

    def body(local, ids):
        xs = wrap(local, spec, spec.dim)
        if ids_spec is not None:
            ids = wrap(ids, ids_spec, ids_spec.dim)
        return fn(xs, seed, ids).to_local()

    ids = point_ids.to_local() if ids_spec is not None else point_ids
    out = _checkpoint(body, x.to_local(), ids, use_reentrant=False)
    return wrap(out, spec, spec.dim)


class Transolver(nn.Module):
    """Transolver for irregular meshes and point clouds (Wu et al., ICML 2024), and Transolver++.

    A preprocessing MLP lifts the point inputs to ``n_hidden`` channels (plus a learned
    per-channel offset, ``placeholder``), ``n_layers`` :class:`TransolverBlock` s mix information
    through :class:`PhysicsAttention`, and ``LayerNorm -> Linear`` maps to the outputs. Reference
    configurations: ShapeNet-Car ``n_hidden=256, n_layers=8, n_head=8, slice_num=32, mlp_ratio=2``;
    DrivaerML (PhysicsNeMo) ``slice_num=512``.

    With the default options this is the published model: no temperature clamp, the published
    initialisation (every ``Linear`` truncated-normal with std 0.02 and zero bias, the slice
    projection included; layer norms at identity; temperatures 0.5; ``placeholder`` uniform in
    ``[0, 1/C)``), ``eps = 1e-5``. Choices left to the user: ``temperature_range`` (a clamp, off by
    default), ``init="orthogonal"`` (keeps the slice projections orthogonal, as the attention module
    alone initialises them), ``mlp_ratio`` (the authors' code default is 1; their ShapeNet-Car
    runs use 2, the default here).

    ``variant="plus"`` gives Transolver++ (Luo et al., ICML 2025): adaptive per-point temperature,
    Gumbel-softmax slice weights in training and their deterministic form in evaluation, tokens
    that average the slice projection itself (see :class:`PhysicsAttention`); the authors train it
    with every block checkpointed (``checkpoint=True`` here). ``cond_dim`` adds the authors'
    optional global condition: ``Linear(cond_dim, C)`` of a per-sample vector added to every point.

    The same module runs on a plain tensor and on a :class:`~meshshard.tensor.ShardTensor` sharded
    on the point dim (*non-invasive* domain parallelism). Follow backward by
    :func:`meshshard.nn.sync_gradients` to obtain the single-process parameter gradients. With
    Gumbel noise (plus, training) the sharded run still equals the single-process run: each point's
    noise is keyed by its global id and the training step (``rng_step``), see
    :class:`PhysicsAttention`.

    Parameters
    ----------
    in_dim, out_dim:
        Channels per point in and out.
    n_hidden, n_layers, n_head, slice_num, mlp_ratio:
        Width ``C``, depth ``L``, heads ``H`` (``C % H == 0``), slices ``M``, MLP width ratio; the
        defaults are :class:`TransolverConfig`'s.
    dropout:
        Dropout in the attention.
    variant:
        ``"plain"`` (Transolver) or ``"plus"`` (Transolver++).
    checkpoint:
        Gradient checkpointing of every block (see :class:`TransolverBlock`).
    eps:
        Slice-weight regulariser of the token normalisation.
    temperature_range:
        Optional clamp of the per-head temperatures (plain variant); ``None``: none, as published.
    init:
        ``"published"`` or ``"orthogonal"`` (the same, but orthogonal slice projections).
    cond_dim:
        Channels of the optional per-sample condition (``None``: no condition input).
    seed:
        Keys the model's random draws with ``rng_step`` (Gumbel noise, attention dropout): layer
        ``i`` uses ``seed * 65537 + i``, so two models built alike draw alike, in any process.

    **Shapes:** ``x`` ``(N, in_dim)`` or ``(B, N, in_dim)`` -> ``(N, out_dim)`` or ``(B, N, out_dim)``;
    a ShardTensor sharded on ``N`` gives a ShardTensor with the same sharding. ``condition``
    ``(cond_dim,)`` or ``(B, cond_dim)``, a plain (replicated) tensor.

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
        n_hidden: int = TransolverConfig.n_hidden,
        n_layers: int = TransolverConfig.n_layers,
        n_head: int = TransolverConfig.n_head,
        slice_num: int = TransolverConfig.slice_num,
        mlp_ratio: float = TransolverConfig.mlp_ratio,
        dropout: float = 0.0,
        *,
        variant: str = "plain",
        checkpoint: bool = False,
        eps: float = 1e-5,
        temperature_range: tuple[float, float] | None = None,
        init: str = "published",
        cond_dim: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        check_positive_int(in_dim, "in_dim")
        check_positive_int(out_dim, "out_dim")
        check_positive_int(n_hidden, "n_hidden")
        check_positive_int(n_layers, "n_layers")
        check_positive_int(n_head, "n_head")
        check_positive_int(slice_num, "slice_num")
        if cond_dim is not None:
            check_positive_int(cond_dim, "cond_dim")
        if n_hidden % n_head:
            raise ValueError(
                f"n_hidden must be divisible by n_head (got n_hidden={n_hidden}, n_head={n_head})"
            )
        check_choice(init, "init", INITS)
        self.variant = check_variant(variant)
        temperature_range = check_temperature_range(temperature_range)
        self.in_dim, self.out_dim, self.cond_dim = in_dim, out_dim, cond_dim
        self.preprocess = _mlp(in_dim, 2 * n_hidden, n_hidden)
        self.placeholder = nn.Parameter(torch.rand(n_hidden) / n_hidden)
        self.cond_embed = nn.Linear(cond_dim, n_hidden) if cond_dim is not None else None
        self.blocks = nn.ModuleList(
            TransolverBlock(
                n_hidden, n_head, slice_num, mlp_ratio, dropout, variant=variant, checkpoint=checkpoint, eps=eps,
                temperature_range=temperature_range,
            )
            for _ in range(n_layers)
        )
        for i, block in enumerate(self.blocks):  # a function of the architecture, not of process history
            block.attn.seed = int(seed) * 65_537 + i
        self.ln_out = nn.LayerNorm(n_hidden)
        self.head = nn.Linear(n_hidden, out_dim)
        self._init_weights(init)

    def _init_weights(self, init: str) -> None:
        keep = {id(b.attn.in_project_slice) for b in self.blocks} if init == "orthogonal" else set()
        for m in self.modules():
            if isinstance(m, nn.Linear) and id(m) not in keep:
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

    @property
    def rng_step(self) -> int:
        """Training forwards that drew random numbers so far (keys the Gumbel noise and dropout masks).

        Settable: set it to the step count when resuming so that the draws continue the run's.
        """
        return self.blocks[0].attn.rng_step

    @rng_step.setter
    def rng_step(self, value: int) -> None:
        for b in self.blocks:
            b.attn.rng_step = int(value)

    @property
    def config(self) -> dict:
        """The constructor arguments that rebuild this model's architecture."""
        a = self.blocks[0].attn
        return dict(
            in_dim=self.in_dim, out_dim=self.out_dim, n_hidden=a.dim, n_layers=len(self.blocks), n_head=a.heads,
            slice_num=a.slice_num, mlp_ratio=self.blocks[0].mlp[0].out_features / a.dim, dropout=a.dropout,
            variant=self.variant, eps=a.eps, temperature_range=a.temperature_range, cond_dim=self.cond_dim,
        )

    def _check_input(
        self, x: torch.Tensor, condition: torch.Tensor | None = None, point_ids: torch.Tensor | None = None
    ) -> None:
        check_inputs(x, self.in_dim, self, point_ids)
        if condition is None:
            return
        if self.cond_dim is None:
            raise ValueError("this model takes no condition (built with cond_dim=None)")
        if isinstance(condition, ShardTensor) or not isinstance(condition, torch.Tensor):
            raise TypeError(f"Expected 'condition' to be a plain torch.Tensor (got {type(condition).__name__})")
        expected = (self.cond_dim,) if x.dim() == 2 else (x.shape[0], self.cond_dim)
        if tuple(condition.shape) != expected:
            raise ValueError(f"condition must have shape {expected} (got {tuple(condition.shape)})")

    def embed(self, x: torch.Tensor, condition: torch.Tensor | None = None) -> torch.Tensor:
        """Per-point lifting to the hidden width: ``(..., N, in_dim)`` -> ``(..., N, n_hidden)``."""
        h = self.preprocess(x) + self.placeholder
        if condition is not None:
            h = h + self.cond_embed(condition).unsqueeze(-2)
        return h

    @faults.layer
    def forward(
        self, x: torch.Tensor, condition: torch.Tensor | None = None, point_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Predict ``(..., N, out_dim)`` from ``x`` ``(..., N, in_dim)``.

        ``condition``: the optional per-sample vector (``cond_dim``). ``point_ids``: ``(N,)``
        integer ids that key the Gumbel noise (plus, training) instead of the points' positions in
        the global tensor; a ShardTensor sharded like ``x``'s points when ``x`` is one.
        """
        self._check_input(x, condition, point_ids)
        h = self.embed(x, condition)
        for block in self.blocks:
            h = block(h, point_ids)
        return self.head(self.ln_out(h))

    @faults.layer
    def chunked_forward(
        self, x: torch.Tensor, chunk_size: int, condition: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Exact inference in chunks of points; see :func:`chunked_forward`."""
        return chunked_forward(self, x, chunk_size, condition)

    @classmethod
    def from_reference(cls, state_dict: Mapping[str, torch.Tensor], source: str = "thuml", **options) -> Transolver:
        """Build a configured model from a published checkpoint's state dict.

        Parameters
        ----------
        state_dict:
            Weights in the naming of ``source`` (a ``module.`` prefix, as saved from DDP, is dropped).
            Sizes (``in_dim``, ``out_dim``, ``n_hidden``, ``n_layers``, ``n_head``, ``slice_num``,
            ``mlp_ratio``, ``cond_dim``) and the variant are inferred from the tensors' names and
            shapes.
        source:
            ``"thuml"`` (``thuml/Transolver`` irregular-mesh ``Model``, or ``thuml/Transolver_plus``
            ``Model``) or ``"physicsnemo"`` (``physicsnemo.models.transolver.Transolver`` with
            ``use_te=False``, irregular mesh). The mapping is documented in
            ``meshshard/nn/_reference.py``.
        **options:
            Other constructor options (``dropout``, ``checkpoint``, ...). For ``"physicsnemo"`` the
            defaults reproduce its computation: ``eps=1e-2`` and, plain variant,
            ``temperature_range=(0.5, 5.0)``.

        The model takes the dtype of the state dict's floating tensors. Unknown or missing names,
        and shapes that disagree, raise a ``ValueError`` naming them.
        """
        from ._reference import from_reference

        return from_reference(cls, state_dict, source, options)

    def reference_state_dict(self, source: str = "thuml") -> dict[str, torch.Tensor]:
        """This model's weights in the naming of ``source`` (see :meth:`from_reference`).

        Raises ``ValueError`` when the reference model cannot compute what this one computes (for
        example a temperature clamp the reference lacks, or another ``eps``).
        """
        from ._reference import reference_state_dict

        return reference_state_dict(self, source)


@torch.no_grad()
def chunked_forward(
    model: Transolver, x: torch.Tensor, chunk_size: int, condition: torch.Tensor | None = None
) -> torch.Tensor:
    """Evaluate ``model(x)`` exactly, holding the activations of only ``chunk_size`` points at a time.

    Physics attention couples all points only through the slice sums ``sum_n w f`` and
    ``sum_n w``. Per layer, pass 1 runs the points chunk by chunk and accumulates those sums; the
    tokens are then normalised and attended once; pass 2 runs the chunks again and writes each
    chunk's layer output (the attention output needs only the point itself and the global tokens).
    The slice statistics are those of the whole cloud, so the result equals ``model(x)`` to
    floating-point rounding for any ``chunk_size`` (unlike chunked inference that attends within each
    chunk, which changes the answer). Memory: the hidden state ``N x n_hidden`` plus one chunk's
    activations. Runs without autograd and in eval mode (dropout off, Transolver++ without Gumbel
    noise); the model's mode is restored.

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
    condition:
        As in :meth:`Transolver.forward`.

    **Shapes:** as :meth:`Transolver.forward`.

    **Communication** (ShardTensor input): ``L`` ``all_reduce`` s, one per layer, as the full forward.
    Compute: the slice-weight projections run twice per layer.
    """
    if not isinstance(model, Transolver):
        raise TypeError(f"Expected 'model' to be a Transolver (got {type(model).__name__})")
    check_positive_int(chunk_size, "chunk_size")
    model._check_input(x, condition)
    spec = x.spec if isinstance(x, ShardTensor) else None
    local = x.to_local() if spec is not None else x
    unbatched = local.dim() == 2
    if unbatched:
        local = local.unsqueeze(0)
        condition = condition.unsqueeze(0) if condition is not None else None
    was_training = model.training
    model.eval()
    try:
        out = _chunked(model, local, chunk_size, spec, condition)
    finally:
        model.train(was_training)
    if unbatched:
        out = out.squeeze(0)
    return wrap(out, spec, out.dim() - 2) if spec is not None else out


def _chunked(model: Transolver, x: torch.Tensor, chunk_size: int, spec, condition) -> torch.Tensor:
    """The chunked evaluation on a plain local ``(B, N_local, in_dim)`` tensor."""
    b, n = x.shape[0], x.shape[1]
    spans = [(s, min(s + chunk_size, n)) for s in range(0, n, chunk_size)]
    h = x.new_empty((b, n, model.placeholder.shape[0]))
    for s, e in spans:
        h[:, s:e] = model.embed(x[:, s:e], condition)
    for block in model.blocks:
        attn = block.attn
        sum_wf = x.new_zeros((b, attn.heads, attn.slice_num, attn.dim_head))
        sum_w = x.new_zeros((b, attn.heads, attn.slice_num))
        for s, e in spans:
            x_mid, f = attn.project(block.ln_1(h[:, s:e]))
            wf, w = slice_sums(attn.weights(x_mid), f)
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
