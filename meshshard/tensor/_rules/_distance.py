"""Distances and norms: ``cdist``, ``linalg.norm``, ``F.normalize`` and ``cosine_similarity`` along any dim.

* ``torch.cdist(x1, x2)``: sharded queries ``x1 (..., N, D)`` against replicated keys ``x2`` give
  distances ``(..., N, M)`` sharded on the rows; replicated queries against sharded keys give
  ``(..., M, N)`` sharded on the columns (reduce them with ``min``/``topk``-free reductions such as
  ``amin(-1)``, which all-reduce). Both operands sharded would pair every rank's rows with every
  other rank's: it raises (gather one with ``full_tensor()``).
* ``torch.linalg.norm``: vector norms (``ord`` a number, ``dim`` an int or None on a 1-d input) and
  the Frobenius norm over dims including the sharded one, via the reductions' vector norm; other
  matrix norms over the sharded dim raise.
* ``F.normalize(x, p, dim)`` and ``F.cosine_similarity(x1, x2, dim)``: local along a non-sharded
  dim; along the sharded dim the norms (and the dot product) are all-reduced.

**Communication:**

==========================================  ====================================================
``cdist``                                   none
``linalg.norm`` over the sharded dim        as ``vector_norm``: one ``all_reduce`` of the result
``normalize`` along the sharded dim         one ``all_reduce`` of the norm's size
``cosine_similarity`` along the sharded     one ``all_reduce`` of 3x the result's size (dot
dim                                         product and both squared norms, fused)
anything along another dim                  none
==========================================  ====================================================
Backward mirrors each all-reduce once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import comm
from ...errors import ShardingError
from .._dispatch import bind, no_subclass, op_name
from .._dispatch import register_rule as register
from .._tensor import ReplicatedTensor, ShardTensor
from ._common import common_spec, local_of, ndim, norm_dims, plain_along_shard, refuse, replicated, sharded_input, wrap
from ._reduce import SafeRoot, linalg_vector_norm_rule


@register(torch.cdist)
def _cdist(func, args, kwargs):
    a = bind(func, args, kwargs, ("x1", "x2", "p", "compute_mode"),
             {"p": 2.0, "compute_mode": "use_mm_for_euclid_dist_if_necessary"})
    x1, x2 = a["x1"], a["x2"]
    if isinstance(x1, ShardTensor) and isinstance(x2, ShardTensor):
        raise refuse(func, "both operands are sharded: every rank's rows would meet every other rank's",
                     "gather one of them with .full_tensor()")
    x = x1 if isinstance(x1, ShardTensor) else x2
    spec, nd = x._spec, ndim(x)
    if spec.dim == nd - 1:
        raise refuse(func, "the coordinate dim (last) is sharded; shard the points")
    if spec.dim == nd - 2:  # the point dim: rows of the result (x1) or its columns (x2)
        out_dim = nd - 2 if x is x1 else nd - 1
    else:  # a batch dim: the other operand must broadcast along it
        other = x2 if x is x1 else x1
        if other.dim() >= nd - spec.dim and other.shape[spec.dim - nd] != 1:
            raise ShardingError(f"[rank {spec.rank}] cdist: the plain operand spans the sharded batch dim")
        out_dim = spec.dim
    with no_subclass():
        out = func(local_of(x1), local_of(x2), a["p"], a["compute_mode"])
    return wrap(out, spec, out.dim() - (nd - out_dim))


@register(torch.linalg.norm)
def _linalg_norm(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "ord", "dim", "keepdim"), {"keepdim": False}, kwonly=("dtype",))
    x = sharded_input(func, a["input"])
    nd = ndim(x)
    dims = norm_dims(a["dim"], nd, func)
    if dims is not None and x._spec.dim not in dims:
        with no_subclass():
            out = func(*args, **kwargs)
        sd = x._spec.dim if a["keepdim"] else x._spec.dim - sum(1 for d in dims if d < x._spec.dim)
        return wrap(out, x._spec, sd)
    ord_ = a["ord"]
    if dims is None and ord_ is not None and nd != 1:
        if nd == 2 and ord_ == "fro":
            dims = (0, 1)
        else:
            raise refuse(func, f"ord={ord_!r} over all dims of a {nd}-d tensor", "give dim")
    if dims is not None and len(dims) == 2:
        if ord_ not in (None, "fro"):
            raise refuse(func, f"the matrix norm ord={ord_!r} over the sharded dim")
        ord_ = 2
    elif ord_ is None:
        ord_ = 2
    if ord_ == "nuc" or isinstance(ord_, str) and ord_ != "fro":
        raise refuse(func, f"ord={ord_!r} over the sharded dim")
    if isinstance(ord_, (int, float)) and 0 < ord_ < 1:  # the subgradient at zero would be inf * 0 here
        raise refuse(func, f"ord={ord_} (between 0 and 1) over the sharded dim")
    return linalg_vector_norm_rule(torch.linalg.vector_norm, (x, ord_, dims, a["keepdim"]), {"dtype": a["dtype"]})


@register(F.normalize)
def _normalize(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "p", "dim", "eps", "out"), {"p": 2.0, "dim": 1, "eps": 1e-12})
    x = a["input"]
    if a["out"] is not None:
        raise refuse(func, "out= is not supported", "write the result to a new tensor")
    sharded_input(func, x)
    (d,) = norm_dims(a["dim"], ndim(x), func)
    if d != x._spec.dim:
        with no_subclass():
            out = F.normalize(x.to_local(), a["p"], d, a["eps"])
        return wrap(out, x._spec, x._spec.dim)
    denom = torch.linalg.vector_norm(x, a["p"], d, True)  # replicated, size 1 along the sharded dim
    denom = denom.to_plain() if isinstance(denom, ReplicatedTensor) else denom
    with no_subclass():
        out = x.to_local() / denom.clamp_min(a["eps"]).expand_as(x.to_local())
    return wrap(out, x._spec, d)


@register(F.cosine_similarity, torch.cosine_similarity)
def _cosine_similarity(func, args, kwargs):
    a = bind(func, args, kwargs, ("x1", "x2", "dim", "eps"), {"dim": 1, "eps": 1e-8})
    x1, x2 = a["x1"], a["x2"]
    shards = [t for t in (x1, x2) if isinstance(t, ShardTensor)]
    spec = common_spec(shards, func)
    nd = max(ndim(x1), ndim(x2))
    backs = {ndim(t) - t._spec.dim for t in shards}
    if len(backs) != 1:
        raise ShardingError(f"[rank {spec.rank}] {op_name(func)}: the sharded dims do not line up under broadcasting")
    (back,) = backs
    x1 = x1 if isinstance(x1, ShardTensor) else plain_along_shard(func, x1, spec, back)
    x2 = x2 if isinstance(x2, ShardTensor) else plain_along_shard(func, x2, spec, back)
    (d,) = norm_dims(a["dim"], nd, func)
    sd = nd - back
    l1, l2 = local_of(x1), local_of(x2)
    if d != sd:
        with no_subclass():
            out = torch.cosine_similarity(l1, l2, d, a["eps"])
        return wrap(out, spec, sd - (1 if d < sd else 0))
    with no_subclass():
        l1, l2 = torch.broadcast_tensors(l1, l2)
        if not (l1.dtype.is_floating_point or l1.dtype.is_complex):
            raise RuntimeError(f"{op_name(func)}: expected floating-point inputs (got {l1.dtype})")
        parts = torch.stack([(l1 * l2).sum(d), (l1 * l1).sum(d), (l2 * l2).sum(d)])
        both = comm.all_reduce(parts, spec.group)
        dot, n1, n2 = both[0], SafeRoot.apply(both[1], 2.0), SafeRoot.apply(both[2], 2.0)
        eps = a["eps"]
        out = dot / (n1.clamp_min(eps) * n2.clamp_min(eps))
    return replicated(out, spec)
