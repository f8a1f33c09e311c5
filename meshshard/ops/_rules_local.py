"""Local sharding rules: metadata, pointwise ops, conversions and per-point linear algebra.

Everything here runs on the local shard with no communication. Operands must agree:
ShardTensors with the same sharding (same mesh axis and sizes, shard dims aligned from the right
under broadcasting); plain tensors may broadcast over the non-sharded dims only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._dispatch import arg, common_spec, ndim, no_subclass, op_name, register, shard_args, wrap
from ..errors import ShardingError, UnsupportedOpError
from ..tensor import ShardTensor, _wrap

T = torch.Tensor

# -- metadata: answered by the local shard --------------------------------------------------------
_PASSTHROUGH_ATTRS = """
shape dtype device ndim requires_grad is_leaf grad_fn layout is_cuda is_sparse is_quantized is_meta is_nested
retains_grad _version output_nr names _backward_hooks
""".split()
_PASSTHROUGH_METHODS = """
dim ndimension size numel nelement element_size is_contiguous is_floating_point is_complex get_device data_ptr
stride storage_offset untyped_storage __len__ __hash__ __format__ __dir__ register_hook retain_grad
is_signed __setstate__ _is_view is_pinned has_names is_inference
""".split()


def _collect_passthrough() -> list:
    out = []
    for name in _PASSTHROUGH_ATTRS:
        attr = getattr(torch._C.TensorBase, name, None)
        for acc in ("__get__", "__set__"):
            if hasattr(attr, acc):
                out.append(getattr(attr, acc))
    out += [getattr(T, n) for n in _PASSTHROUGH_METHODS if hasattr(T, n)]
    out += [T.grad.__set__, torch.is_tensor, torch.is_floating_point, torch.is_complex, torch.numel]
    return out


_PASSTHROUGH = _collect_passthrough()


@register(*_PASSTHROUGH)
def _passthrough(func, args, kwargs):
    with no_subclass():
        return func(*args, **kwargs)


@register(T.backward)
def _backward(func, args, kwargs):
    """``x.backward(...)`` on a shard: a local backward, with subclass dispatch still on (see ReplicatedTensor)."""
    x, *rest = args
    torch.autograd.backward(x.to_local(), *rest, **kwargs)


@register(T.as_subclass)
def _as_subclass(func, args, kwargs):
    with no_subclass():
        return func(*args, **kwargs)


@register(T.grad.__get__, T.data.__get__)
def _same_spec_attr(func, args, kwargs):
    """``x.grad`` / ``x.data`` have the sharding of ``x``."""
    (self,) = args
    with no_subclass():
        out = func(self)
    if out is None:
        return None
    return _wrap(out, self._spec) if not isinstance(out, ShardTensor) else out


@register(T.requires_grad_, T.detach_, T.share_memory_)
def _inplace_meta(func, args, kwargs):
    with no_subclass():
        func(*args, **kwargs)
    return args[0]


@register(T.__repr__, T.__str__)
def _repr(func, args, kwargs):
    return ShardTensor.__repr__(args[0])


@register(T.item, T.tolist, T.numpy, T.__bool__, T.__int__, T.__float__, T.__index__, T.__array__, T.__deepcopy__)
def _no_global_value(func, args, kwargs):
    raise UnsupportedOpError(
        f"{op_name(func)} on a ShardTensor is ambiguous (each rank holds a different shard): call it on "
        "x.to_local() for this rank's values or on x.full_tensor() for the whole tensor"
    )


# -- pointwise ----------------------------------------------------------------------------------
_POINTWISE_NAMES = """
add sub subtract mul multiply div divide true_divide floor_divide remainder fmod pow float_power neg negative
positive abs absolute exp exp2 expm1 log log2 log10 log1p sqrt rsqrt square sin cos tan asin acos atan atan2
arcsin arccos arctan arctan2 sinh cosh tanh asinh acosh atanh sigmoid erf erfc erfinv reciprocal sign sgn floor
ceil round trunc frac clamp clip clamp_min clamp_max maximum minimum fmax fmin where lerp addcmul addcdiv eq ne
lt le gt ge greater greater_equal less less_equal not_equal logical_and logical_or logical_xor logical_not
bitwise_and bitwise_or bitwise_xor bitwise_not isnan isinf isfinite isposinf isneginf nan_to_num relu relu6
copysign hypot xlogy heaviside sinc deg2rad rad2deg logit masked_fill signbit conj real imag angle
zero fill
""".split()

_DUNDER = "add sub mul truediv floordiv mod pow matmul and or xor".split()


def _collect_pointwise() -> list:
    out = []
    for name in _POINTWISE_NAMES:
        for owner in (torch, T, F):
            for n in (name, name + "_"):
                f = getattr(owner, n, None)
                if f is not None and callable(f):
                    out.append(f)
    for name in _DUNDER:
        if name == "matmul":
            continue
        for pre in ("__", "__r", "__i"):
            f = getattr(T, f"{pre}{name}__", None)
            if f is not None:
                out.append(f)
    out += [T.__neg__, T.__abs__, T.__invert__, T.__eq__, T.__ne__, T.__lt__, T.__le__, T.__gt__, T.__ge__,
            T.__pos__ if hasattr(T, "__pos__") else None]
    out += [F.gelu, F.silu, F.mish, F.softplus, F.elu, F.leaky_relu, F.hardtanh, F.relu6, F.logsigmoid,
            F.hardswish, F.hardsigmoid, F.selu, F.celu, F.tanhshrink, F.softsign,
            F.dropout, F.alpha_dropout, torch.dropout, F.threshold, F.sigmoid, F.tanh, F.relu,
            torch.nn.functional.silu, torch.special.expit, torch.special.erf, torch.special.logit]
    return [f for f in out if f is not None]


def _check_plain_broadcast(func, plain: torch.Tensor, back: int, rank: int) -> None:
    """A plain tensor must not have a dimension aligned with the sharded one (except size 1)."""
    if plain.dim() >= back and plain.shape[-back] != 1:
        raise ShardingError(
            f"[rank {rank}] {op_name(func)}: a plain tensor of shape {tuple(plain.shape)} would broadcast along "
            "the sharded dimension. Make it a ShardTensor with the same sharding, or give it size 1 there."
        )


def _pointwise(func, args, kwargs):
    spec = back = None
    plain = []
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, ShardTensor):
            s = a._spec
            b = len(s.global_shape) - s.dim
            if spec is None:
                spec, back = s, b
            elif s is not spec:
                common_spec([a for a in (*args, *kwargs.values()) if isinstance(a, ShardTensor)], func)
            if b != back:
                raise ShardingError(
                    f"[rank {spec.rank}] {op_name(func)}: the sharded dimensions of the operands do not line up "
                    f"under broadcasting (positions from the end: {back} and {b})"
                )
        elif isinstance(a, torch.Tensor) and a.dim() > 0:
            plain.append(a)
    for a in plain:
        _check_plain_broadcast(func, a, back, spec.rank)
    with no_subclass():
        out = func(*args, **kwargs)
    return wrap(out, spec, -back)


register(*_collect_pointwise())(_pointwise)


# -- same-shape results: conversions, copies, *_like ----------------------------------------------
_SAME_SHAPE = [
    T.to, T.type, T.float, T.double, T.half, T.bfloat16, T.int, T.long, T.bool, T.short, T.byte, T.char,
    T.clone, torch.clone, T.detach, torch.detach, T.contiguous, T.cpu, T.cuda, T.type_as, T.pin_memory,
    torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like, torch.rand_like, torch.randn_like,
    torch.randint_like, T.copy_, T.uniform_, T.normal_, T.bernoulli_, T.exponential_, T.random_,
]


@register(*_SAME_SHAPE)
def _same_shape(func, args, kwargs):
    shards = shard_args(args, kwargs)
    spec = common_spec(shards, func)
    with no_subclass():
        out = func(*args, **kwargs)
    if not isinstance(out, torch.Tensor):
        return out
    return wrap(out, spec, shards[0]._spec.dim)


@register(T.new_zeros, T.new_ones, T.new_empty, T.new_full, T.new_tensor)
def _new_plain(func, args, kwargs):
    """``x.new_*(shape)`` creates a plain tensor with x's dtype and device (no sharding)."""
    with no_subclass():
        return func(*args, **kwargs)


