"""Losses over points: every ``torch.nn.functional`` loss whose reduction runs over the sharded dimension.

Each loss is computed on the local shards with ``reduction="none"`` (torch's own per-element code,
so options such as ``weight``, ``pos_weight``, ``ignore_index``, ``label_smoothing``, ``beta``,
``delta``, ``log_target`` behave exactly as in torch), then reduced:

* ``"none"``: the per-element loss, a ShardTensor sharded like the operands;
* ``"sum"``: the local sum, all-reduced;
* ``"mean"``: the local sum divided by the global count. The count is known from the global shapes
  for every loss but ``cross_entropy``/``nll_loss`` with class-index targets, whose denominator
  is the sum of the class weights of the non-ignored targets, and ``mse_loss``/``l1_loss`` with a
  ``weight``, whose denominator is the sum of the weights: then (sum, count) travel in one
  fused all-reduce. ``kl_div(reduction="batchmean")`` divides by the global batch size.

Three families, by the shape of the per-element loss:

* pointwise (``mse``, ``l1``, ``huber``, ``smooth_l1``, ``binary_cross_entropy[_with_logits]``,
  ``kl_div``, ``poisson_nll``, ``gaussian_nll``, ``soft_margin``, ``hinge_embedding``,
  ``margin_ranking``): the loss has the operands' broadcast shape; any dim may be sharded;
* class (``cross_entropy``, ``nll_loss``; input ``(N, C, d1, ...)``): the class dim 1 must not be the
  sharded one; the target is sharded on the matching dim;
* per-row (``multi_margin``, ``multilabel_margin``, ``multilabel_soft_margin``,
  ``cosine_embedding``, ``triplet_margin``; input ``(N, C)``): sharded along the rows (dim 0).

Plain operands broadcast as in the pointwise rules (size 1 along the sharded dim, or an expanded
row); class weights ``(C,)`` are replicated parameters.

**Communication** (forward; backward mirrors the all-reduce once):

====================================  ==============================================================
``reduction="none"``                  none
``reduction="sum"``                   one ``all_reduce`` of one element
``reduction="mean"``                  one ``all_reduce`` of one element (two, fused into one buffer,
                                      for class-index ``cross_entropy``/``nll_loss`` and
                                      weighted ``mse_loss``/``l1_loss``)
====================================  ==============================================================
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn import _reduction

from ... import comm
from ...errors import ShardingError
from .._dispatch import bind, no_subclass, op_name
from .._dispatch import register_rule as register
from .._tensor import ShardTensor
from ._common import common_spec, local_of, ndim, plain_along_shard, refuse, replicated, wrap

_POINTWISE = (F.mse_loss, F.l1_loss, F.huber_loss, F.smooth_l1_loss, F.binary_cross_entropy,
              F.binary_cross_entropy_with_logits, F.kl_div, F.poisson_nll_loss, F.gaussian_nll_loss,
              F.soft_margin_loss, F.hinge_embedding_loss, F.margin_ranking_loss)
_CLASS = (F.cross_entropy, F.nll_loss)
_ROWWISE = (F.multi_margin_loss, F.multilabel_margin_loss, F.multilabel_soft_margin_loss, F.cosine_embedding_loss,
            F.triplet_margin_loss)

_SIGNATURES: dict = {}


def _signature(func):
    sig = _SIGNATURES.get(func)
    if sig is None:
        params = inspect.signature(func).parameters
        names = tuple(params)
        defaults = {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}
        sig = _SIGNATURES[func] = (names, defaults)
    return sig


def _tensor_names(func, names) -> list[str]:
    """Operands that carry per-point data (broadcast with the input); class weights excluded."""
    skip = {"reduction", "size_average", "reduce"}
    if func in (F.cross_entropy, F.nll_loss, F.multi_margin_loss):
        skip.add("weight")
    return [n for n in names if n not in skip]


class _Probe(torch.Tensor):
    """A tensor subclass that records the keyword arguments ``__torch_function__`` receives."""

    seen: dict = {}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is F.l1_loss:
            cls.seen = dict(kwargs or {})
            return None
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def _l1_forwards_weight() -> bool:
    """Whether this torch's ``F.l1_loss`` passes ``weight`` on to ``__torch_function__``.

    torch 2.13's ``F.l1_loss`` lists ``weight`` among the arguments it checks for overrides but leaves it
    out of the call it forwards, so a rule would compute an unweighted loss without knowing it.
    """
    x = torch.zeros(1).as_subclass(_Probe)
    F.l1_loss(x, x, weight=torch.ones(1))
    return "weight" in _Probe.seen


def _forward_l1_weight(handle: Callable) -> Callable:
    """``torch.nn.functional``'s ``handle_torch_function``, completed for ``F.l1_loss``: its ``weight``
    (the third of the arguments it checks) is forwarded as the keyword torch's signature promises."""

    def handle_torch_function(public_api, relevant_args, *args, **kwargs):
        if public_api is _L1 and "weight" not in kwargs and len(relevant_args) == 3:
            kwargs["weight"] = relevant_args[2]
        return handle(public_api, relevant_args, *args, **kwargs)

    handle_torch_function.__wrapped__ = handle
    return handle_torch_function


