"""Shape rules: views and reshapes, dim moves, expand/repeat, cat/stack, split/chunk/narrow
(``cat`` along the sharded dim: :mod:`._cat`).

Every rule reads **global** shapes and maps them onto the local shard, deciding from the spec and
the arguments alone (identical on every rank). Ops along other dims are local; slicing along the
sharded dim keeps each rank's part of the global range (see :mod:`._index`).

**Communication:** none, except where noted in :mod:`._index` (integer index along the points).
"""

from __future__ import annotations

import math

import torch

from ... import comm
from ...errors import ShardingError
from .._dispatch import bind, no_subclass, op_name
from .._dispatch import register_rule as register
from .._tensor import ShardTensor, wrap_shard
from ._cat import cat_along_shard
from ._common import common_spec, local_shape, ndim, plain_along_shard, refuse, shard_args, wrap
from ._index import global_range, select_row

T = torch.Tensor


def _only_shard(func, args, kwargs) -> ShardTensor:
    x = args[0] if args else next(iter(kwargs.values()))
    if not isinstance(x, ShardTensor) or len(shard_args(args, kwargs)) != 1:
        raise refuse(func, "only the first operand may be a ShardTensor")
    return x


def _probe_dim(func, x: ShardTensor, args, kwargs) -> int:
    """Where a pure dim move (permute, movedim, transpose, ...) puts the sharded dim.

    The op runs on a meta tensor whose dims have distinct sizes 2, 3, ...; the result dim of size
    ``shard_dim + 2`` is the sharded one. Needs only the number of dims: identical on every rank.
    """
    nd = ndim(x)
    key = (func, nd, x._spec.dim, args[1:], tuple(sorted(kwargs.items())))
    try:
        hit = _PROBED.get(key)
    except TypeError:  # unhashable arguments (lists): probe every time
        key, hit = None, None
    if hit is not None:
        return hit
    probe = torch.empty([i + 2 for i in range(nd)], device="meta")
    with no_subclass():
        try:
            out = func(probe, *args[1:], **kwargs)
        except Exception as exc:
            raise type(exc)(str(exc)) from None
    hit = list(out.shape).index(x._spec.dim + 2)
    if key is not None and len(_PROBED) < 4096:
        _PROBED[key] = hit
    return hit


_PROBED: dict = {}  # (func, ndim, shard dim, arguments) -> result dim: attention code repeats the same moves


@register(
    T.transpose, torch.transpose, T.swapaxes, torch.swapaxes, T.swapdims, torch.swapdims, T.permute, torch.permute,
    T.movedim, torch.movedim, T.moveaxis, torch.moveaxis, T.t, torch.t, T.T.__get__, T.mT.__get__, T.mH.__get__,
    T.H.__get__, T.adjoint, torch.adjoint,
)
def _move(func, args, kwargs):
    x = _only_shard(func, args, kwargs)
    d = _probe_dim(func, x, args, kwargs)
    with no_subclass():
        out = func(*args, **kwargs)
    return wrap(out, x._spec, d)


@register(T.unsqueeze, torch.unsqueeze)
def _unsqueeze(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "dim"))
    x = _only_shard(func, args, kwargs)
    nd = ndim(x)
    d = int(a["dim"])
    if not -nd - 1 <= d <= nd:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-nd - 1}, {nd}], but got {d})")
    d %= nd + 1
    with no_subclass():
        out = func(*args, **kwargs)
    sd = x._spec.dim
    return wrap(out, x._spec, sd + 1 if d <= sd else sd)


@register(T.squeeze, torch.squeeze)
def _squeeze(func, args, kwargs):
    """Squeezes decided by the global shape: a rank holding one point keeps its point dim."""
    a = bind(func, args, kwargs, ("input", "dim"))
    x = _only_shard(func, args, kwargs)
    spec, shape = x._spec, x._spec.global_shape
    if a["dim"] is None:
        dims = [i for i, s in enumerate(shape) if s == 1]
    else:
        raw = a["dim"] if isinstance(a["dim"], (tuple, list)) else [a["dim"]]
        nd = max(len(shape), 1)
        for d in raw:
            if not -nd <= int(d) < nd:
                raise IndexError(f"Dimension out of range (expected to be in range of [{-nd}, {nd - 1}], but got {d})")
        dims = [int(d) % nd for d in raw if len(shape) and shape[int(d) % nd] == 1]
    if spec.dim in dims:  # the one global point: it lives on one rank, broadcast it
        x = select_row(T.select, x, 0)
        rest = [d - (d > spec.dim) for d in dims if d != spec.dim]
        return torch.squeeze(x, tuple(rest)) if rest else x
    local = x.to_local()
    with no_subclass():
        out = local.squeeze(tuple(dims)) if dims else local.view(local.shape)
    return wrap(out, spec, spec.dim - sum(1 for d in dims if d < spec.dim))