# -- per-point linear algebra and normalisation --------------------------------------------------
@register(F.linear)
def _linear(func, args, kwargs):
    x = arg(args, kwargs, 0, "input")
    w = arg(args, kwargs, 1, "weight")
    b = arg(args, kwargs, 2, "bias")
    if not isinstance(x, ShardTensor) or isinstance(w, ShardTensor) or isinstance(b, ShardTensor):
        raise UnsupportedOpError("linear: only a sharded input with replicated weight and bias is supported")
    if x._spec.dim == ndim(x) - 1:
        raise UnsupportedOpError(
            "linear contracts the last dimension, which is the sharded one here; shard the points, not the channels"
        )
    with no_subclass():
        out = func(*args, **kwargs)
    return wrap(out, x._spec, x._spec.dim)


@register(F.layer_norm, F.rms_norm if hasattr(F, "rms_norm") else None)
def _layer_norm(func, args, kwargs):
    x = arg(args, kwargs, 0, "input")
    shape = arg(args, kwargs, 1, "normalized_shape")
    n = 1 if isinstance(shape, int) else len(shape)
    if not isinstance(x, ShardTensor) or x._spec.dim >= ndim(x) - n:
        raise UnsupportedOpError(
            f"{op_name(func)} over the sharded dimension is not supported (it normalises the last {n} dims)"
        )
    with no_subclass():
        out = func(*args, **kwargs)
    return wrap(out, x._spec, x._spec.dim)