_L1 = F.l1_loss
if not _l1_forwards_weight():
    # An explicit argument instead of a guess: every F.l1_loss call that reaches __torch_function__ (ours,
    # a DTensor's, a mode's) now carries its weight; calls without overrides never enter this path.
    F.handle_torch_function = _forward_l1_weight(F.handle_torch_function)


def _reduction_of(func, a: dict) -> str:
    """The normalised ``reduction`` (the legacy ``size_average``/``reduce`` pair mapped as torch does)."""
    reduction = a["reduction"]
    if a.get("size_average") is not None or a.get("reduce") is not None:
        reduction = _reduction.legacy_get_string(a.get("size_average"), a.get("reduce"), emit_warning=False)
    if reduction not in ("none", "sum", "mean") and not (func is F.kl_div and reduction == "batchmean"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    return reduction


def _rowwise_layout(func, a: dict, data: list[str], spec, nd: int) -> int:
    """Per-row losses: rows (dim 0 of ``(N, C)``) sharded, every other operand along them; the loss dim."""
    d = spec.dim
    if nd < 2 or d != 0:  # a 1-d input is one row: its only dim holds the classes/features
        raise refuse(func, f"it reduces each row of a 2-d input; shard the rows (dim 0 of (N, C)), not dim {d} "
                     f"of a {nd}-d input")
    for n in data[1:]:
        t = a[n]
        if isinstance(t, ShardTensor) and t._spec.dim != 0:
            raise ShardingError(f"[rank {spec.rank}] {op_name(func)}: {n!r} must be sharded along dim 0 as well")
        if isinstance(t, torch.Tensor) and not isinstance(t, ShardTensor) and t.dim() > 0:
            a[n] = plain_along_shard(func, t, spec, t.dim())
    return 0


def _class_layout(func, a: dict, spec, nd: int) -> int:
    """``cross_entropy``/``nll_loss``: the class dim 1 replicated, the target sharded to match; the loss dim."""
    d = spec.dim
    if nd < 2 or d == 1:
        raise refuse(func, "the class dim (1) is sharded; shard the points (dim 0 or dims 2...)")
    t = a["target"]
    if not isinstance(t, ShardTensor):
        raise refuse(func, "the target must be a ShardTensor sharded like the input")
    probs = t.dtype.is_floating_point
    want = d if probs or d == 0 else d - 1
    if t._spec.dim != want or ndim(t) != (nd if probs else nd - 1):
        raise ShardingError(f"[rank {spec.rank}] {op_name(func)}: an input sharded on dim {d} needs its target "
                            f"sharded on dim {want} (got dim {t._spec.dim} of a {ndim(t)}-d target)")
    return d if d == 0 else d - 1


def _pointwise_layout(func, a: dict, data: list[str], spec, nd: int) -> None:
    """Pointwise losses: every operand's sharded dim lines up with the input's under broadcasting."""
    back = nd - spec.dim
    for n in data:
        t = a[n]
        if isinstance(t, ShardTensor):
            if func is F.gaussian_nll_loss and n == "var" and ndim(t) == nd - 1 and t._spec.dim == spec.dim:
                t = a[n] = t.unsqueeze(-1)  # torch's own broadcast of a per-point variance
            if ndim(t) - t._spec.dim != back:
                raise ShardingError(f"[rank {spec.rank}] {op_name(func)}: the sharded dims of the operands do "
                                    "not line up under broadcasting")
        elif isinstance(t, torch.Tensor) and t.dim() > 0:
            a[n] = plain_along_shard(func, t, spec, back)


def _local_loss(func, a: dict, orig: dict, x: ShardTensor, d: int) -> tuple[torch.Tensor, dict]:
    """This rank's per-element loss (torch's own code with ``reduction="none"``) and the local arguments."""
    local_a = {k: local_of(v) for k, v in a.items()}
    for k in ("size_average", "reduce"):
        local_a.pop(k, None)
    local_a["reduction"] = "none"
    with no_subclass():
        if local_of(x).shape[d] == 0 and func not in _POINTWISE:  # torch refuses some empty (N, C) inputs
            return _empty_loss(func, orig, local_a), local_a
        return func(**local_a), local_a


def _weighted_mean(func, a: dict, local_a: dict, total: torch.Tensor, group) -> torch.Tensor | None:
    """The mean whose denominator depends on the data (class weights / ignored targets, a ``weight``):
    the sum and the count in one fused all-reduce; ``None`` when the count follows from the shapes."""
    if func in _CLASS and not a["target"].dtype.is_floating_point:
        t = local_a["target"]
        valid = t != a["ignore_index"]
        w = a["weight"]
        if w is not None:
            cnt = (local_of(w).detach()[torch.where(valid, t, torch.zeros_like(t))] * valid).sum()
        else:
            cnt = valid.sum()
    elif func in (F.mse_loss, F.l1_loss) and a["weight"] is not None:  # torch: sum(w * loss) / sum(w)
        cnt = local_a["weight"].sum()
    else:
        return None
    both = comm.all_reduce(torch.stack([total, cnt.to(total.dtype)]), group)
    return both[0] / both[1]


@register(*_POINTWISE, *_CLASS, *_ROWWISE)
def _loss(func, args, kwargs):
    names, defaults = _signature(func)
    a = bind(func, args, kwargs, names, defaults)
    orig = dict(a)
    reduction = _reduction_of(func, a)
    data = _tensor_names(func, names)
    for n in names:
        if n not in data and isinstance(a[n], ShardTensor):
            raise refuse(func, f"the argument {n!r} must be a plain (replicated) tensor")
    spec = common_spec([a[n] for n in data if isinstance(a[n], ShardTensor)], func)
    x = a[names[0]]
    if not isinstance(x, ShardTensor):
        raise refuse(func, f"the first operand {names[0]!r} must be the ShardTensor (got a plain tensor)")
    nd, d = ndim(x), spec.dim
    if func in _ROWWISE:
        out_dim = _rowwise_layout(func, a, data, spec, nd)
    elif func in _CLASS:
        out_dim = _class_layout(func, a, spec, nd)
    else:
        _pointwise_layout(func, a, data, spec, nd)
    per, local_a = _local_loss(func, a, orig, x, d)
    if func in _POINTWISE:
        out_dim = per.dim() - (nd - d)
    if reduction == "none":
        return wrap(per, spec, out_dim)
    total = per.sum()
    if reduction == "sum":
        return replicated(comm.all_reduce(total, spec.group), spec)
    mean = _weighted_mean(func, a, local_a, total, spec.group)
    if mean is not None:
        return replicated(mean, spec)
    if func is F.kl_div and reduction == "batchmean":
        count = spec.global_shape[0] if nd > 0 else 1
    else:
        count = _numel_without(per, out_dim) * spec.num_global
    return replicated(comm.all_reduce(total, spec.group) / count, spec)


def _meta(v, original):
    """A meta tensor of the operand's global shape (``v`` is its local version)."""
    if isinstance(original, ShardTensor):
        return torch.empty(original._spec.global_shape, dtype=original.dtype, device="meta")
    if isinstance(original, torch.Tensor):
        return torch.empty(original.shape, dtype=original.dtype, device="meta")
    return v


def _empty_loss(func, orig, local_a):
    """This rank's per-element loss when it holds no points: torch's own argument checks on meta tensors of
    the global shapes (so every rank raises alike), then an empty loss that stays in the autograd graph
    (this rank still joins the backward all-reduce)."""
    try:
        func(**{k: _meta(v, orig.get(k, v)) for k, v in local_a.items()})
    except NotImplementedError:
        pass
    except RuntimeError as exc:  # a data-dependent check (e.g. var < 0) cannot run on meta tensors
        if "meta" not in str(exc):
            raise
    tensors = [v for v in local_a.values() if isinstance(v, torch.Tensor)]
    x = local_a[next(iter(local_a))]
    if func in _ROWWISE:
        shape = [0]
    elif func in _CLASS:
        t = local_a["target"]
        shape = list(t.shape) if not t.dtype.is_floating_point else [s for i, s in enumerate(x.shape) if i != 1]
    else:
        shape = list(torch.broadcast_shapes(*(t.shape for t in tensors)))
    anchor = sum((t.sum() * 0 for t in tensors if t.requires_grad), torch.zeros((), dtype=x.dtype))
    return torch.zeros(shape, dtype=x.dtype, device=x.device) + anchor


def _numel_without(t: torch.Tensor, d: int) -> int:
    n = 1
    for i, s in enumerate(t.shape):
        if i != d:
            n *= s
    return n
