"""Indexing along the points: global slices, integer rows, index tensors of global indices, masks,
``flip``/``roll`` and ``nonzero``.

Indices are **global**, as on the single-process tensor. What each rank does follows from the spec
and the index alone:

* a slice (or ``narrow``, ``split``, ``chunk``) keeps each rank's part of the global range: no
  communication, new sharding sizes computed identically on every rank;
* an integer row lives on one rank: it is broadcast (one ``all_reduce`` of the row);
* a tensor of global indices (plain: the same on every rank -> a replicated result; a ShardTensor:
  a result sharded like the index) fetches rows from their owners: one ``all_to_all`` of counts,
  one of indices, one of rows (:func:`fetch_rows`); out-of-range indices raise ``IndexError`` on
  every rank;
* ``flip``/``roll`` along the points fetch each rank's new rows the same way;
* a boolean mask sharded like the tensor keeps local rows; the new sizes take one ``all_gather``.
"""

from __future__ import annotations

import math

import torch

from ... import comm
from ..._sizes import owner_of
from ...errors import ShardingError
from .._dispatch import bind, no_subclass, op_name
from .._dispatch import register_rule as register
from .._spec import ShardSpec
from .._tensor import ShardTensor, wrap_shard
from ._common import common_spec, corner_positions, plain_along_shard, refuse, replicated, wrap

T = torch.Tensor


# -- building blocks ------------------------------------------------------------------------------
def _range_sizes(spec: ShardSpec, start: int, stop: int, step: int) -> tuple[list[int], int]:
    """Per-rank counts of the global rows ``range(start, stop, step)`` and this rank's first local row."""
    sizes, first = [], 0
    for r in range(spec.num_ranks):
        lo, hi = spec.offsets[r], spec.offsets[r + 1]
        a = max(lo, start)
        if a > start and (a - start) % step:
            a += step - (a - start) % step
        b = min(hi, stop)
        count = 0 if a >= b else (b - a + step - 1) // step
        sizes.append(count)
        if r == spec.rank:
            first = a - lo
    return sizes, first


def global_range(x: ShardTensor, start: int, stop: int, step: int) -> ShardTensor:
    """The global rows ``start:stop:step`` of the sharded dim (0 <= start <= stop <= N, step > 0): local."""
    spec = x._spec
    sizes, first = _range_sizes(spec, start, stop, step)
    local = x.to_local()
    with no_subclass():
        n = sizes[spec.rank]
        piece = local.narrow(spec.dim, 0, 0) if n == 0 else local.narrow(
            spec.dim, first, (n - 1) * step + 1)[(slice(None),) * spec.dim + (slice(None, None, step),)]
    shape = list(spec.global_shape)
    shape[spec.dim] = sum(sizes)
    return wrap_shard(piece, spec.resized(spec.dim, sizes, shape))


def select_row(func, x: ShardTensor, index: int) -> torch.Tensor:
    """Global row ``index`` of the sharded dim, replicated on every rank (one ``all_reduce``)."""
    spec = x._spec
    n = spec.num_global
    if not -n <= index < n:
        raise IndexError(f"{op_name(func)}: index {index} is out of bounds for dimension {spec.dim} with size {n}")
    index %= n
    owner = next(r for r in range(spec.num_ranks) if spec.offsets[r] <= index < spec.offsets[r + 1])
    local = x.to_local()
    if spec.rank == owner:
        row = local.select(spec.dim, index - spec.offsets[owner])
    else:  # zeros shaped like a row that stay in the graph, so every rank joins the backward all-reduce
        row = local.narrow(spec.dim, 0, 0).sum(spec.dim).to(local.dtype)
    if row.dtype == torch.bool:
        return replicated(comm.all_reduce(row.to(torch.uint8), spec.group).bool(), spec)
    return replicated(comm.all_reduce(row, spec.group), spec)


def _offsets_tensor(spec: ShardSpec, device) -> torch.Tensor:
    return torch.tensor(spec.offsets, dtype=torch.long, device=device)


