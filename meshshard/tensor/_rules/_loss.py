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
import sys

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


def _dropped_l1_weight():
    """The ``weight`` of the ``F.l1_loss`` call that dispatched here.

    torch 2.13's ``F.l1_loss`` leaves ``weight`` out of its ``handle_torch_function`` call, so the
    rule would silently compute an unweighted loss; it is read back from that call's frame.
    """
    frame = sys._getframe(1)
    code = F.l1_loss.__code__
    for _ in range(12):
        if frame is None:
            return None
        if frame.f_code is code:
            return frame.f_locals.get("weight")
        frame = frame.f_back
    return None


@register(*_POINTWISE, *_CLASS, *_ROWWISE)
def _loss(func, args, kwargs):
    names, defaults = _signature(func)
    if func is F.l1_loss and "weight" not in kwargs and len(args) < 6:
        w = _dropped_l1_weight()
        if w is not None:
            kwargs = {**kwargs, "weight": w}
    a = bind(func, args, kwargs, names, defaults)
    orig = dict(a)
    reduction = a["reduction"]
    if a.get("size_average") is not None or a.get("reduce") is not None:
        reduction = _reduction.legacy_get_string(a.get("size_average"), a.get("reduce"), emit_warning=False)
    if reduction not in ("none", "sum", "mean") and not (func is F.kl_div and reduction == "batchmean"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    data = _tensor_names(func, names)
    shards = [a[n] for n in data if isinstance(a[n], ShardTensor)]
    for n in names:
        if n not in data and isinstance(a[n], ShardTensor):
            raise refuse(func, f"the argument {n!r} must be a plain (replicated) tensor")
    spec = common_spec(shards, func)
    first = names[0]
    x = a[first]
    if not isinstance(x, ShardTensor):
        raise refuse(func, f"the first operand {first!r} must be the ShardTensor (got a plain tensor)")
    nd, d = ndim(x), spec.dim
    if func in _ROWWISE:
        if nd < 2 or d != 0:  # a 1-d input is one row: its only dim holds the classes/features
            raise refuse(func, f"it reduces each row of a 2-d input; shard the rows (dim 0 of (N, C)), not dim {d} "
                         f"of a {nd}-d input")
        out_dim = 0
        for n in data[1:]:
            t = a[n]
            if isinstance(t, ShardTensor) and t._spec.dim != 0:
                raise ShardingError(f"[rank {spec.rank}] {op_name(func)}: {n!r} must be sharded along dim 0 as well")
            if isinstance(t, torch.Tensor) and not isinstance(t, ShardTensor) and t.dim() > 0:
                a[n] = plain_along_shard(func, t, spec, t.dim())
    elif func in _CLASS:
        if nd < 2 or d == 1:
            raise refuse(func, "the class dim (1) is sharded; shard the points (dim 0 or dims 2...)")
        out_dim = d if d == 0 else d - 1
        t = a["target"]
        if not isinstance(t, ShardTensor):
            raise refuse(func, "the target must be a ShardTensor sharded like the input")
        probs = t.dtype.is_floating_point
        want = d if probs or d == 0 else d - 1
        if t._spec.dim != want or ndim(t) != (nd if probs else nd - 1):
            raise ShardingError(f"[rank {spec.rank}] {op_name(func)}: an input sharded on dim {d} needs its target "
                                f"sharded on dim {want} (got dim {t._spec.dim} of a {ndim(t)}-d target)")
    else:
        back = nd - d
        for n in data:
            t = a[n]
            if isinstance(t, ShardTensor):
                if func is F.gaussian_nll_loss and n == "var" and ndim(t) == nd - 1 and t._spec.dim == d:
                    t = a[n] = t.unsqueeze(-1)  # torch's own broadcast of a per-point variance
                if ndim(t) - t._spec.dim != back:
                    raise ShardingError(f"[rank {spec.rank}] {op_name(func)}: the sharded dims of the operands do "
                                        "not line up under broadcasting")
            elif isinstance(t, torch.Tensor) and t.dim() > 0:
                a[n] = plain_along_shard(func, t, spec, back)
        out_dim = None  # from the end, below
    local_a = {k: local_of(v) for k, v in a.items()}
    for k in ("size_average", "reduce"):
        local_a.pop(k, None)
    local_a["reduction"] = "none"
    with no_subclass():
        if local_of(x).shape[d] == 0 and func not in _POINTWISE:  # torch refuses some empty (N, C) inputs
            per = _empty_loss(func, orig, local_a)
        else:
            per = func(**local_a)
    if out_dim is None:
        out_dim = per.dim() - (nd - d)
    if reduction == "none":
        return wrap(per, spec, out_dim)
    total = per.sum()
    if reduction == "sum":
        return replicated(comm.all_reduce(total, spec.group), spec)
    if func in _CLASS and not a["target"].dtype.is_floating_point:
        t = local_of(a["target"])
        valid = t != a["ignore_index"]
        w = a["weight"]
        if w is not None:
            cnt = (local_of(w).detach()[torch.where(valid, t, torch.zeros_like(t))] * valid).sum()
        else:
            cnt = valid.sum()
        both = comm.all_reduce(torch.stack([total, cnt.to(total.dtype)]), spec.group)
        return replicated(both[0] / both[1], spec)
    if func in (F.mse_loss, F.l1_loss) and a["weight"] is not None:  # torch: sum(w * loss) / sum(w)
        both = comm.all_reduce(torch.stack([total, local_a["weight"].sum().to(total.dtype)]), spec.group)
        return replicated(both[0] / both[1], spec)
    n_local = _numel_without(per, out_dim)
    if func is F.kl_div and reduction == "batchmean":
        count = spec.global_shape[0] if nd > 0 else 1
    else:
        count = n_local * spec.num_global
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
