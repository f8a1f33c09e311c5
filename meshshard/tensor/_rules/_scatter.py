"""Scatter and segment reductions: ``index_add``, ``index_reduce``, ``scatter_add``, ``scatter_reduce``, ``scatter``.

Two layouts are supported (``torch_geometric.utils.scatter`` runs through them unchanged):

* **Local**: the target is a ShardTensor and the scatter runs along another dim than the sharded one,
  with the index (``scatter*``) and source sharded the same way: each rank scatters its own rows.
* **Replicated target** (per-graph, per-region or per-part pooling of points): the target is a
  plain tensor (the same on every rank), the source and index are sharded along the scatter dim
  (the points); a plain source spanning the points (e.g. ``src.new_ones(N)``) is replicated by
  convention and narrowed to this rank's rows. In-place forms (``zeros.scatter_add_(...)``, as
  torch_geometric writes them) compute the result and copy it into the target. ``sum`` (``index_add``, ``scatter_add``,
  ``scatter_reduce(..., "sum")``) and ``mean`` scatter each rank's rows into zeros and all-reduce
  the partial sums (with the counts and an out-of-range flag in the same buffer, so a bad index
  raises ``IndexError`` on every rank); ``amax``/``amin``/``prod`` (and ``scatter`` without a
  reduction, whose last write wins) gather the sharded source and index and run torch's op on
  every rank, so ties, NaN and gradients are torch's own. The result is a
  :class:`~meshshard.tensor.ReplicatedTensor`; the target's gradient is partial on each rank, as for
  every replicated value.

Scattering into a *sharded* target along its sharded dim would move rows to the ranks that own
them (index values are global rows): it raises; gather the target or use :mod:`meshshard.halo`.

**Communication:**

==========================================  ========================================================
local layout                                none
replicated target, ``sum``                  one ``all_reduce`` of the target's size (+1 element);
                                            backward: one ``all_reduce`` of the target's size
replicated target, ``mean`` (or ``sum``     one ``all_reduce`` of twice the target's size (+1)
with ``include_self=False``)
replicated target, ``amax``/``amin``/       two ``all_to_all`` (source and index gathered:
``prod``/no reduction                       ``P * N_local`` rows each); backward: one ``all_to_all``
==========================================  ========================================================
"""

from __future__ import annotations

import torch

from ... import comm
from .._dispatch import bind, no_subclass, op_name
from .._dispatch import register_rule as register
from .._tensor import ShardTensor
from ._common import common_spec, local_of, ndim, norm_dims, plain_along_shard, refuse, replicated, wrap

T = torch.Tensor

_INDEX_ADD = (torch.index_add, T.index_add, T.index_add_)
_INDEX_REDUCE = (torch.index_reduce, T.index_reduce, T.index_reduce_)
_SCATTER_ADD = (torch.scatter_add, T.scatter_add, T.scatter_add_)
_SCATTER_REDUCE = (torch.scatter_reduce, T.scatter_reduce, T.scatter_reduce_)
_SCATTER = (torch.scatter, T.scatter, T.scatter_)
_INPLACE = (T.index_add_, T.index_reduce_, T.scatter_add_, T.scatter_reduce_, T.scatter_)
_OUT_OF_PLACE = {T.index_add_: T.index_add, T.index_reduce_: T.index_reduce, T.scatter_add_: T.scatter_add,
                 T.scatter_reduce_: T.scatter_reduce, T.scatter_: T.scatter}


def _parse(func, args, kwargs) -> dict:
    if func in _INDEX_ADD:
        a = bind(func, args, kwargs, ("input", "dim", "index", "source"), {"alpha": 1}, kwonly=("alpha",))
        a.update(src=a.pop("source"), reduce="sum", include_self=True, kind="index")
    elif func in _INDEX_REDUCE:
        a = bind(func, args, kwargs, ("input", "dim", "index", "source", "reduce"), {"include_self": True},
                 kwonly=("include_self",))
        a.update(src=a.pop("source"), alpha=1, kind="index")
    elif func in _SCATTER_ADD:
        a = bind(func, args, kwargs, ("input", "dim", "index", "src"))
        a.update(reduce="sum", include_self=True, alpha=1, kind="scatter")
    elif func in _SCATTER_REDUCE:
        a = bind(func, args, kwargs, ("input", "dim", "index", "src", "reduce"), {"include_self": True},
                 kwonly=("include_self",))
        a.update(alpha=1, kind="scatter")
    else:
        a = bind(func, args, kwargs, ("input", "dim", "index", "src"), kwonly=("value", "reduce"))
        if a["src"] is None:
            a["src"] = a["value"]
        a.update(alpha=1, include_self=True, kind="scatter",
                 reduce={"add": "sum", "multiply": "prod", None: "assign"}.get(a["reduce"], a["reduce"]))
    return a