def fetch_rows(x: ShardTensor, index: torch.Tensor, what: str) -> torch.Tensor:
    """Rows ``index`` (global, any shape, negative allowed) of the sharded dim, fetched from their owners.

    **Shapes:** ``x`` global ``(..., N, *C)`` sharded on ``N``; ``index`` ``(*I)`` -> ``(..., *I, *C)``,
    a plain tensor holding this rank's requests. Differentiable (the backward sends row gradients
    back to their owners and adds them there).

    Owned rows are read locally; each other rank's row travels once however many indices ask for it
    (a halo: ``x[src]`` over the edges held by their targets' owners moves the ghosts only).

    **Communication:** three ``all_to_all``: request counts (and an out-of-range flag, so every rank
    raises together), the requested distinct remote indices, the rows (``num_distinct_remote *
    row_bytes`` received); backward: one ``all_to_all`` of as many row gradients.
    """
    spec = x._spec
    P, n, me = spec.num_ranks, spec.num_global, spec.rank
    local = x.to_local()
    moved = local.movedim(spec.dim, 0)
    flat = index.reshape(-1).to(torch.long)
    bad = bool(((flat < -n) | (flat >= n)).any()) if flat.numel() else False
    flat = torch.where(flat < 0, flat + n, flat)
    lo, hi = spec.offsets[me], spec.offsets[me + 1]
    remote = (flat < lo) | (flat >= hi)
    if bad:
        flat = torch.where((flat < 0) | (flat >= n), torch.full_like(flat, lo), flat)
        remote = remote & (flat != lo)
    wanted, inverse = torch.unique(flat[remote], return_inverse=True)  # sorted: grouped by owner
    owner = owner_of(wanted, spec.offsets).clamp_(0, P - 1)
    send = torch.bincount(owner, minlength=P) if wanted.numel() else torch.zeros(P, dtype=torch.long)
    mine = torch.stack([send.cpu(), torch.full((P,), int(bad), dtype=torch.long)], 1).reshape(-1)
    theirs = comm.all_to_all(mine, [2] * P, [2] * P, spec.group).reshape(P, 2)
    if int(theirs[:, 1].sum()):
        culprits = [r for r in range(P) if int(theirs[r, 1])]
        raise IndexError(f"[rank {me}] {what}: index out of range for dimension {spec.dim} with size {n} "
                         f"(indices from rank(s) {culprits})")
    send_sizes, recv_sizes = send.tolist(), theirs[:, 0].tolist()
    requests = (wanted - _offsets_tensor(spec, wanted.device)[owner]).to(moved.device)
    asked = comm.all_to_all(requests, send_sizes, recv_sizes, spec.group)
    rows = moved.index_select(0, asked)
    got = comm.all_to_all(rows, recv_sizes, send_sizes, spec.group)
    table = torch.cat([moved, got.to(moved.device)])  # [owned; ghosts]; got stays in the graph on every rank
    pos = torch.where(remote, torch.zeros_like(flat), flat - lo)
    pos[remote] = moved.shape[0] + inverse
    out = table.index_select(0, pos.to(table.device))
    out = out.reshape(*index.shape, *moved.shape[1:])
    return out.movedim(tuple(range(index.dim())), tuple(range(spec.dim, spec.dim + index.dim())))


