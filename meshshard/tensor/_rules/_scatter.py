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

* **Sharded target** (message passing: edges or messages into nodes sharded along the points): the
  target is a ShardTensor sharded along the scatter dim, index values are its global rows, and the
  index and source are sharded along the scatter dim with any sizes (the contributions), or plain
  (replicated). One ``all_reduce`` of three flags agrees on every rank whether an index is out of
  range (``IndexError`` everywhere), whether any index belongs to another rank, and whether a
  ``scatter*`` index varies along the other dims. When every index is owned (edges held by their
  targets' owners, :func:`meshshard.ops.shard_edges`) the scatter is local; otherwise each
  contribution row (or single element, for a varying index) is sent to the owner of its row with
  ``all_to_all`` (this rank's own rows stay). The owner runs torch's op once on everything aimed at
  its rows, in global order, so every reduction, ``include_self`` both ways, last-write ``scatter``
  (as torch on CPU) and their gradients are torch's own. No rank holds more than its own rows.
  ``index_put(..., accumulate=True)`` with one index tensor is ``index_add`` along its dim.

How the output of PyG's ``src.new_zeros((N, C)).scatter_add_(0, index, src)`` gets its sharding:
``new_zeros`` of a ShardTensor whose rows target nodes (``spec.node_sizes``, set by ``shard_edges``
and kept by the ops that keep rows) with ``N`` nodes along its sharded dim is sharded like the nodes
(:mod:`._local`); it is decided from the spec and the shape, never from one rank's data.

**Communication:**

==========================================  ========================================================
local layout                                none
replicated target, ``sum``                  one ``all_reduce`` of the target's size (+1 element);
                                            backward: one ``all_reduce`` of the target's size
replicated target, ``mean`` (or ``sum``     one ``all_reduce`` of twice the target's size (+1)
with ``include_self=False``)
replicated target, ``amax``/``amin``/       two ``all_to_all`` (source and index gathered:
``prod``/no reduction                       ``P * N_local`` rows each); backward: one ``all_to_all``
sharded target, every index owned           one ``all_reduce`` of 3 int64
sharded target, routed                      one ``all_reduce`` of 3 int64, three ``all_to_all``
                                            (counts, indices, the rows sent to other ranks; four
                                            for single elements: positions too); backward: one
                                            ``all_to_all`` of the row gradients
==========================================  ========================================================
"""

from __future__ import annotations

import math

import torch

from ... import comm
from ..._sizes import offsets_of, owner_of
from .._dispatch import bind, no_subclass, op_name
from .._dispatch import register_rule as register
from .._tensor import ShardTensor
from ._common import (
    common_spec,
    corner_positions,
    local_of,
    ndim,
    norm_dims,
    plain_along_shard,
    refuse,
    replicated,
    wrap,
)

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
    if not isinstance(inp, torch.Tensor) or not isinstance(index, torch.Tensor):
        raise TypeError(f"{op_name(func)}: expected tensors for input and index")
    (d,) = norm_dims(a["dim"], ndim(inp), func)
    a["dim"] = d
    if isinstance(inp, ShardTensor) and inp._spec.dim == d:
        return into_sharded(func, a, inp, index, src, d)
    shards = [t for t in (inp, index, src) if isinstance(t, ShardTensor)]
    spec = common_spec(shards, func)
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


# -- into a target sharded along the scatter dim -------------------------------------------------------
_REDUCES = ("sum", "mean", "amax", "amin", "prod", "assign")


def _contributions(func, index, src, d: int, scatter_kind: bool):
    """``(index spec or None, local index, local source)``: a sharded index with its source sharded or
    narrowed alike, or a plain (replicated) index and source."""
    if isinstance(index, ShardTensor):
        ispec = index._spec
        want = d if scatter_kind else 0
        if ispec.dim != want:
            raise refuse(func, f"the index must be sharded along dim {want} (its rows are the contributions)")
        if isinstance(src, ShardTensor):
            if src._spec.dim != d:
                raise refuse(func, f"the source must be sharded along the scatter dim {d}, like the index")
            common_spec([index, src], func)
        elif isinstance(src, torch.Tensor) and src.dim() > 0:
            src = _narrow_plain(func, src, ispec, d)
        return ispec, index.to_local(), local_of(src)
    if isinstance(src, ShardTensor):
        raise refuse(func, "a sharded source with a plain index", "shard the index like the source")
    return None, index, local_of(src)


def _as_rows(li: torch.Tensor, ls, dtype: torch.dtype, d: int, scatter_kind: bool):
    """The index and the source with the contributions' rows along dim 0 (a scalar ``value`` expanded)."""
    li = li.reshape(-1) if not scatter_kind else li
    if not isinstance(ls, torch.Tensor):  # scatter(..., value=v)
        ls = torch.full(li.shape, ls, dtype=dtype, device=li.device)
    elif ls.dim() == 0 and scatter_kind:
        ls = ls.expand(li.shape)
    if scatter_kind:  # torch uses the index-shaped corner of the source
        ls = ls[tuple(slice(0, k) for k in li.shape)]
    return (li.movedim(d, 0) if scatter_kind else li), ls.movedim(d, 0)


def into_sharded(func, a: dict, inp: ShardTensor, index, src, d: int):
    """Scatter into a target sharded along ``d``: each contribution is applied by the owner of its row.

    The index holds global rows of the target. Contributions (index, source) are sharded along the
    scatter dim with any sizes (e.g. edges held by their targets' owners), or plain (replicated: the
    same on every rank), in which case each rank applies the ones that hit its rows. One small
    ``all_reduce`` agrees on three flags: an index out of range (``IndexError`` on every rank), an
    index owned by another rank (then contributions are routed to their owners), and an index of
    ``scatter*`` that is not constant along the other dims (then single elements are routed, not rows).
    Every owner runs torch's op once on all the contributions to its rows, in global order, so every
    reduction (``include_self`` both ways) and its gradient are torch's own.
    """
    spec = inp._spec
    if a["reduce"] not in _REDUCES:
        raise RuntimeError(f"{op_name(func)}: reduce argument must be one of sum, prod, mean, amax, amin "
                           f"(got {a['reduce']!r})")
    scatter_kind = a["kind"] == "scatter"
    ispec, li, ls = _contributions(func, index, src, d, scatter_kind)
    if scatter_kind and li.dim() != ndim(inp):
        raise RuntimeError(f"{op_name(func)}: Index tensor must have the same number of dimensions as self tensor")
    if not scatter_kind and li.dim() > 1:
        raise IndexError(f"{op_name(func)}: Index is supposed to be a vector")
    n = spec.num_global
    lo, hi = spec.offsets[spec.rank], spec.offsets[spec.rank + 1]
    with no_subclass():
        rows_i, rows_s = _as_rows(li, ls, inp.dtype, d, scatter_kind)
        flat_i = rows_i.reshape(rows_i.shape[0], math.prod(rows_i.shape[1:]))
        first = flat_i[:, :1] if flat_i.shape[1] else rows_i.new_zeros((rows_i.shape[0], 1))
        bad = bool(((rows_i < 0) | (rows_i >= n)).any()) if rows_i.numel() else False
        # replicated contributions (no ispec): each rank keeps the ones that hit its rows, none is foreign
        foreign = ispec is not None and rows_i.numel() > 0 and bool(((rows_i < lo) | (rows_i >= hi)).any())
        ragged = scatter_kind and rows_i.dim() > 1 and rows_i.numel() > 0 and bool(
            (flat_i != first).any())
    flags = comm.all_reduce_max(torch.tensor([int(bad), int(foreign), int(ragged)]), spec.group)
    if int(flags[0]):
        raise IndexError(f"{op_name(func)}: an index is out of bounds for dim {d} of size {n} (on some rank)")
    if a["alpha"] != 1:
        rows_s = rows_s * a["alpha"]
    if int(flags[2]):
        return _elements_to_owners(func, a, inp, rows_i, rows_s, d, spec, route=ispec is not None)
    row_index = first.reshape(-1) if scatter_kind else rows_i
    if ispec is None:
        keep = ((row_index >= lo) & (row_index < hi)).nonzero().reshape(-1)
        row_index, rows_s = row_index[keep], rows_s.index_select(0, keep.to(rows_s.device))
    elif int(flags[1]):
        row_index, rows_s = _rows_to_owners(row_index, rows_s, spec)
    return _apply_owned(func, a, inp, row_index - lo, rows_s, d, rows_i.shape[1:])


def _owners(spec, index: torch.Tensor) -> torch.Tensor:
    return owner_of(index, spec.offsets).clamp_(0, spec.num_ranks - 1)


def _route(spec, owner: torch.Tensor, *payloads: torch.Tensor) -> list[torch.Tensor]:
    """Send each row of every payload to its ``owner``; this rank's own rows stay (not on the wire).

    The rows an owner receives are in global order (by sending rank, then local order), its own in
    its rank's place. **Communication:** one ``all_to_all`` of the counts, one per payload (differentiable).
    """
    P, me = spec.num_ranks, spec.rank
    order = torch.argsort(owner, stable=True)
    counts = torch.bincount(owner, minlength=P) if owner.numel() else torch.zeros(P, dtype=torch.long)
    own = int(counts[me])
    start = int(counts[:me].sum())
    send = counts.clone()
    send[me] = 0
    recv = comm.all_to_all(send.reshape(P, 1), [1] * P, [1] * P, spec.group).reshape(-1).tolist()
    keep = order[start : start + own]
    away = torch.cat([order[:start], order[start + own :]])
    out = []
    for t in payloads:
        got = comm.all_to_all(t.index_select(0, away.to(t.device)), send.tolist(), recv, spec.group)
        before = offsets_of(recv)[me]
        mine = t.index_select(0, keep.to(t.device))
        out.append(torch.cat([got[:before], mine, got[before:]]))
    return out


def _rows_to_owners(row_index: torch.Tensor, rows: torch.Tensor, spec):
    index, moved = _route(spec, _owners(spec, row_index), row_index, rows)
    return index, moved


def _apply_owned(func, a, inp: ShardTensor, local_rows: torch.Tensor, rows: torch.Tensor, d: int, rest):
    """torch's op on this rank's shard with the contributions to its rows (``local_rows`` local)."""
    with no_subclass():
        src = rows.movedim(0, d)
        if a["kind"] == "scatter":
            shape = (rows.shape[0], *rest)
            index = local_rows.reshape(-1, *[1] * len(rest)).expand(shape).movedim(0, d)
        else:
            index = local_rows
    b = dict(a, alpha=1, value=None)
    if func in _INPLACE:
        _call(func, b, inp, index, src)
        return inp
    out = _call(func, b, inp.to_local(), index, src)
    return wrap(out, inp._spec, d)


def _elements_to_owners(func, a, inp: ShardTensor, rows_i, rows_s, d: int, spec, route: bool):
    """``scatter*`` with an index that differs along the other dims: single elements go to their owners."""
    local = inp.to_local()
    with no_subclass():
        moved = local.movedim(d, 0)
        rest_t = list(moved.shape[1:])
        rest_i = list(rows_i.shape[1:])
        if any(i > t for i, t in zip(rest_i, rest_t)):
            raise RuntimeError(f"{op_name(func)}: the index is larger than the target along a dim other than {d}")
        lin = corner_positions(rest_i, rest_t)
        width = math.prod(rest_t)
        rows_flat = rows_i.reshape(-1)
        pos_rest = lin.reshape(1, -1).expand(rows_i.shape[0], -1).reshape(-1).to(rows_flat.device)
        vals = rows_s.reshape(-1)
    lo, hi = spec.offsets[spec.rank], spec.offsets[spec.rank + 1]
    if route:
        rows_flat, pos_rest, vals = _route(spec, _owners(spec, rows_flat), rows_flat, pos_rest, vals)
    else:
        keep = ((rows_flat >= lo) & (rows_flat < hi)).nonzero().reshape(-1)
        rows_flat, pos_rest, vals = rows_flat[keep], pos_rest[keep], vals.index_select(0, keep.to(vals.device))
    with no_subclass():
        pos = (rows_flat - lo) * width + pos_rest
        flat = moved.reshape(-1).clone() if func in _INPLACE else moved.reshape(-1)
        b = dict(a, dim=0, alpha=1, value=None)
        target_func = _OUT_OF_PLACE.get(func, func)
        out = _call(target_func, b, flat, pos, vals).reshape(moved.shape).movedim(0, d)
        if func in _INPLACE:
            inp.copy_(out)
            return inp
    return wrap(out, spec, d)


@register(torch.index_put, T.index_put, T.index_put_)
def _index_put(func, args, kwargs):
    """``index_put(x, (None, ..., idx), values, accumulate=True)`` is ``index_add`` along idx's dim."""
    a = bind(func, args, kwargs, ("input", "indices", "values", "accumulate"), {"accumulate": False})
    inp, indices, values = a["input"], a["indices"], a["values"]
    if not a["accumulate"]:
        raise refuse(func, "accumulate=False: rows written twice have no defined winner across ranks",
                     "use accumulate=True, or torch.where with a mask")
    if not isinstance(indices, (tuple, list)):
        raise TypeError(f"{op_name(func)}: indices must be a tuple of tensors (got {type(indices).__name__})")
    given = [k for k, t in enumerate(indices) if t is not None]
    if len(given) != 1 or not isinstance(indices[given[0]], torch.Tensor) or indices[given[0]].dim() != 1 or \
            indices[given[0]].dtype == torch.bool:
        raise refuse(func, "needs exactly one 1-d integer index tensor (the others None)")
    d = given[0]
    index = indices[d]
    if isinstance(values, torch.Tensor) and not isinstance(values, ShardTensor):
        shape = [*ndim_shape(inp)[:d], index.shape[0], *ndim_shape(inp)[d + 1:]]
        values = values.expand(shape)
    add = T.index_add_ if func is T.index_put_ else torch.index_add
    return _scatter(add, (inp, d, index, values), {})


def ndim_shape(t: torch.Tensor) -> torch.Size:
    return t._spec.global_shape if isinstance(t, ShardTensor) else t.shape
