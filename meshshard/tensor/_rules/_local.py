"""Local sharding rules: metadata, pointwise ops, conversions and per-point linear algebra.

Everything here runs on the local shard with no communication. Operands must agree:
ShardTensors with the same sharding (same mesh axis and sizes, shard dims aligned from the right
under broadcasting); plain tensors broadcast over the non-sharded dims, and along the sharded dim
only with size 1 or as an expanded (stride-0) row.

**Communication:** none.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...errors import ShardingError, UnsupportedOpError
from .._dispatch import bind, func_name, no_subclass, op_name
from .._dispatch import register_rule as register
from .._spec import ShardSpec
from .._tensor import ShardTensor, wrap_shard
from ._common import common_spec, ndim, plain_along_shard, refuse, wrap

T = torch.Tensor

# -- metadata: answered by the local shard --------------------------------------------------------
# Shape queries (shape, size, dim, numel, len) are answered globally in ShardTensor.__torch_function__;
# these describe the local storage or are the same on every rank.
_PASSTHROUGH_ATTRS = """
dtype device requires_grad is_leaf grad_fn layout is_cuda is_sparse is_quantized is_meta is_nested
retains_grad _version output_nr names _backward_hooks
""".split()
_PASSTHROUGH_METHODS = """
element_size is_contiguous is_floating_point is_complex get_device data_ptr
stride storage_offset untyped_storage __hash__ __dir__ register_hook retain_grad
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
    out += [T.grad.__set__, torch.is_tensor, torch.is_floating_point, torch.is_complex]
    return out


_PASSTHROUGH = _collect_passthrough()


@register(*_PASSTHROUGH)
def _passthrough(func, args, kwargs):
    with no_subclass():
        return func(*args, **kwargs)


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
    return wrap_shard(out, self._spec) if not isinstance(out, ShardTensor) else out


@register(T.requires_grad_, T.detach_, T.share_memory_)
def _inplace_meta(func, args, kwargs):
    with no_subclass():
        func(*args, **kwargs)
    return args[0]


@register(T.__repr__, T.__str__)
def _repr(func, args, kwargs):
    return ShardTensor.__repr__(args[0])


@register(T.item, T.tolist, T.numpy, T.__bool__, T.__int__, T.__float__, T.__index__, T.__array__, T.__deepcopy__,
          T.__format__, T.__iter__, T.__reversed__)
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
            F.threshold, F.sigmoid, F.tanh, F.relu,
            torch.nn.functional.silu, torch.special.expit, torch.special.erf, torch.special.logit]
    return [f for f in out if f is not None]


def pointwise_rule(func, args, kwargs):
    if kwargs.get("out") is not None:
        raise refuse(func, "out= is not supported", "write the result to a new tensor")
    if func is torch.where and len(args) + len(kwargs) == 1:
        from ._index import nonzero_tuple

        return nonzero_tuple(func, args[0])
    spec = back = None
    shards = []
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, ShardTensor):
            shards.append(a)
            s = a._spec
            b = len(s.global_shape) - s.dim
            if spec is None:
                spec, back = s, b
            elif b != back:
                raise ShardingError(
                    f"[rank {spec.rank}] {op_name(func)}: the sharded dimensions of the operands do not line up "
                    f"under broadcasting (positions from the end: {back} and {b})"
                )
    if len(shards) > 1:
        common_spec(shards, func)
    if not isinstance(args[0], ShardTensor) and func_name(func).endswith("_") and func_name(func) != "__iand__":
        raise refuse(func, "an in-place op on a plain tensor with a ShardTensor operand would store local rows")

    def fix(a):
        if isinstance(a, ShardTensor) or not isinstance(a, torch.Tensor) or a.dim() == 0:
            return a
        return plain_along_shard(func, a, spec, back)

    args = tuple(fix(a) for a in args)
    if kwargs:
        kwargs = {k: fix(v) for k, v in kwargs.items()}
    with no_subclass():
        out = func(*args, **kwargs)
    return wrap(out, spec, -back)


register(*_collect_pointwise())(pointwise_rule)


# -- same-shape results: conversions, copies, *_like ----------------------------------------------
_SAME_SHAPE = [
    T.to, T.type, T.float, T.double, T.half, T.bfloat16, T.int, T.long, T.bool, T.short, T.byte, T.char,
    T.clone, torch.clone, T.detach, torch.detach, T.contiguous, T.cpu, T.cuda, T.type_as, T.pin_memory,
    torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like, T.copy_,
]  # random numbers (rand_like, uniform_, dropout, ...): _random.py