def _as_index(func, idx, spec: ShardSpec) -> torch.Tensor:
    if idx.dtype not in (torch.long, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise IndexError(f"{op_name(func)}: tensors used as indices must be long, int, byte or bool tensors "
                         f"(got {idx.dtype})")
    return idx


def _take(func, x: ShardTensor, idx: torch.Tensor):
    """``x`` indexed along its sharded dim by global indices ``idx`` (plain: replicated; sharded: like it)."""
    spec = x._spec
    if isinstance(idx, ShardTensor):
        out = fetch_rows(x, idx.to_local(), op_name(func))
        d = spec.dim + idx._spec.dim
        shape = list(spec.global_shape[: spec.dim]) + list(idx._spec.global_shape) + list(
            spec.global_shape[spec.dim + 1 :])
        return wrap_shard(out, idx._spec.resized(d, idx._spec.sizes, shape))
    return replicated(fetch_rows(x, idx, op_name(func)), spec)


# -- __getitem__ / __setitem__ ----------------------------------------------------------------------
def _normalise_index(index, nd: int) -> list:
    items = list(index) if isinstance(index, tuple) else [index]
    consumed = sum(
        0 if it is None or it is Ellipsis or isinstance(it, bool)
        else (it.dim() if isinstance(it, torch.Tensor) and it.dtype == torch.bool else 1)
        for it in items
    )
    if items.count(Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if Ellipsis in items:
        k = items.index(Ellipsis)
        items[k : k + 1] = [slice(None)] * (nd - consumed)
    else:
        items += [slice(None)] * (nd - consumed)
    if consumed > nd:
        raise IndexError(f"too many indices for tensor of dimension {nd}")
    return items


def _item_dim(items: list, target: int) -> int | None:
    """The position in ``items`` of the item that indexes tensor dim ``target``."""
    dim = 0
    for k, it in enumerate(items):
        if it is None or isinstance(it, bool):
            continue
        width = it.dim() if isinstance(it, torch.Tensor) and it.dtype == torch.bool else 1
        if dim <= target < dim + width:
            return k
        dim += width
    return None


def _local_getitem(x: ShardTensor, items: list, k: int):
    """Index with the sharded dim's item a full slice: local; where the sharded dim lands comes from a
    meta run in which it has a length no other result dim can have."""
    spec = x._spec
    plain = [it for it in items if isinstance(it, torch.Tensor)]
    unique = 2 + max([*spec.global_shape, *[s for t in plain for s in t.shape], 1])
    probe_shape = list(spec.global_shape)
    probe_shape[spec.dim] = unique
    probe_items = [it.to("meta") if isinstance(it, torch.Tensor) and it.dtype != torch.bool else it for it in items]
    with no_subclass():
        probe = torch.empty(probe_shape, device="meta")[tuple(probe_items)]
        hits = [i for i, s in enumerate(probe.shape) if s == unique]
        out = x.to_local()[tuple(items)]
    if len(hits) != 1:
        raise refuse(T.__getitem__, "this index mixes the sharded dim with advanced indices")
    return wrap(out, spec, hits[0])


@register(T.__getitem__)
def _getitem(func, args, kwargs):
    x, index = args
    if not isinstance(x, ShardTensor):
        return _plain_by_shard(func, x, index, 0)
    spec = x._spec
    nd = len(spec.global_shape)
    if isinstance(index, ShardTensor) and index.dtype == torch.bool:  # x[mask], mask sharded like x
        return _mask_select(func, x, index)
    items = _normalise_index(index, nd)
    if any(isinstance(it, ShardTensor) and it.dtype == torch.bool for it in items):
        raise refuse(func, "a sharded boolean mask must be the only index")
    k = _item_dim(items, spec.dim)
    it = items[k]
    if isinstance(it, slice) and it == slice(None):
        if any(isinstance(t, ShardTensor) for t in items):
            raise refuse(func, "a ShardTensor index on a dim that is not sharded")
        return _local_getitem(x, items, k)
    if isinstance(it, slice):
        return _getitem_slice(func, x, items, k)
    others = [j for j, t in enumerate(items)
              if isinstance(t, torch.Tensor) and not isinstance(t, ShardTensor) and j != k]
    if isinstance(it, torch.Tensor) and it.dtype == torch.bool:
        return _getitem_plain_mask(func, x, items, k, others)
    if others:
        raise refuse(func, "an index along the points combined with other advanced indices")
    if isinstance(it, int) or isinstance(it, torch.Tensor) and it.dim() == 0 and not isinstance(it, ShardTensor):
        return _getitem_int(func, x, items, k)
    if isinstance(it, torch.Tensor):
        return _getitem_tensor(func, x, items, k)
    if isinstance(it, (list, range)):
        return _getitem(func, (x, tuple(items[:k] + [torch.tensor(list(it), dtype=torch.long)] + items[k + 1 :])), {})
    raise refuse(func, f"unsupported index {it!r} along the points")


def _getitem_slice(func, x: ShardTensor, items: list, k: int):
    """A slice along the points: the global range, then the other items locally."""
    start, stop, step = items[k].indices(x._spec.num_global)
    if step <= 0:
        raise ValueError("step must be greater than zero")
    y = global_range(x, start, max(stop, start), step)
    items[k] = slice(None)
    return _getitem(func, (y, tuple(items)), {})


def _getitem_plain_mask(func, x: ShardTensor, items: list, k: int, others: list):
    """A plain 1-d boolean mask along the points (the same on every rank): each rank keeps its part."""
    spec, it = x._spec, items[k]
    if isinstance(it, ShardTensor) or others or it.dim() != 1:
        raise refuse(func, "a plain boolean mask along the points must be 1-d and the only advanced index")
    if it.shape[0] != spec.num_global:
        raise IndexError(f"The shape of the mask {tuple(it.shape)} at index {spec.dim} does not match the shape "
                         f"of the indexed tensor {tuple(spec.global_shape)}")
    sizes = [int(it[spec.offsets[r] : spec.offsets[r + 1]].sum()) for r in range(spec.num_ranks)]
    local_mask = it[spec.offsets[spec.rank] : spec.offsets[spec.rank + 1]]
    shape = list(spec.global_shape)
    shape[spec.dim] = sum(sizes)
    with no_subclass():
        out = x.to_local()[(slice(None),) * spec.dim + (local_mask.to(x.device),)]
    y = wrap_shard(out, spec.resized(spec.dim, sizes, shape))
    items[k] = slice(None)
    return _getitem(func, (y, tuple(items)), {})


def _getitem_int(func, x: ShardTensor, items: list, k: int):
    """One point: the other items first, then the row from its owner."""
    it = items[k]
    if any(isinstance(t, torch.Tensor) for t in items):
        raise refuse(func, "an integer along the points combined with tensor indices")
    items[k] = slice(None)
    y = _getitem(func, (x, tuple(items)), {}) if any(t != slice(None) for t in items) else x
    # the sharded dim sits after the dims the other items kept before it
    return select_row(func, y, int(it))


def _getitem_tensor(func, x: ShardTensor, items: list, k: int):
    """An index tensor along the points, alone or after full slices."""
    it = items[k]
    _as_index(func, it, x._spec)
    before = items[:k]
    if any(isinstance(t, int) or t is None for t in before) or any(
            not (isinstance(t, slice) and t == slice(None)) for t in items[k + 1 :]):
        raise refuse(func, "an index tensor along the points combined with other indices",
                     "index the points first, then the other dims")
    if any(not (isinstance(t, slice) and t == slice(None)) for t in before):
        raise refuse(func, "an index tensor along the points combined with slices of earlier dims")
    return _take(func, x, it)


def _mask_select(func, x: ShardTensor, mask: ShardTensor):
    spec = common_spec([x, mask], func)
    if spec.dim != 0 or mask._spec.dim != 0:
        raise refuse(func, "a sharded boolean mask needs the points as dim 0 of both tensors")
    mshape, xshape = list(mask._spec.global_shape), list(spec.global_shape)
    if xshape[: len(mshape)] != mshape:
        raise IndexError(f"The shape of the mask {tuple(mshape)} does not match the shape of the indexed tensor "
                         f"{tuple(xshape)}")
    with no_subclass():
        out = x.to_local()[mask.to_local()]
    counts = comm.all_gather(torch.tensor([out.shape[0]], dtype=torch.long), spec.group).reshape(-1).tolist()
    shape = [sum(counts), *xshape[len(mshape) :]]
    return wrap_shard(out, spec.resized(0, counts, shape))


@register(torch.masked_select, T.masked_select)
def _masked_select(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "mask"))
    x, mask = a["input"], a["mask"]
    if not (isinstance(x, ShardTensor) and isinstance(mask, ShardTensor)) or list(x._spec.global_shape) != list(
            mask._spec.global_shape):
        raise refuse(func, "needs the tensor and a mask of the same shape, sharded alike")
    out = _mask_select(func, x.reshape(x._spec.global_shape), mask)
    return out.reshape(-1) if out.dim() > 1 else out


@register(T.__setitem__)
def _setitem(func, args, kwargs):
    x, index, value = args
    if not isinstance(x, ShardTensor):
        raise refuse(func, "writing ShardTensor values into a plain tensor would store local rows",
                     "use x.full_tensor()")
    spec = x._spec
    if isinstance(index, ShardTensor) and index.dtype == torch.bool:
        common_spec([x, index], func)
        if spec.dim != 0 or index._spec.dim != 0:
            raise refuse(func, "a sharded boolean mask needs the points as dim 0")
        if isinstance(value, ShardTensor):
            raise refuse(func, "assigning a ShardTensor through a mask", "use torch.where(mask, value, x)")
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.numel() != 1:
            raise refuse(func, "assigning a non-scalar through a sharded mask")
        with no_subclass():
            x.to_local()[index.to_local()] = value
        return None
    items = _normalise_index(index, len(spec.global_shape))
    k = _item_dim(items, spec.dim)
    it = items[k]
    if any(isinstance(t, ShardTensor) for t in items):
        raise refuse(func, "a ShardTensor index here")
    if not (isinstance(it, slice) and it == slice(None)):
        raise refuse(func, "assigning to a subset of the points", "use torch.where(mask, value, x) with a sharded mask")
    view = _local_getitem(x, items, k)
    if isinstance(value, ShardTensor):
        common_spec([x, value], func)
        vback = len(value._spec.global_shape) - value._spec.dim
        if vback != len(view._spec.global_shape) - view._spec.dim:
            raise ShardingError(f"[rank {spec.rank}] {op_name(func)}: the value's sharded dim does not line up")
        value = value.to_local()
    elif isinstance(value, torch.Tensor) and value.dim() > 0:
        value = plain_along_shard(func, value, view._spec, len(view._spec.global_shape) - view._spec.dim)
    with no_subclass():
        x.to_local()[tuple(items)] = value
    return None


def _plain_by_shard(func, table: torch.Tensor, index, dim: int):
    """A plain tensor (replicated: the same on every rank, e.g. a lookup table, a degree vector) indexed
    along ``dim`` by a ShardTensor of indices: each rank looks up its own indices, no communication; the
    result is sharded like the index (its gradient for the table is partial on each rank, as for every
    replicated value)."""
    if isinstance(index, tuple) and len(index) == 1:
        index = index[0]
    if not isinstance(index, ShardTensor) or index.dtype == torch.bool:
        raise refuse(func, "indexing a plain tensor with ShardTensors needs one integer ShardTensor index",
                     "index a ShardTensor, or gather with .full_tensor()")
    d = dim % max(table.dim(), 1)
    if table.dim() == 0:
        raise IndexError(f"{op_name(func)}: a 0-d tensor cannot be indexed")
    ispec = index._spec
    n = table.shape[d]
    with no_subclass():
        flat = index.to_local().reshape(-1).long()
        bad = torch.tensor([int(bool(((flat < -n) | (flat >= n)).any()) if flat.numel() else 0)])
        if int(comm.all_reduce_max(bad, ispec.group)[0]):  # every rank raises together
            raise IndexError(f"{op_name(func)}: an index is out of range for dimension {d} with size {n} "
                             "(on some rank)")
        out = table.index_select(d, torch.where(flat < 0, flat + n, flat).to(table.device))
        out = out.reshape(*table.shape[:d], *index.to_local().shape, *table.shape[d + 1:])
    shape = [*table.shape[:d], *ispec.global_shape, *table.shape[d + 1:]]
    return wrap_shard(out, ispec.resized(d + ispec.dim, ispec.sizes, shape))


# -- index_select / gather / take ------------------------------------------------------------------
@register(torch.index_select, T.index_select)
def _index_select(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "dim", "index"))
    x, idx = a["input"], a["index"]
    if not isinstance(x, ShardTensor):
        if not isinstance(idx, ShardTensor) or idx.dim() != 1:
            raise refuse(func, "indexing a plain tensor needs a 1-d ShardTensor index")
        return _plain_by_shard(func, x, idx, int(a["dim"]))
    spec = x._spec
    nd = len(spec.global_shape)
    d = int(a["dim"]) % max(nd, 1)
    if isinstance(idx, ShardTensor) and idx.dim() != 1 or not isinstance(idx, ShardTensor) and idx.dim() > 1:
        raise IndexError("index_select(): Index is supposed to be a vector")
    if d != spec.dim:
        if isinstance(idx, ShardTensor):
            raise refuse(func, "a ShardTensor index along a dim that is not sharded")
        with no_subclass():
            out = func(*args, **kwargs)
        return wrap(out, spec, spec.dim)
    _as_index(func, idx, spec)
    return _take(func, x, idx.reshape(-1) if not isinstance(idx, ShardTensor) else idx)


