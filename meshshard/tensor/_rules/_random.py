"""Random numbers on ShardTensors, keyed by the global element index.

``torch.rand_like``, ``torch.randn_like``, ``torch.randint_like``, ``torch.bernoulli`` (and the
``bernoulli``/``bernoulli_`` methods), ``F.dropout`` (hence ``nn.Dropout``), ``torch.dropout``,
``F.alpha_dropout`` and the in-place ``uniform_``, ``normal_``, ``exponential_`` on a ShardTensor draw
every number as a pure function of ``(seed, global element index)`` (:mod:`meshshard._keyed_random`,
a counter-based generator), so that

* the numbers are independent over the global elements: two ranks never draw the same numbers for
  their local rows (a stateful generator seeded alike on every rank, as every script seeds, would);
* a P-rank run draws, element for element, what a 1-rank ShardTensor run draws, for every world size
  and partition (the global index is the row-major index in the **global** shape).

They are not torch's own streams: a ShardTensor run does not reproduce the numbers of the same op on
a plain tensor, only those of any other ShardTensor run seeded alike.

**Seed:** each call draws one 62-bit integer from torch's generator (the ``generator=`` argument, or
the default generator of the result's device), so seeding with ``torch.manual_seed`` makes runs
repeatable and every call draws new numbers. The ranks use rank 0's draw (one small collective), so
they agree even when seeded differently.

**Communication:** one ``all_gather`` of 3 int64 per call (the seed; :func:`meshshard.comm.agree`);
nothing with one rank. ``dropout`` with ``training=False`` or ``p = 0`` draws nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import comm
from ..._keyed_random import normal_at, uniform_at
from ...errors import UnsupportedOpError
from .._compile import tracing
from .._dispatch import bind, no_subclass, op_name
from .._dispatch import register_rule as register
from .._spec import ShardSpec
from .._tensor import ShardTensor, wrap_shard
from ._common import common_spec, local_shape, plain_along_shard, refuse, sharded_input

T = torch.Tensor
_LIKE = ("generator", "dtype", "layout", "device", "requires_grad", "memory_format")


def global_index(spec: ShardSpec, shape: torch.Size, device: torch.device) -> torch.Tensor:
    """The row-major index in the global shape of every element of this rank's shard (int64, ``shape``)."""
    gshape = spec.global_shape
    strides = [1] * len(gshape)
    for j in range(len(gshape) - 2, -1, -1):
        strides[j] = strides[j + 1] * int(gshape[j + 1])
    index = torch.zeros((), dtype=torch.int64, device=device)
    for j, n in enumerate(shape):
        start = spec.offsets[spec.rank] if j == spec.dim else 0
        r = torch.arange(start, start + int(n), dtype=torch.int64, device=device) * strides[j]
        index = index + r.view([-1 if i == j else 1 for i in range(len(shape))])
    return index.expand(shape)


def agreed_seed(spec: ShardSpec, generator: torch.Generator | None, device: torch.device) -> int:
    """One draw from ``generator`` (or the device's default generator) on every rank; rank 0's, on every rank.

    Not traceable (a generator draw read as a Python int, then agreed): traced, it raises the same error on
    every rank instead.
    """
    if tracing():
        raise UnsupportedOpError(
            "random numbers on a ShardTensor (dropout, bernoulli, rand_like, uniform_...) cannot be compiled yet: "
            "each call draws its seed from torch's generator and agrees it across ranks. Run them outside the "
            "compiled region, or compile with dropout=0 (eval mode draws nothing)."
        )
    where = generator.device if generator is not None else device
    mine = int(torch.randint(0, 2**62, (1,), generator=generator, device=where).item())
    if spec.num_ranks == 1:
        return mine
    return int(comm.agree(None, spec.group, payload=[mine]).payloads[0, 0])


def _uniform(index: torch.Tensor, seed: int, dtype: torch.dtype, stream: int = 0) -> torch.Tensor:
    if dtype.is_complex:
        real = dtype.to_real()
        return torch.complex(uniform_at(index, seed, real, 2 * stream), uniform_at(index, seed, real, 2 * stream + 1))
    return uniform_at(index, seed, dtype, stream)


def _normal(index: torch.Tensor, seed: int, dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_complex:  # torch: real and imaginary parts each of variance 1/2
        real = dtype.to_real()
        return torch.complex(normal_at(index, seed, real, 0), normal_at(index, seed, real, 1)) * (0.5**0.5)
    return normal_at(index, seed, dtype)


def _draw(x: ShardTensor, generator, device=None, dtype=None, kind: str = "uniform") -> torch.Tensor:
    """Keyed numbers for this rank's shard of ``x`` (a plain local tensor)."""
    spec = x._spec
    device = torch.device(device) if device is not None else x.device
    seed = agreed_seed(spec, generator, device)
    index = global_index(spec, local_shape(x), device)
    dtype = dtype or x.dtype
    if kind == "normal":
        return _normal(index, seed, dtype)
    if not (dtype.is_floating_point or dtype.is_complex):
        raise TypeError(f"random numbers of dtype {dtype} are not supported here (expected a floating dtype)")
    return _uniform(index, seed, dtype)


def _check_like(func, a: dict) -> None:
    if a["layout"] not in (None, torch.strided):
        raise refuse(func, f"only the strided layout is supported (got {a['layout']})")
    sharded_input(func, a["input"])


@register(torch.rand_like, torch.randn_like)
def _rand_like(func, args, kwargs):
    a = bind(func, args, kwargs, ("input",), kwonly=_LIKE)
    _check_like(func, a)
    x = a["input"]
    dtype = a["dtype"] or x.dtype
    if not (dtype.is_floating_point or dtype.is_complex):
        raise TypeError(f"{op_name(func)}: expected a floating or complex dtype (got {dtype})")
    out = _draw(x, a["generator"], a["device"], dtype, "normal" if func is torch.randn_like else "uniform")
    return wrap_shard(out.requires_grad_(bool(a["requires_grad"])), x._spec)


@register(torch.randint_like)
def _randint_like(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "low", "high"), kwonly=_LIKE)
    _check_like(func, a)
    x, low, high = a["input"], a["low"], a["high"]
    if high is None:  # randint_like(x, high)
        low, high = 0, low
    low, high = int(low), int(high)
    if high <= low:
        raise RuntimeError(f"randint_like: expected low < high (got low={low}, high={high})")
    u = _draw(x, a["generator"], a["device"], torch.float64)
    span = high - low
    out = low + torch.clamp((u * span).floor().to(torch.int64), max=span - 1)
    return wrap_shard(out.to(a["dtype"] or x.dtype).requires_grad_(bool(a["requires_grad"])), x._spec)