def _call(func, a, inp, index, src):
    """torch's op on plain operands (the argument forms of ``func``)."""
    dim = a["dim"]
    with no_subclass():
        if func in _INDEX_ADD:
            return func(inp, dim, index, src, alpha=a["alpha"])
        if func in _INDEX_REDUCE or func in _SCATTER_REDUCE:
            return func(inp, dim, index, src, a["reduce"], include_self=a["include_self"])
        if func in _SCATTER_ADD:
            return func(inp, dim, index, src)
        if a.get("value") is not None:
            return func(inp, dim, index, value=src, reduce=a["reduce_arg"]) if a["reduce_arg"] else \
                func(inp, dim, index, value=src)
        return func(inp, dim, index, src, reduce=a["reduce_arg"]) if a["reduce_arg"] else func(inp, dim, index, src)


@register(*_INDEX_ADD, *_INDEX_REDUCE, *_SCATTER_ADD, *_SCATTER_REDUCE, *_SCATTER)
def _scatter(func, args, kwargs):
    reduce_arg = kwargs.get("reduce") if func in _SCATTER else None
    a = _parse(func, args, kwargs)
    a["reduce_arg"] = reduce_arg
    inp, index, src = a["input"], a["index"], a["src"]
    shards = [t for t in (inp, index, src) if isinstance(t, ShardTensor)]
    spec = common_spec(shards, func)
    if not isinstance(inp, torch.Tensor) or not isinstance(index, torch.Tensor):
        raise TypeError(f"{op_name(func)}: expected tensors for input and index")
    (d,) = norm_dims(a["dim"], ndim(inp), func)
    a["dim"] = d
    if isinstance(inp, ShardTensor):
        return _local(func, a, inp, index, src, d)
    if func in _INPLACE:  # e.g. torch_geometric: src.new_zeros(size).scatter_add_(dim, index, src)
        with no_subclass():
            before = inp.clone()  # what backward needs of the target, kept from the copy below
        out = _into_replicated(_OUT_OF_PLACE[func], a, before, index, src, d, spec)
        with no_subclass():
            inp.copy_(out.to_plain())
        return replicated(inp, spec)
    return _into_replicated(func, a, inp, index, src, d, spec)


def _local(func, a, inp: ShardTensor, index, src, d: int):
    spec = inp._spec
    if d == spec.dim:
        raise refuse(func, f"scattering along the sharded dim {d} of the target moves rows between ranks (index "
                     "values are global rows)", "scatter into a replicated target, or gather with .full_tensor()")
    back = ndim(inp) - spec.dim
    if a["kind"] == "index":
        if isinstance(index, ShardTensor):
            raise refuse(func, "the index of index_add/index_reduce along a non-sharded dim must be plain")
    elif not isinstance(index, ShardTensor) or index._spec.dim != spec.dim:
        raise refuse(func, "the index must be a ShardTensor sharded like the target")
    if isinstance(src, ShardTensor):
        if src._spec.dim != spec.dim:
            raise refuse(func, "the source must be sharded along the same dim as the target")
    elif isinstance(src, torch.Tensor) and src.dim() > 0:
        src = plain_along_shard(func, src, spec, back)
    out = _call(func, a, inp if func in _INPLACE else local_of(inp), local_of(index), local_of(src))
    return inp if func in _INPLACE else wrap(out, spec, spec.dim)