@register(torch.gather, T.gather)
def _gather(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "dim", "index"), kwonly=("sparse_grad",))
    x, idx = a["input"], a["index"]
    if a["sparse_grad"]:
        raise refuse(func, "sparse_grad=True is not supported")
    if not isinstance(x, ShardTensor) or not isinstance(idx, ShardTensor):
        raise refuse(func, "needs a ShardTensor input and a ShardTensor index sharded along the same dim")
    spec = x._spec
    nd = len(spec.global_shape)
    d = int(a["dim"]) % max(nd, 1)
    if idx._spec.dim != spec.dim or len(idx._spec.global_shape) != nd:
        raise ShardingError(f"[rank {spec.rank}] {op_name(func)}: index and input must be sharded along the same dim")
    if d != spec.dim:
        common_spec([x, idx], func)
        with no_subclass():
            out = func(*args, **kwargs)
        return wrap(out, spec, spec.dim)
    # along the points: out[i, j...] = x[idx[i, j...], j...], rows fetched from their owners
    local_idx = idx.to_local().movedim(spec.dim, 0)
    rest_x = list(spec.global_shape[: spec.dim]) + list(spec.global_shape[spec.dim + 1 :])
    rest_i = list(local_idx.shape[1:])
    if any(i > s for i, s in zip(rest_i, rest_x)):
        raise RuntimeError(f"{op_name(func)}: index {tuple(idx._spec.global_shape)} is larger than the input "
                           f"{tuple(spec.global_shape)} along a dim other than {d}")
    rows = fetch_rows(x, local_idx.reshape(-1), op_name(func))  # (m, *rest_x) moved: sharded dim first
    rows = rows.movedim(spec.dim, 0) if spec.dim else rows
    rows = rows.reshape(rows.shape[0], math.prod(rest_x))
    lin = corner_positions(rest_i, rest_x).reshape(1, -1).expand(local_idx.shape[0], -1).reshape(-1, 1).to(rows.device)
    out = rows.gather(1, lin).reshape(local_idx.shape).movedim(0, spec.dim)
    return wrap_shard(out, idx._spec)


