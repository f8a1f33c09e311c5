"""Selection and counting with sharded inputs: ``unique``, ``unique_consecutive``, ``searchsorted``,
``bucketize``, ``histc``, ``histogram``, ``bincount``.

What each returns (decided from specs and arguments, alike on every rank):

=========================  ===================================================  ===================================
op                         result                                               **Communication**
=========================  ===================================================  ===================================
``unique`` (``dim=None``    values, counts: ReplicatedTensor (sorted, as torch);  one ``all_gather`` (P ints), two
or the sharded dim)        inverse: sharded like the input (``dim=None``) or    ``all_to_all_single`` of the ranks'
                           along dim 0 with the input's sizes (``dim=d``)       local uniques (values and counts)
``unique_consecutive``     the same (runs that straddle a cut are merged)       the same
``unique`` along another   gathered (:mod:`._linalg`'s path): values sharded    one ``all_to_all_single`` of the
dim                        like the input, inverse/counts replicated            input
``searchsorted`` /         values sharded, sorted sequence plain (or sharded    none
``bucketize``              alike along a batch dim): sharded like the values
                           sorted sequence sharded along its sorted (last)      one ``all_reduce`` of the result
                           dim: every rank counts its boundaries below each     (+ one ``all_to_all_single`` of the
                           value; result replicated, or sharded like sharded    values when they are sharded)
                           values
``histc``, ``histogram``   ReplicatedTensor (histogram: and its bin edges)      one ``all_reduce`` of 2 scalars
                                                                                (range from the data) + one of the
                                                                                ``bins`` counts
``bincount``               ReplicatedTensor                                     one ``all_reduce`` of 2 ints + one
                                                                                of the counts
=========================  ===================================================  ===================================

Bins and ranges come from global minima/maxima found by all-reduces, then torch computes the bin
edges from them exactly as on the gathered tensor (so values on an edge fall in the same bin). None of
these ops is differentiable in torch (nor here).
"""

from __future__ import annotations

import torch

from ... import comm
from ..._sizes import offsets_of
from .._dispatch import bind
from .._dispatch import register_rule as register
from .._tensor import ReplicatedTensor, ShardTensor
from ._common import common_spec, dim_of, ndim, no_subclass, refuse, replicated, shard_args, sharded_input, wrap
from ._linalg import gather_compute_reshard

T = torch.Tensor


# -- unique / unique_consecutive -------------------------------------------------------------------
def _gather_rows(local: torch.Tensor, dim: int, spec) -> tuple[torch.Tensor, tuple[int, ...]]:
    """Every rank's ``local`` concatenated along ``dim`` (lengths differ per rank), and those lengths."""
    sizes = comm.all_gather_object_sizes(local.shape[dim], spec.group)
    send = local.to(torch.uint8) if local.dtype == torch.bool else local
    full = comm.gather_uneven(send.detach().contiguous(), sizes, dim, spec.group)
    return (full.bool() if local.dtype == torch.bool else full), sizes


def _two_stage(fn, x: ShardTensor, dim: int | None, inverse: bool, counts: bool):
    """``fn`` (``torch.unique`` or ``torch.unique_consecutive``) on each shard, then on the ranks' results.

    Within a rank the local results are distinct (sorted, or distinct neighbours), so the second pass
    merges exactly what the gathered tensor would: equal values from different ranks (``unique``), equal
    runs meeting at a cut (``unique_consecutive``). Counts add up through the second inverse.
    """
    spec = x._spec
    with no_subclass():
        local = x.to_local() if dim is not None else x.to_local().reshape(-1)
        kw = {} if dim is None else {"dim": dim}
        u_l, inv_l, cnt_l = fn(local, return_inverse=True, return_counts=True, **kw)
    d = 0 if dim is None else dim
    cat, sizes = _gather_rows(u_l, d, spec)
    cnt_all, _ = _gather_rows(cnt_l, 0, spec)
    with no_subclass():
        u, inv2 = fn(cat, return_inverse=True, **kw)
        total = torch.zeros(u.shape[d], dtype=cnt_all.dtype).index_add_(0, inv2, cnt_all)
        start = offsets_of(sizes)[spec.rank]
        mine = inv2[start:start + sizes[spec.rank]]
        inv = mine[inv_l].reshape(x.to_local().shape if dim is None else (-1,))
    out = [replicated(u, spec)]
    if inverse:
        out.append(wrap(inv, spec, spec.dim if dim is None else 0))
    if counts:
        out.append(replicated(total, spec))
    return out[0] if len(out) == 1 else tuple(out)


