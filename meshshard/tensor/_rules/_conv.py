"""Convolutions and pooling: sharded along a batch (local), along the points or grid rows (the row halo).

* ``conv1d``/``conv2d``/``conv3d``: sharded on the batch dim 0, local. Sharded along a spatial dim, any
  kernel, stride, dilation, padding (``'same'``/``'valid'`` too) and groups run through the row halo
  (:mod:`._grid`: the window of rows each rank's result rows need, one ``all_to_all``); a kernel of one
  point with stride 1 and no padding (a per-point linear map, PointNet's ``(B, C, N)`` layout) needs
  no row and sends nothing.
* Global pooling over the sharded points: ``adaptive_max_pool1d(x, 1)``, ``adaptive_avg_pool1d(x, 1)``
  and ``max_pool1d``/``avg_pool1d`` with a kernel spanning all points (``F.max_pool1d(x, x.shape[-1])``):
  the max/mean reduction over the sharded dim, a :class:`~meshshard.tensor.ReplicatedTensor`
  (indices of ``return_indices=True`` are global). Any other window goes through the row halo.

**Communication:** convolutions: as :mod:`._grid` (none for a one-point kernel). Global max pooling: as
``torch.amax`` over the sharded dim (one max ``all_reduce`` of ``B C`` values, one sum ``all_reduce`` of
``2 B C`` for the differentiable value; one more min ``all_reduce`` for ``return_indices``); global average
pooling: as ``torch.mean`` (one ``all_reduce`` of ``B C``). Backward mirrors each differentiable all-reduce.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._dispatch import bind, no_subclass
from .._dispatch import register_rule as register
from .._tensor import ShardTensor
from ._common import local_of, ndim, refuse, sharded_input, wrap
from ._grid import avg_pool, conv_rows, max_pool


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
    return conv_rows(func, a, x, k, spec.dim - (nd - k))


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
    x = sharded_input(func, a["input"])
    idx = bool(a["return_indices"]) or func in (F.adaptive_max_pool1d_with_indices, torch.adaptive_max_pool1d)
    if x._spec.dim == 0 and ndim(x) == 3:
        return _local(func, args, kwargs, x)
    if _tuple(a["output_size"], 1) != (1,):
        raise refuse(func, f"output size {a['output_size']} over the sharded points", "only output_size=1 (global)")
    return _global_pool(func, x, "max", idx)


@register(torch.adaptive_avg_pool1d, F.adaptive_avg_pool1d)
def _adaptive_avg(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "output_size"))
    x = sharded_input(func, a["input"])
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


def _global_window(func, x, a: dict) -> bool:
    """A window over all the points of a ``(B, C, N)`` input sharded along ``N``: pool globally (a replicated
    result). Anything else goes through the row halo (decided from the spec and the arguments)."""
    sharded_input(func, x)
    return x._spec.dim == ndim(x) - 1 and ndim(x) == 3 and _spans_all(x, a)


@register(F.max_pool1d, F.max_pool1d_with_indices, torch.max_pool1d, torch.max_pool1d_with_indices)
def _max_pool(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode",
                                  "return_indices"), {"padding": 0, "dilation": 1, "ceil_mode": False,
                                                      "return_indices": False})
    x = a["input"]
    if not _global_window(func, x, a):
        return max_pool(func, a, 1)
    idx = bool(a["return_indices"]) or func in (F.max_pool1d_with_indices, torch.max_pool1d_with_indices)
    return _global_pool(func, x, "max", idx)


@register(torch.avg_pool1d, F.avg_pool1d)
def _avg_pool(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad"),
             {"padding": 0, "ceil_mode": False, "count_include_pad": True})
    x = a["input"]
    if not _global_window(func, x, a):
        return avg_pool(func, a, 1)
    return _global_pool(func, x, "avg")