def _into_replicated(func, a, inp, index, src, d: int, spec):
    if not isinstance(index, ShardTensor):
        raise refuse(func, "a sharded source with a plain index", "shard the index like the source")
    want = 0 if a["kind"] == "index" else d
    if index._spec.dim != want:
        raise refuse(func, f"the index must be sharded along dim {want} (the scatter dim of its points)")
    if isinstance(src, ShardTensor):
        if src._spec.dim != d:
            raise refuse(func, f"the source is sharded along dim {src._spec.dim}, not the scatter dim {d}; "
                         "the target would have to be sharded too")
    elif isinstance(src, torch.Tensor) and src.dim() > 0:
        a["src_plain"] = src
        src = _narrow_plain(func, src, spec, d)
    reduce = a["reduce"]
    if reduce not in ("sum", "mean", "amax", "amin", "prod", "assign"):
        raise RuntimeError(f"{op_name(func)}: reduce argument must be one of sum, prod, mean, amax, amin "
                           f"(got {reduce!r})")
    dtype = inp.dtype
    fused = reduce in ("sum", "mean") and dtype.is_floating_point or reduce == "sum" and not (
        dtype == torch.bool or dtype.is_complex)
    if not fused:
        return _gathered(func, a, inp, index, a.get("src_plain", src), spec)
    li, ls = local_of(index), local_of(src)
    size = inp.shape[d]
    bad = ((li < 0) | (li >= size)).any() if li.numel() else torch.zeros((), dtype=torch.bool)
    li = torch.where((li < 0) | (li >= size), torch.zeros_like(li), li)
    zeros = torch.zeros_like(inp)
    with no_subclass():
        if a["kind"] == "index":
            ls_ = ls if not bad else ls * 0
            part = torch.index_add(zeros, d, li, ls_, alpha=a["alpha"])
        else:
            if not isinstance(ls, torch.Tensor):
                ls = torch.full(li.shape, ls, dtype=dtype)
            ls_ = ls if not bad else ls * 0
            part = torch.scatter_add(zeros, d, li, ls_[tuple(slice(0, s) for s in li.shape)])
    need_count = reduce == "mean" or not a["include_self"]
    pieces = [part.reshape(-1)]
    if need_count:
        with no_subclass():
            if a["kind"] == "index":
                ones = torch.ones(li.numel(), dtype=dtype)
                cnt = torch.zeros(size, dtype=dtype).index_add(0, li, ones * (not bad))
                cnt = cnt.reshape([size if i == d else 1 for i in range(inp.dim())]).expand_as(inp)
            else:
                ones = torch.full(li.shape, float(not bad), dtype=dtype)
                cnt = torch.scatter_add(torch.zeros_like(inp.detach()), d, li, ones)
        pieces.append(cnt.reshape(-1))
    pieces.append(bad.to(dtype).reshape(1))
    both = comm.all_reduce(torch.cat(pieces), spec.group)
    if bool(both[-1].detach() > 0):
        raise IndexError(f"{op_name(func)}: an index is out of bounds for dim {d} of size {size} (on some rank)")
    k = inp.numel()
    total = both[:k].reshape(inp.shape)
    if need_count:
        count = both[k : 2 * k].reshape(inp.shape).detach()
    inc = 1.0 if a["include_self"] else 0.0
    with no_subclass():
        if reduce == "sum":
            out = inp + total if a["include_self"] else torch.where(count > 0, total, inp)
        else:
            denom = count + inc
            out = torch.where(count > 0, (inp * inc + total) / torch.where(denom > 0, denom, torch.ones_like(denom)),
                              inp)
    return replicated(out, spec)


def _narrow_plain(func, src: torch.Tensor, spec, d: int) -> torch.Tensor:
    if src.dim() <= d or src.shape[d] == 1:
        return src
    if src.shape[d] != spec.num_global:
        raise refuse(func, f"a plain source of shape {tuple(src.shape)} does not span the {spec.num_global} points")
    with no_subclass():
        return src.narrow(d, spec.offsets[spec.rank], spec.sizes[spec.rank])


def _gathered(func, a, inp, index, src, spec):
    """Every rank runs torch's op on the gathered index and source (a plain source is already whole)."""
    full_index = index.full_tensor().to_plain()
    full_src = src.full_tensor().to_plain() if isinstance(src, ShardTensor) else src
    out = _call(func, a, inp, full_index, full_src)
    return replicated(out, spec)