@register(torch.unique, T.unique, torch.unique_consecutive, T.unique_consecutive)
def _unique(func, args, kwargs):
    consecutive = func in (torch.unique_consecutive, T.unique_consecutive)
    names = ("input", "return_inverse", "return_counts", "dim") if consecutive else (
        "input", "sorted", "return_inverse", "return_counts", "dim")
    a = bind(func, args, kwargs, names, {"sorted": True, "return_inverse": False, "return_counts": False})
    x = sharded_input(func, a["input"])
    if not consecutive and not a["sorted"]:
        # torch on the CPU returns sorted values either way; elsewhere the order is the implementation's
        a["sorted"] = True
    dim = None if a["dim"] is None else dim_of(func, x, a["dim"])
    fn = torch.unique_consecutive if consecutive else torch.unique
    flat_in_order = dim is None and all(s == 1 for s in x._spec.global_shape[: x._spec.dim])
    if dim == x._spec.dim or flat_in_order:
        return _two_stage(fn, x, dim, bool(a["return_inverse"]), bool(a["return_counts"]))
    # another dim (or a flattening that interleaves the shards): every slice spans the ranks
    kw = {"return_inverse": a["return_inverse"], "return_counts": a["return_counts"], "dim": a["dim"]}
    return gather_compute_reshard(fn, (x,), kw)


# -- searchsorted / bucketize ------------------------------------------------------------------------
def _plain(t):
    return t.to_plain() if isinstance(t, ReplicatedTensor) else t


def _search(func, seq, values, right: bool, out_int32: bool, sorter):
    """``searchsorted(seq, values)`` with either or both sharded."""
    shards = shard_args((seq, values), {})
    if not isinstance(seq, ShardTensor):  # values sharded: rows are independent
        v = values
        if seq.dim() > 1 and v._spec.dim < ndim(v) - 1 and seq.shape[v._spec.dim] != 1:
            raise refuse(func, "the sorted sequence is plain and spans the values' sharded batch dim",
                         "shard it the same way")
        with no_subclass():
            out = torch.searchsorted(_plain(seq), v.to_local(), right=right, out_int32=out_int32, sorter=sorter)
        return wrap(out, v._spec, v._spec.dim)
    s = seq._spec
    if sorter is not None:
        raise refuse(func, "sorter= with a sharded sorted sequence is not supported", "sort the sequence first")
    if s.dim != ndim(seq) - 1:  # sharded along a batch dim
        if not isinstance(values, ShardTensor) or s.dim >= ndim(values) - 1:
            raise refuse(func, "the sorted sequence is sharded along a batch dim; shard the values alike")
        common_spec(shards, func)
        with no_subclass():
            out = torch.searchsorted(seq.to_local(), values.to_local(), right=right, out_int32=out_int32)
        return wrap(out, values._spec, values._spec.dim)
    full_v = values.full_tensor().to_plain() if isinstance(values, ShardTensor) else _plain(values)
    with no_subclass():
        part = torch.searchsorted(seq.to_local(), full_v, right=right)  # this rank's boundaries below each value
    total = comm.all_reduce(part, s.group)
    total = total.to(torch.int32) if out_int32 else total
    if isinstance(values, ShardTensor):
        vs = values._spec
        with no_subclass():
            mine = total.narrow(vs.dim, vs.offsets[vs.rank], vs.sizes[vs.rank])
        return wrap(mine, vs, vs.dim)
    return replicated(total, s)


@register(torch.searchsorted, T.searchsorted if hasattr(T, "searchsorted") else None)
def _searchsorted(func, args, kwargs):
    a = bind(func, args, kwargs, ("sorted_sequence", "input"), kwonly=("out_int32", "right", "side", "sorter"))
    right = bool(a["right"]) or a["side"] == "right"
    if a["side"] == "left" and a["right"]:
        raise RuntimeError("torch.searchsorted(): side and right can't be set to opposites, got side of left "
                           "while right was True")
    if not isinstance(a["input"], torch.Tensor):
        raise refuse(func, "a scalar value with a sharded sorted sequence is not supported", "pass a tensor")
    return _search(func, a["sorted_sequence"], a["input"], right, bool(a["out_int32"]), a["sorter"])


