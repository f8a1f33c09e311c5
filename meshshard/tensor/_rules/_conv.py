"""Point convolutions and global pooling on the channels-first layout ``(B, C, N)`` used by PointNet.

* ``conv1d``/``conv2d``/``conv3d`` with every kernel size 1 (stride 1, no padding, any dilation and
  groups): a per-point linear map, local on an input sharded along a spatial dim. Sharded on the
  batch dim 0, any convolution is local.
* Global pooling over the sharded points: ``adaptive_max_pool1d(x, 1)``, ``adaptive_avg_pool1d(x, 1)``
  and ``max_pool1d``/``avg_pool1d`` with a kernel spanning all points (``F.max_pool1d(x, x.shape[-1])``):
  the max/mean reduction over the sharded dim, a :class:`~meshshard.tensor.ReplicatedTensor`
  (indices of ``return_indices=True`` are global).

* ``F.pad`` of the dims other than the sharded one: local.

A kernel wider than one point along the sharded dim needs neighbours' rows, and padding the sharded
dim adds rows at the global ends: both raise (use the halo exchange of :mod:`meshshard.halo` with
the local shard, or the gathered tensor).

**Communication:** convolutions and padding: none. Global max pooling: as ``torch.amax`` over the sharded dim
(one max ``all_reduce`` of ``B C`` values, one sum ``all_reduce`` of ``2 B C`` for the
differentiable value; one more min ``all_reduce`` for ``return_indices``); global average pooling:
as ``torch.mean`` (one ``all_reduce`` of ``B C``). Backward mirrors each differentiable all-reduce.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._dispatch import bind, no_subclass
from .._dispatch import register_rule as register
from .._tensor import ShardTensor
from ._common import local_of, ndim, refuse, wrap


def _tuple(v, n: int) -> tuple:
    return tuple(v) if isinstance(v, (list, tuple)) else (v,) * n


@register(torch.conv1d, torch.conv2d, torch.conv3d)
def _conv(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
             {"stride": 1, "padding": 0, "dilation": 1, "groups": 1})
    x = a["input"]
    if not isinstance(x, ShardTensor) or isinstance(a["weight"], ShardTensor) or isinstance(a["bias"], ShardTensor):
        raise refuse(func, "only a sharded input with replicated weight and bias is supported")
    spec = x._spec
    nd = ndim(x)
    batched = nd == a["weight"].dim()
    if spec.dim == 0 and batched:
        with no_subclass():
            out = func(**{k: local_of(v) for k, v in a.items()})
        return wrap(out, spec, 0)
    if spec.dim == nd - a["weight"].dim() + 1:
        raise refuse(func, "the channel dim is sharded; shard the points instead")
    k = a["weight"].dim() - 2
    kernel = tuple(a["weight"].shape[2:])
    stride, padding = _tuple(a["stride"], k), a["padding"]
    padding = (0,) * k if padding == "valid" or padding == "same" else _tuple(padding, k)
    if any(s != 1 for s in kernel) or any(s != 1 for s in stride) or any(p != 0 for p in padding):
        raise refuse(func, f"a kernel {kernel} with stride {stride} and padding {padding} along the sharded points "
                     "needs neighbouring rows; only kernel size 1, stride 1, no padding is local",
                     "exchange halos (meshshard.halo) and convolve the local shard")
    local_a = {k_: local_of(v) for k_, v in a.items()}
    local = local_a["input"]
    with no_subclass():
        if local.shape[spec.dim] == 0:  # torch refuses an empty spatial dim: convolve one zero point, keep none
            pad = list(local.shape)
            pad[spec.dim] = 1
            local_a["input"] = torch.cat([local, local.new_zeros(pad)], spec.dim)
            out = func(**local_a).narrow(spec.dim, 0, 0)
        else:
            out = func(**local_a)
    return wrap(out, spec, spec.dim)


def _global_pool(func, x: ShardTensor, kind: str, return_indices: bool = False):
    spec = x._spec
    nd = ndim(x)
    if spec.dim != nd - 1:
        if spec.dim == 0 and nd == 3:
            return None  # batch-sharded: local
        raise refuse(func, "pooling along a dim other than the sharded points")
    if kind == "max":
        if return_indices:
            r = torch.max(x, dim=-1, keepdim=True)
            return r.values, r.indices
        return torch.amax(x, dim=-1, keepdim=True)
    return torch.mean(x, dim=-1, keepdim=True)


def _local(func, args, kwargs, x: ShardTensor):
    with no_subclass():
        out = func(*args, **kwargs)
    return wrap(out, x._spec, 0)


@register(F.adaptive_max_pool1d, F.adaptive_max_pool1d_with_indices, torch.adaptive_max_pool1d)
def _adaptive_max(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "output_size", "return_indices"), {"return_indices": False})
    x = a["input"]
    if not isinstance(x, ShardTensor):
        raise refuse(func, "the input must be the ShardTensor")
    idx = bool(a["return_indices"]) or func in (F.adaptive_max_pool1d_with_indices, torch.adaptive_max_pool1d)
    if x._spec.dim == 0 and ndim(x) == 3:
        return _local(func, args, kwargs, x)
    if _tuple(a["output_size"], 1) != (1,):
        raise refuse(func, f"output size {a['output_size']} over the sharded points", "only output_size=1 (global)")
    return _global_pool(func, x, "max", idx)


@register(torch.adaptive_avg_pool1d, F.adaptive_avg_pool1d)
def _adaptive_avg(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "output_size"))
    x = a["input"]
    if not isinstance(x, ShardTensor):
        raise refuse(func, "the input must be the ShardTensor")
    if x._spec.dim == 0 and ndim(x) == 3:
        return _local(func, args, kwargs, x)
    if _tuple(a["output_size"], 1) != (1,):
        raise refuse(func, f"output size {a['output_size']} over the sharded points", "only output_size=1 (global)")
    return _global_pool(func, x, "avg")


def _spans_all(x: ShardTensor, a) -> bool:
    n = x._spec.num_global
    kernel = _tuple(a["kernel_size"], 1)[0]
    stride = a["stride"]
    stride = kernel if stride is None or stride == () or stride == [] else _tuple(stride, 1)[0]
    return (kernel == n and _tuple(a["padding"], 1)[0] == 0 and _tuple(a.get("dilation", 1), 1)[0] == 1
            and stride >= 1)


def _batch_sharded_or_global(func, x, a: dict) -> bool:
    """True: sharded on the batch, pool locally. False: a window over all the points, pool globally.
    Anything else raises (on every rank: decided from the spec and the arguments)."""
    if not isinstance(x, ShardTensor):
        raise refuse(func, "the input must be the ShardTensor")
    if x._spec.dim == 0 and ndim(x) == 3:
        return True
    if x._spec.dim != ndim(x) - 1 or not _spans_all(x, a):
        raise refuse(func, "a pooling window smaller than all the points needs neighbouring rows",
                     "only global pooling (kernel_size = x.shape[-1], no padding) is supported")
    return False


@register(F.max_pool1d, F.max_pool1d_with_indices, torch.max_pool1d, torch.max_pool1d_with_indices)
def _max_pool(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode",
                                  "return_indices"), {"padding": 0, "dilation": 1, "ceil_mode": False,
                                                      "return_indices": False})
    x = a["input"]
    if _batch_sharded_or_global(func, x, a):
        return _local(func, args, kwargs, x)
    idx = bool(a["return_indices"]) or func in (F.max_pool1d_with_indices, torch.max_pool1d_with_indices)
    return _global_pool(func, x, "max", idx)


@register(torch.avg_pool1d, F.avg_pool1d)
def _avg_pool(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad"),
             {"padding": 0, "ceil_mode": False, "count_include_pad": True})
    x = a["input"]
    if _batch_sharded_or_global(func, x, a):
        return _local(func, args, kwargs, x)
    return _global_pool(func, x, "avg")


@register(F.pad, torch._C._nn.pad, torch.constant_pad_nd)
def _pad(func, args, kwargs):
    """``F.pad`` of dims other than the sharded one: local (an empty shard is padded through one zero row,
    so every mode runs on every rank). Padding the sharded dim would add rows at the global ends: it raises."""
    if func is torch.constant_pad_nd:
        a = bind(func, args, kwargs, ("input", "pad", "value"), {"value": 0})
        a["mode"] = "constant"
    else:
        a = bind(func, args, kwargs, ("input", "pad", "mode", "value"), {"mode": "constant"})
        a["mode"] = a["mode"] or "constant"
    x = a["input"]
    if not isinstance(x, ShardTensor):
        raise refuse(func, "the input must be the ShardTensor")
    spec = x._spec
    pad = list(a["pad"])
    back = ndim(x) - 1 - spec.dim  # the sharded dim's position counted from the last
    if len(pad) > 2 * back and any(int(p) != 0 for p in pad[2 * back : 2 * back + 2]):
        raise refuse(func, f"padding the sharded dim {spec.dim} adds rows at the ends of the global tensor",
                     "pad the other dims, or pad x.full_tensor()")
    local = x.to_local()
    with no_subclass():
        empty = local.shape[spec.dim] == 0
        if empty:
            shape = list(local.shape)
            shape[spec.dim] = 1
            local = torch.cat([local, local.new_zeros(shape)], spec.dim)
        if func is torch.constant_pad_nd:
            out = func(local, pad, a["value"])
        else:
            out = F.pad(local, pad, a["mode"], a["value"])
        if empty:
            out = out.narrow(spec.dim, 0, 0)
    return wrap(out, spec, spec.dim)