def _probabilities(func, p, x: ShardTensor) -> torch.Tensor | float:
    """``p`` for this rank's elements: a number, a ShardTensor sharded like ``x``, or a plain broadcastable tensor."""
    if isinstance(p, ShardTensor):
        common_spec([x, p], func)
        with no_subclass():
            return p.detach()
    if isinstance(p, torch.Tensor):
        if p.dim() == 0:
            return p.detach()
        return plain_along_shard(func, p.detach(), x._spec, len(x._spec.global_shape) - x._spec.dim)
    return float(p)


@register(torch.bernoulli, T.bernoulli, T.bernoulli_)
def _bernoulli(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "p"), kwonly=("generator",))
    x = sharded_input(func, a["input"])
    p = a["p"]
    if p is None:
        if func is T.bernoulli_:
            p = 0.5
        else:
            with no_subclass():
                p = x.detach()
    else:
        p = _probabilities(func, p, x)
    u = _draw(x, a["generator"], dtype=torch.float64)
    with no_subclass():
        draw = u < (p.to(torch.float64) if isinstance(p, torch.Tensor) else p)
        if func is T.bernoulli_:
            x.copy_(draw)
            return x
        return wrap_shard(draw.to(x.dtype), x._spec)


@register(F.dropout, torch.dropout, F.alpha_dropout, torch.alpha_dropout)
def _dropout(func, args, kwargs):
    if func in (torch.dropout, torch.alpha_dropout):
        a = bind(func, args, kwargs, ("input", "p", "train"))
        training, inplace = a["train"], False
    else:
        a = bind(func, args, kwargs, ("input", "p", "training", "inplace"),
                 {"p": 0.5, "training": func is F.dropout, "inplace": False})
        training, inplace = a["training"], a["inplace"]
    x, p = a["input"], float(a["p"])
    sharded_input(func, x)
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return x
    keep = (_draw(x, None, dtype=torch.float64) >= p) if p < 1.0 else None
    with no_subclass():
        zeros = torch.zeros((), dtype=x.dtype, device=x.device)
        mask = keep.to(x.dtype) if keep is not None else zeros.expand(x.shape)
        if func in (F.alpha_dropout, torch.alpha_dropout):
            if keep is None:
                scale, shift = mask, mask
            else:  # torch's alpha dropout: keep the SELU fixed point's mean and variance
                alpha = 1.7580993408473766
                gain = ((alpha * alpha * p + 1) * (1 - p)) ** -0.5
                scale, shift = mask * gain, (mask - 1) * (alpha * gain) + alpha * gain * p
            if inplace:
                return x.mul_(scale).add_(shift)
            return wrap_shard(x * scale + shift, x._spec)
        scale = mask * (1.0 / (1.0 - p)) if keep is not None else mask
        if inplace:
            return x.mul_(scale)
        return wrap_shard(x * scale, x._spec)


@register(T.uniform_, T.normal_, T.exponential_)
def _fill_random(func, args, kwargs):
    names = {T.uniform_: ("self", "from", "to"), T.normal_: ("self", "mean", "std"),
             T.exponential_: ("self", "lambd")}[func]
    defaults = {"from": 0.0, "to": 1.0, "mean": 0.0, "std": 1.0, "lambd": 1.0}
    a = bind(func, args, kwargs, names, defaults, kwonly=("generator",))
    x = a["self"]
    if not isinstance(x, ShardTensor):
        raise refuse(func, "the tensor filled must be the ShardTensor")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{op_name(func)}: expected a floating tensor (got {x.dtype})")
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    if func is T.normal_:
        values = float(a["mean"]) + float(a["std"]) * _draw(x, a["generator"], dtype=work, kind="normal")
    elif func is T.exponential_:
        values = -torch.log(_draw(x, a["generator"], dtype=work)) / float(a["lambd"])
    else:
        low, high = float(a["from"]), float(a["to"])
        values = low + (high - low) * _draw(x, a["generator"], dtype=work)
    with no_subclass():
        x.copy_(values)
    return x


@register(T.random_, T.geometric_, T.log_normal_, T.cauchy_, torch.normal, torch.poisson, torch.multinomial)
def _no_keyed_draw(func, args, kwargs):
    raise refuse(func, "no keyed random numbers for this distribution (drawing them on each rank's rows would "
                 "correlate the ranks' numbers)", "draw keyed numbers with torch.rand_like(x) and transform them")