@register(torch.bucketize, T.bucketize if hasattr(T, "bucketize") else None)
def _bucketize(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "boundaries"), kwonly=("out_int32", "right"))
    if ndim(a["boundaries"]) != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({ndim(a['boundaries'])})")
    if not isinstance(a["input"], torch.Tensor):
        raise refuse(func, "a scalar input with sharded boundaries is not supported", "pass a tensor")
    return _search(func, a["boundaries"], a["input"], bool(a["right"]), bool(a["out_int32"]), None)


# -- histograms ---------------------------------------------------------------------------------------
def _global_range(x: ShardTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) of every element of ``x`` (NaN if any is NaN), one all-reduce of two scalars."""
    if not x.dtype.is_floating_point:
        raise RuntimeError(f"histogram/histc: input must be a floating-point tensor (got {x.dtype})")
    with no_subclass():
        local = x.to_local().detach().reshape(-1)
        big = torch.tensor(float("inf"), dtype=local.dtype)
        lo = local.min() if local.numel() else big
        hi = local.max() if local.numel() else -big
        nan = torch.isnan(local).any()
        packed = torch.stack([-lo, hi, nan.to(local.dtype)])
    packed = comm.all_reduce_max(packed, x._spec.group)
    if packed[2] > 0:
        return packed[2] * float("nan"), packed[2] * float("nan")
    return -packed[0], packed[1]


def _weights(func, w, x: ShardTensor):
    if w is None:
        return None
    if not isinstance(w, ShardTensor):
        raise refuse(func, "weights must be a ShardTensor sharded like the input")
    common_spec([x, w], func)
    return w.to_local()


@register(torch.histc, T.histc)
def _histc(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "bins", "min", "max"), {"bins": 100, "min": 0, "max": 0})
    x = sharded_input(func, a["input"])
    lo, hi = float(a["min"]), float(a["max"])
    if lo == hi and x._spec.global_shape.numel() > 0:
        glo, ghi = _global_range(x)
        lo, hi = float(glo), float(ghi)
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    with no_subclass():
        part = torch.histc(x.to_local(), a["bins"], lo, hi)
    return replicated(comm.all_reduce(part, x._spec.group), x._spec)


@register(torch.histogram, T.histogram)
def _histogram(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "bins"), {"bins": 100}, kwonly=("range", "weight", "density"))
    x, bins = a["input"], a["bins"]
    if not isinstance(x, ShardTensor) or isinstance(bins, ShardTensor):
        raise refuse(func, "the input must be the ShardTensor and bins plain")
    w = _weights(func, a["weight"], x)
    if isinstance(bins, torch.Tensor):
        edges = _plain(bins)
    else:
        probe_range = a["range"]
        if probe_range is None and x._spec.global_shape.numel() > 0:
            probe = torch.stack(_global_range(x))
        else:
            probe = torch.empty(0, dtype=x.dtype)
        with no_subclass():
            edges = torch.histogram(probe, bins, range=probe_range).bin_edges
    with no_subclass():
        if isinstance(bins, torch.Tensor):
            part = torch.histogram(x.to_local(), edges, weight=w).hist
        else:
            span = (float(edges[0]), float(edges[-1]))
            part = torch.histogram(x.to_local(), bins, range=span, weight=w).hist
    hist = comm.all_reduce(part, x._spec.group)
    if a["density"]:
        with no_subclass():
            hist = hist / (hist.sum() * (edges[1:] - edges[:-1]))
    return torch.return_types.histogram((replicated(hist, x._spec), replicated(edges, x._spec)))


@register(torch.bincount, T.bincount)
def _bincount(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "weights", "minlength"), {"minlength": 0})
    x = sharded_input(func, a["input"])
    if ndim(x) != 1 or x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    w = _weights(func, a["weights"], x)
    with no_subclass():
        local = x.to_local()
        wide = local.long()
        ext = torch.stack([-wide.min() if local.numel() else torch.tensor(0),
                           wide.max() if local.numel() else torch.tensor(-1)])
    ext = comm.all_reduce_max(ext, x._spec.group)
    if ext[0] > 0:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    length = max(int(a["minlength"]), int(ext[1]) + 1)
    with no_subclass():
        part = torch.bincount(local, w, minlength=length)
        if w is not None and x._spec.global_shape.numel() > 0:  # an empty shard's weighted count is int64
            part = part.to(torch.bincount(torch.zeros(1, dtype=local.dtype), torch.zeros(1, dtype=w.dtype)).dtype)
    return replicated(comm.all_reduce(part, x._spec.group), x._spec)