@register(F.group_norm)
def _group_norm(func, args, kwargs):
    x = arg(args, kwargs, 0, "input")
    if not isinstance(x, ShardTensor) or x._spec.dim != 0:
        raise UnsupportedOpError(
            "group_norm normalises over every dim but the first; it is local only when the points are dim 0 "
            "(input (N, C) with one sample per point)"
        )
    with no_subclass():
        out = func(*args, **kwargs)
    return wrap(out, x._spec, 0)


# op -> (position, keyword, default) of its ``dim`` argument
_DIM_ARG = {
    torch.cumsum: (1, "dim", None), T.cumsum: (1, "dim", None), torch.cumprod: (1, "dim", None),
    T.cumprod: (1, "dim", None), torch.cummax: (1, "dim", None), T.cummax: (1, "dim", None),
    torch.cummin: (1, "dim", None), T.cummin: (1, "dim", None), torch.sort: (1, "dim", -1), T.sort: (1, "dim", -1),
    torch.argsort: (1, "dim", -1), T.argsort: (1, "dim", -1), torch.topk: (2, "dim", -1), T.topk: (2, "dim", -1),
    F.normalize: (2, "dim", 1),
}


def _dim_local(func, args, kwargs):
    """Ops along one non-sharded ``dim`` (cumsum, sort, topk, normalize, ...): local."""
    x = args[0]
    if not isinstance(x, ShardTensor) or len(shard_args(args, kwargs)) != 1:
        raise UnsupportedOpError(f"{op_name(func)}: only the first operand may be a ShardTensor")
    d = arg(args, kwargs, *_DIM_ARG[func])
    if d is None or int(d) % ndim(x) == x._spec.dim:
        raise UnsupportedOpError(
            f"{op_name(func)} along the sharded dimension {x._spec.dim} has no sharding rule; "
            "use it along another dim, or on x.full_tensor()"
        )
    with no_subclass():
        out = func(*args, **kwargs)
    return wrap(out, x._spec, x._spec.dim)


register(*_DIM_ARG)(_dim_local)