@register(*_SAME_SHAPE)
def _same_shape(func, args, kwargs):
    if not isinstance(args[0], ShardTensor):
        # W.to(x), W.type_as(x), torch.zeros_like(W, ...): x only lends its dtype and device
        if func is T.copy_:
            raise refuse(func, "copying a ShardTensor into a plain tensor would store local rows",
                         "use x.full_tensor() or x.to_local()")
        args = tuple(a.to_local() if isinstance(a, ShardTensor) else a for a in args)
        kwargs = {k: v.to_local() if isinstance(v, ShardTensor) else v for k, v in kwargs.items()}
        with no_subclass():
            return func(*args, **kwargs)
    if func is T.copy_:
        return pointwise_rule(func, args, kwargs)
    x = args[0]
    others = [a for a in (*args[1:], *kwargs.values()) if isinstance(a, ShardTensor)]
    if others and func in (T.to, T.type_as):  # x.to(y) / x.type_as(y): y only lends dtype and device
        args = tuple(a.to_local() if isinstance(a, ShardTensor) and a is not x else a for a in args)
        kwargs = {k: v.to_local() if isinstance(v, ShardTensor) else v for k, v in kwargs.items()}
    elif others:
        common_spec([x, *others], func)
    with no_subclass():
        out = func(*args, **kwargs)
    if not isinstance(out, torch.Tensor):
        return out
    return wrap(out, x._spec, x._spec.dim)


@register(T.new_zeros, T.new_ones, T.new_empty, T.new_full, T.new_tensor)
def _new_plain(func, args, kwargs):
    """``x.new_*(shape)`` creates a tensor with x's dtype and device.

    It is sharded when its length along x's sharded dim ``d`` names a known sharding (decided from
    the spec and the shape, alike on every rank): the nodes' when x's rows target nodes
    (``spec.node_sizes``, e.g. PyG's ``msg.new_zeros((N, C))`` before ``scatter_add_``), else x's
    own. Any other shape gives a plain tensor (no sharding).
    """
    x = args[0]
    if func is not T.new_tensor and isinstance(x, ShardTensor):
        names = ("self", "size", "fill_value") if func is T.new_full else ("self", "size")
        if func is not T.new_full and len(args) > 2 or len(args) == 2 and isinstance(args[1], int):
            a = {"self": x, "size": tuple(args[1:])}
            rest = dict(kwargs)
        else:
            a = dict(zip(names, args))
            rest = {k: v for k, v in kwargs.items() if k not in names}
            a.update({k: v for k, v in kwargs.items() if k in names})
        size = a.get("size")
        spec = x._spec
        if isinstance(size, (tuple, list, torch.Size)) and all(isinstance(s, int) for s in size):
            sizes = _sharding_for(spec, tuple(size))
            if sizes is not None:
                shape = list(size)
                shape[spec.dim] = sizes[spec.rank]
                extra = (a["fill_value"],) if func is T.new_full else ()
                with no_subclass():
                    out = func(x, shape, *extra, **rest)
                new = ShardSpec(spec.mesh, spec.mesh_dim, spec.dim, sizes, torch.Size(size), spec.mesh_id, sizes,
                                _axis=spec._axis)
                return wrap_shard(out, new)
    with no_subclass():
        return func(*args, **kwargs)


def _sharding_for(spec: ShardSpec, size: tuple[int, ...]) -> tuple[int, ...] | None:
    if len(size) <= spec.dim:
        return None
    for sizes in (spec.node_sizes, spec.sizes):
        if sizes is not None and size[spec.dim] == sum(sizes):
            return sizes
    return None


# -- per-point linear algebra and normalisation --------------------------------------------------
@register(F.linear)
def _linear(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "weight", "bias"))
    x, w, b = a["input"], a["weight"], a["bias"]
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
    a = bind(func, args, kwargs, ("input", "normalized_shape", "weight", "bias", "eps"))
    x, shape = a["input"], a["normalized_shape"]
    if any(isinstance(t, ShardTensor) for t in (a["weight"], a["bias"])):
        raise refuse(func, "weight and bias must be plain (replicated) tensors")
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
    a = bind(func, args, kwargs, ("input", "num_groups", "weight", "bias", "eps"))
    x = a["input"]
    if any(isinstance(t, ShardTensor) for t in (a["weight"], a["bias"])):
        raise refuse(func, "weight and bias must be plain (replicated) tensors")
    if not isinstance(x, ShardTensor) or x._spec.dim != 0:
        raise UnsupportedOpError(
            "group_norm normalises over every dim but the first; it is local only when the points are dim 0 "
            "(input (N, C) with one sample per point)"
        )
    with no_subclass():
        out = func(*args, **kwargs)
    return wrap(out, x._spec, 0)