# -- flip / roll ------------------------------------------------------------------------------------
def _my_rows(spec: ShardSpec) -> torch.Tensor:
    return torch.arange(spec.offsets[spec.rank], spec.offsets[spec.rank + 1], dtype=torch.long)


def _refetch(x: ShardTensor, source: torch.Tensor, what: str) -> ShardTensor:
    """This rank's new rows are the global rows ``source`` of ``x``; same sharding as ``x``."""
    out = fetch_rows(x, source, what)
    return wrap_shard(out, x._spec)


@register(torch.flip, T.flip, torch.fliplr, T.fliplr, torch.flipud, T.flipud)
def _flip(func, args, kwargs):
    if func in (torch.flip, T.flip):
        a = bind(func, args, kwargs, ("input", "dims"))
        x, dims = a["input"], a["dims"]
        dims = [dims] if isinstance(dims, int) else list(dims)
    else:
        a = bind(func, args, kwargs, ("input",))
        x = a["input"]
        dims = [1] if func in (torch.fliplr, T.fliplr) else [0]
    spec = x._spec
    nd = len(spec.global_shape)
    dims = [int(d) % nd for d in dims]
    rest = [d for d in dims if d != spec.dim]
    if len(rest) != len(dims):
        x = _refetch(x, spec.num_global - 1 - _my_rows(spec), op_name(func))
    if not rest:
        return x
    with no_subclass():
        out = torch.flip(x.to_local(), rest)
    return wrap(out, spec, spec.dim)