def _target_shape(func, req, numel: int) -> list[int]:
    """A requested shape with its one ``-1`` resolved against the global ``numel`` (torch's rules)."""
    if len(req) == 1 and isinstance(req[0], (tuple, list, torch.Size)):
        req = tuple(req[0])
    shape = [int(s) for s in req]
    if shape.count(-1) > 1:
        raise RuntimeError("only one dimension can be inferred")
    if any(s < -1 for s in shape):
        raise RuntimeError(f"invalid shape dimension {min(shape)}")
    if -1 in shape:
        known = math.prod([s for s in shape if s != -1])
        if known == 0 or numel % known:
            raise RuntimeError(f"shape '{list(req)}' is invalid for input of size {numel}")
        shape[shape.index(-1)] = numel // known
    if math.prod(shape) != numel:
        raise RuntimeError(f"shape '{list(req)}' is invalid for input of size {numel}")
    return shape


def _reshape_to(func, x: ShardTensor, target: list[int]):
    """Reshape (or view) ``x`` to the global ``target``: the sharded dim is kept, merged with the dims
    after it, or split with its outer part sharded; the sizes scale accordingly."""
    spec = x._spec
    g = list(spec.global_shape)
    d, n = spec.dim, spec.num_global
    pre = math.prod(g[:d])
    i, acc = 0, 1
    while i < len(target) and acc < pre:  # the first target dim whose prefix product is pre
        acc *= target[i]
        i += 1
    while i < len(target) - 1 and target[i] == 1 and n != 1:  # skip size-1 dims before the points
        i += 1
    if acc != pre or i >= len(target):
        raise refuse(func, f"from {tuple(g)} (sharded dim {d}) to {tuple(target)} would merge the sharded dim with the "
                     "dims before it", "move the points to the front, or reshape only the other dims")
    t = target[i]
    if t == n:
        sizes = spec.sizes
    elif n and t % n == 0 and _prefix_of(g[d + 1 :], t // n):  # merged with following dims
        sizes = tuple(s * (t // n) for s in spec.sizes)
    elif t and n % t == 0 and all(s % (n // t) == 0 for s in spec.sizes) and _prefix_of(target[i + 1 :], n // t):
        sizes = tuple(s // (n // t) for s in spec.sizes)  # split: the outer part stays sharded
    else:
        raise refuse(func, f"from {tuple(g)} (sharded dim {d}, sizes {spec.sizes}) to {tuple(target)} splits the "
                     "sharded dim across ranks", "reshape only the other dims")
    local_target = list(target)
    local_target[i] = sizes[spec.rank]
    with no_subclass():
        out = x.to_local().view(local_target) if func in (T.view, T.view_as) else x.to_local().reshape(local_target)
    new_shape = list(target)
    return wrap_shard(out, spec.resized(i, sizes, new_shape))


def _prefix_of(dims: list[int], k: int) -> bool:
    """Whether ``k`` is the product of a prefix of ``dims`` (a clean merge/split boundary)."""
    acc = 1
    for s in [1, *dims]:
        acc *= s
        if acc == k:
            return True
        if acc > k and k:
            return False
    return acc == k


@register(T.view, T.reshape, torch.reshape)
def _reshape(func, args, kwargs):
    x = _only_shard(func, args, kwargs)
    if func is T.view and len(args) == 2 and isinstance(args[1], torch.dtype) or "dtype" in kwargs:
        return _view_dtype(func, x, args[1] if len(args) == 2 else kwargs["dtype"])
    req = args[1:] if len(args) > 1 else (kwargs.get("shape") or kwargs.get("size") or ())
    return _reshape_to(func, x, _target_shape(func, req, x._spec.global_shape.numel()))


def _view_dtype(func, x: ShardTensor, dtype: torch.dtype) -> ShardTensor:
    """``x.view(dtype)``: the same bytes read as ``dtype``; the last dim scales by the ratio of the item sizes.

    Along a sharded last dim the new sizes are ``sizes * old_itemsize / new_itemsize``, decided from the
    sizes (every rank's bytes there must divide into whole items, else the same error on every rank). torch's
    own checks (strides, divisibility) see local layouts, which may differ between ranks: their verdicts are
    agreed (:func:`meshshard.comm.agree`), so the view succeeds everywhere or raises the same error
    everywhere. A rank without elements gets an empty tensor of the right shape (torch's stride checks would
    fail on its degenerate strides alone).

    **Communication:** none when the item sizes are equal; else one small ``all_gather`` (the verdict).
    """
    spec = x._spec
    old, new = x.element_size(), torch.empty((), dtype=dtype).element_size()
    if old == new:
        with no_subclass():
            return wrap(x.view(dtype), spec, spec.dim)
    nd = len(spec.global_shape)
    sizes = spec.sizes
    if spec.dim == nd - 1:
        if any(s * old % new for s in spec.sizes):
            raise refuse(func, f"viewing {x.dtype} as {dtype} along the sharded last dim needs each rank's bytes "
                         f"there to make whole items of {new} bytes (sharding sizes {spec.sizes})",
                         "view along another dim, or reshard first")
        sizes = tuple(s * old // new for s in spec.sizes)
    shape = list(local_shape(x))
    error, out = None, None
    if shape[-1] * old % new:
        error = (f"the last dim ({shape[-1]} items of {old} bytes) does not divide into items of {new} bytes "
                 f"({x.dtype} -> {dtype})")
    elif math.prod(shape) == 0:
        shape[-1] = shape[-1] * old // new
        with no_subclass():
            out = x.new_empty(shape, dtype=dtype)
    else:
        try:
            with no_subclass():
                out = x.view(dtype)
        except RuntimeError as exc:
            error = str(exc)
    comm.agree(error, spec.group, error_type=RuntimeError, what=f"view({dtype}) of a ShardTensor")
    if spec.dim == nd - 1:
        global_shape = (*spec.global_shape[:-1], sum(sizes))
        return wrap_shard(out, spec.resized(spec.dim, sizes, global_shape))
    return wrap(out, spec, spec.dim)


@register(T.view_as, T.reshape_as)
def _reshape_as(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "other"))
    x, other = a["input"], a["other"]
    if not isinstance(x, ShardTensor):
        raise refuse(func, "only the reshaped tensor may be a ShardTensor")
    shape = list(other._spec.global_shape) if isinstance(other, ShardTensor) else list(other.shape)
    target = _target_shape(func, shape, x._spec.global_shape.numel())
    return _reshape_to(T.view if func is T.view_as else T.reshape, x, target)


@register(T.flatten, torch.flatten)
def _flatten(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "start_dim", "end_dim"), {"start_dim": 0, "end_dim": -1})
    x = _only_shard(func, args, kwargs)
    g = list(x._spec.global_shape)
    nd = max(len(g), 1)
    s, e = int(a["start_dim"]) % nd, int(a["end_dim"]) % nd
    if s > e:
        raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    target = g[:s] + [math.prod(g[s : e + 1])] + g[e + 1 :]
    return _reshape_to(T.reshape, x, target)


@register(T.unflatten, torch.unflatten)
def _unflatten(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "dim", "sizes"))
    x = _only_shard(func, args, kwargs)
    g = list(x._spec.global_shape)
    d = int(a["dim"]) % len(g)
    sizes = _target_shape(func, tuple(a["sizes"]), g[d])
    return _reshape_to(T.reshape, x, g[:d] + sizes + g[d + 1 :])


@register(T.expand, T.expand_as, torch.broadcast_to, T.broadcast_to)
def _expand(func, args, kwargs):
    if func is T.expand_as and len(shard_args(args, kwargs)) == 2:  # index.view(...).expand_as(src), alike
        x = args[0] if args else kwargs["input"]
        common_spec(shard_args(args, kwargs), func)
    else:
        x = _only_shard(func, args, kwargs)
    spec = x._spec
    if func is T.expand_as:
        other = bind(func, args, kwargs, ("input", "other"))["other"]
        req = list(other._spec.global_shape) if isinstance(other, ShardTensor) else list(other.shape)
    elif func is T.expand:
        req = args[1:] if len(args) > 1 else (kwargs.get("size"),)
        if len(req) == 1 and isinstance(req[0], (tuple, list, torch.Size)):
            req = tuple(req[0])
        req = list(req)
    else:
        req = list(bind(func, args, kwargs, ("input", "size"))["size"])
    g = list(spec.global_shape)
    lead = len(req) - len(g)
    if lead < 0:
        raise RuntimeError(f"expand: the number of sizes provided ({len(req)}) must be greater or equal to the "
                           f"number of dimensions in the tensor ({len(g)})")
    d = lead + spec.dim
    other = args[1] if func is T.expand_as and len(args) > 1 else kwargs.get("other")
    if isinstance(other, ShardTensor) and other._spec.dim != d:
        raise ShardingError(
            f"[rank {spec.rank}] expand_as: the sharded dims do not line up ({d} and {other._spec.dim})")
    if int(req[d]) not in (-1, spec.num_global):
        raise refuse(func, f"cannot expand the sharded dim of global length {spec.num_global} to {req[d]}")
    local_req = [int(r) for r in req]
    local_req[d] = -1
    with no_subclass():
        out = x.to_local().expand(local_req)
    return wrap(out, spec, d)


@register(T.repeat)
def _repeat(func, args, kwargs):
    x = _only_shard(func, args, kwargs)
    reps = args[1:] if len(args) > 1 else (kwargs.get("repeats"),)
    if len(reps) == 1 and isinstance(reps[0], (tuple, list, torch.Size)):
        reps = tuple(reps[0])
    reps = [int(r) for r in reps]
    spec = x._spec
    lead = len(reps) - len(spec.global_shape)
    if lead < 0:
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor")
    if reps[lead + spec.dim] != 1:
        raise refuse(func, "repeating along the sharded dim reorders rows across ranks",
                     "repeat along a new leading dim instead")
    with no_subclass():
        out = x.to_local().repeat(reps)
    return wrap(out, spec, lead + spec.dim)


def _cat_dim(func, a) -> int:
    return int(a["dim"]) if a["dim"] is not None else 0


@register(torch.cat, torch.concat, torch.concatenate, torch.stack, torch.hstack, torch.vstack)
def _cat(func, args, kwargs):
    if func in (torch.hstack, torch.vstack):
        a = bind(func, args, kwargs, ("tensors",))
        a["dim"] = None
    else:
        a = bind(func, args, kwargs, ("tensors", "dim"), {"dim": 0}, kwonly=("axis",))
    tensors = list(a["tensors"])
    shards = [t for t in tensors if isinstance(t, ShardTensor)]
    stack = func is torch.stack
    shapes = [list(t._spec.global_shape) if isinstance(t, ShardTensor) else list(t.shape) for t in tensors]
    nd = len(shards[0]._spec.global_shape)
    if func is torch.hstack:
        d = 0 if nd == 1 else 1
    elif func is torch.vstack:
        if nd < 2:
            raise refuse(func, "vstack of 1-d ShardTensors would stack the points", "use torch.stack(dim=1)")
        d = 0
    else:
        d = _cat_dim(func, a)
    d %= nd + 1 if stack else nd
    if not stack and d == shards[0]._spec.dim:
        return cat_along_shard(func, tensors, d)
    spec = common_spec(shards, func)
    for t in shards:
        if t._spec.dim != spec.dim or len(t._spec.global_shape) != nd:
            raise ShardingError(
                f"[rank {spec.rank}] {op_name(func)}: the ShardTensors are sharded along different dims")
    sd = spec.dim
    back = nd - sd
    fixed = []
    for t, shape in zip(tensors, shapes):
        if not isinstance(t, ShardTensor):
            if len(shape) != nd or shape[sd] != spec.num_global:
                raise refuse(func, f"a plain operand of shape {tuple(shape)} does not line up with the sharded dim "
                             f"(global shape {tuple(spec.global_shape)})")
            t = plain_along_shard(func, t, spec, back)
        fixed.append(t)
    for shape in shapes:
        other = [s for i, s in enumerate(shape) if stack or i != d]
        ref = [s for i, s in enumerate(shapes[0]) if stack or i != d]
        if other != ref:
            raise RuntimeError(f"{op_name(func)}: sizes of tensors must match except in dimension {d} "
                               f"(got {tuple(shapes[0])} and {tuple(shape)})")
    with no_subclass():
        out = torch.stack(fixed, d) if stack else torch.cat(fixed, d)
    return wrap(out, spec, sd + 1 if stack and d <= sd else sd)


def _split_lengths(func, n: int, how, kind: str) -> list[int]:
    """Piece lengths of splitting a dim of global length ``n`` (torch's own rules, on a meta tensor)."""
    probe = torch.empty(n, device="meta")
    with no_subclass():
        if kind == "split":
            pieces = probe.split(how)
        elif kind == "chunk":
            pieces = probe.chunk(how)
        else:
            pieces = probe.tensor_split(how)
    return [p.shape[0] for p in pieces]


@register(T.split, torch.split, T.chunk, torch.chunk, T.tensor_split, torch.tensor_split, T.split_with_sizes)
def _split(func, args, kwargs):
    if func in (T.split, torch.split):
        a = bind(func, args, kwargs, ("tensor", "split_size_or_sections", "dim"), {"dim": 0})
        how, kind = a["split_size_or_sections"], "split"
    elif func is T.split_with_sizes:
        a = bind(func, args, kwargs, ("tensor", "split_sizes", "dim"), {"dim": 0})
        how, kind = list(a["split_sizes"]), "split"
    elif func in (T.chunk, torch.chunk):
        a = bind(func, args, kwargs, ("tensor", "chunks", "dim"), {"dim": 0})
        how, kind = a["chunks"], "chunk"
    else:
        a = bind(func, args, kwargs, ("tensor", "indices_or_sections", "dim"), {"dim": 0},
                 kwonly=("sections", "indices"))
        how, kind = a["indices_or_sections"], "tensor_split"
        if how is None:
            how = a["sections"] if a["sections"] is not None else a["indices"]
        if isinstance(how, torch.Tensor):
            how = how.tolist()
    x = a["tensor"]
    if not isinstance(x, ShardTensor):
        raise refuse(func, "only the split tensor may be a ShardTensor")
    spec = x._spec
    d = int(a["dim"]) % len(spec.global_shape)
    if d != spec.dim:
        with no_subclass():
            out = func(*args, **kwargs)
        return type(out)(wrap(o, spec, spec.dim) for o in out)
    lengths = _split_lengths(func, spec.num_global, how, kind)
    pieces, start = [], 0
    for length in lengths:
        pieces.append(global_range(x, start, start + length, 1))
        start += length
    return tuple(pieces)


@register(T.narrow, torch.narrow)
def _narrow(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "dim", "start", "length"))
    x = _only_shard(func, args, kwargs)
    spec = x._spec
    nd = len(spec.global_shape)
    d = int(a["dim"]) % nd
    start = int(a["start"])
    if d != spec.dim:
        with no_subclass():
            out = func(*args, **kwargs)
        return wrap(out, spec, spec.dim)
    n = spec.num_global
    if start < 0:
        start += n
    length = int(a["length"])
    if not 0 <= start <= n or length < 0 or start + length > n:
        raise IndexError(f"narrow(): start ({a['start']}) + length ({length}) exceeds dimension size ({n}).")
    return global_range(x, start, start + length, 1)


@register(T.select, torch.select)
def _select(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "dim", "index"))
    x = _only_shard(func, args, kwargs)
    spec = x._spec
    nd = len(spec.global_shape)
    d = int(a["dim"])
    if not -nd <= d < nd:
        raise IndexError(
            f"select(): Dimension out of range (expected to be in range of [{-nd}, {nd - 1}], but got {d})")
    d %= nd
    if d == spec.dim:
        return select_row(func, x, int(a["index"]))
    if not -spec.global_shape[d] <= int(a["index"]) < spec.global_shape[d]:
        raise IndexError(f"select(): index {a['index']} out of range for tensor of size {tuple(spec.global_shape)} "
                         f"at dimension {d}")
    with no_subclass():
        out = x.to_local().select(d, int(a["index"]))
    return wrap(out, spec, spec.dim - (d < spec.dim))


@register(T.unbind, torch.unbind)
def _unbind(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "dim"), {"dim": 0})
    x = _only_shard(func, args, kwargs)
    spec = x._spec
    d = int(a["dim"]) % len(spec.global_shape)
    if d == spec.dim:
        raise refuse(func, "unbinding (or iterating over) the sharded dim would broadcast every point",
                     "iterate over x.to_local() or x.full_tensor()")
    with no_subclass():
        out = x.to_local().unbind(d)
    return tuple(wrap(o, spec, spec.dim - (d < spec.dim)) for o in out)


@register(T.diagonal, torch.diagonal)
def _diagonal(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "offset", "dim1", "dim2"), {"offset": 0, "dim1": 0, "dim2": 1})
    x = _only_shard(func, args, kwargs)
    spec = x._spec
    nd = len(spec.global_shape)
    d1, d2 = int(a["dim1"]) % nd, int(a["dim2"]) % nd
    if spec.dim in (d1, d2):
        raise refuse(func, "a diagonal through the sharded dim crosses ranks")
    with no_subclass():
        out = func(*args, **kwargs)
    return wrap(out, spec, spec.dim - (d1 < spec.dim) - (d2 < spec.dim))