@register(torch.roll, T.roll)
def _roll(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "shifts", "dims"))
    x = a["input"]
    spec = x._spec
    nd = len(spec.global_shape)
    shifts = [a["shifts"]] if isinstance(a["shifts"], int) else list(a["shifts"])
    if a["dims"] is None:
        raise refuse(func, "roll without dims flattens the tensor across ranks", "give dims")
    dims = [a["dims"]] if isinstance(a["dims"], int) else list(a["dims"])
    if len(shifts) != len(dims):
        raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}")
    dims = [int(d) % nd for d in dims]
    total = sum(int(s) for s, d in zip(shifts, dims) if d == spec.dim)
    keep = [(int(s), d) for s, d in zip(shifts, dims) if d != spec.dim]
    if any(d == spec.dim for d in dims) and spec.num_global:
        x = _refetch(x, (_my_rows(spec) - total) % spec.num_global, op_name(func))
    if not keep:
        return x
    with no_subclass():
        out = torch.roll(x.to_local(), [s for s, _ in keep], [d for _, d in keep])
    return wrap(out, spec, spec.dim)


# -- nonzero ------------------------------------------------------------------------------------------
def _nonzero_local(func, x: ShardTensor) -> tuple[torch.Tensor, list[int], ShardSpec]:
    spec = x._spec
    if spec.dim != 0:
        raise refuse(func, "nonzero of a tensor sharded along a dim other than 0 is not in global order",
                     "move the points to dim 0 first")
    with no_subclass():
        idx = torch.nonzero(x.to_local())
    if idx.numel():
        idx[:, 0] += spec.offsets[spec.rank]
    counts = comm.all_gather(torch.tensor([idx.shape[0]], dtype=torch.long), spec.group).reshape(-1).tolist()
    return idx, counts, spec


@register(torch.nonzero, T.nonzero, torch.argwhere, T.argwhere)
def _nonzero(func, args, kwargs):
    a = bind(func, args, kwargs, ("input",), kwonly=("as_tuple",))
    if a["as_tuple"]:
        return nonzero_tuple(func, a["input"])
    idx, counts, spec = _nonzero_local(func, a["input"])
    return wrap_shard(idx, spec.resized(0, counts, [sum(counts), len(spec.global_shape)]))


def nonzero_tuple(func, x: ShardTensor) -> tuple:
    """``torch.where(cond)`` / ``nonzero(as_tuple=True)``: one global index tensor per dim, sharded."""
    idx, counts, spec = _nonzero_local(func, x)
    new = spec.resized(0, counts, [sum(counts)])
    return tuple(wrap_shard(idx[:, i].contiguous(), new) for i in range(max(len(spec.global_shape), 1)))

