"""Ops that are other ops: each is written as the torch calls it stands for, so their rules apply.

``X_copy`` is ``X`` then ``clone`` (the view ops' rules); ``aminmax`` is ``(amin, amax)``; ``std_mean`` /
``var_mean`` are ``(std or var, mean)``; ``softmin`` is ``softmax(-x)`` (what torch computes); ``ravel`` is
``reshape(-1)``; ``unsafe_split``/``unsafe_chunk``/``split_with_sizes``/``hsplit``/``vsplit``/``dsplit``
are splits; ``atleast_*d`` unsqueeze; ``broadcast_tensors`` expands; ``dist`` is a vector norm of the
difference; ``linalg.vecdot`` is ``(x.conj() * y).sum(dim)``; ``equal``/``allclose`` reduce ``eq``/``isclose``
with ``all``.
Three have rules of their own: ``tril``/``triu`` and ``trace`` (the local diagonal is shifted by the rank's
row or column offset; ``trace`` then sums with one ``all_reduce`` of one scalar) and ``prod`` over the
sharded dim (each rank's partial product, gathered, multiplied).

**Communication:** that of the ops they are written as (documented in their modules); ``tril``/``triu``:
none; ``prod`` over the sharded dim: one ``all_to_all_single`` of one row per rank (``P * row_bytes``),
one in backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import comm
from .._dispatch import bind
from .._dispatch import register_rule as register
from .._tensor import ShardTensor
from ._common import local_of, ndim, no_subclass, norm_dims, refuse, replicated, wrap

T = torch.Tensor

_VIEWS = """alias expand permute squeeze t transpose unsqueeze view diagonal narrow unbind unfold
split_with_sizes""".split()


def _clone(out):
    if isinstance(out, torch.Tensor):
        return out.clone()
    return type(out)(_clone(o) for o in out)


def _copy_rule(base):
    def rule(func, args, kwargs):
        if kwargs.get("out") is not None:
            raise refuse(func, "out= is not supported", "write the result to a new tensor")
        kwargs = {k: v for k, v in kwargs.items() if k != "out"}
        if base is None:  # alias_copy: a copy of the whole tensor
            return args[0].clone()
        return _clone(base(*args, **kwargs))

    return rule


for _name in _VIEWS:
    _f = getattr(torch, f"{_name}_copy", None)
    if _f is not None:
        _base = None if _name == "alias" else getattr(T, _name)
        register(_f)(_copy_rule(_base))


@register(torch.aminmax, T.aminmax)
def _aminmax(func, args, kwargs):
    a = bind(func, args, kwargs, ("input",), kwonly=("dim", "keepdim"))
    x, keep = a["input"], bool(a["keepdim"])
    if a["dim"] is None:
        lo, hi = torch.amin(x), torch.amax(x)
        if keep:
            lo, hi = lo.reshape([1] * ndim(x)), hi.reshape([1] * ndim(x))
    else:
        lo, hi = torch.amin(x, a["dim"], keep), torch.amax(x, a["dim"], keep)
    return torch.return_types.aminmax((lo, hi))


def _moments(func, args, kwargs, second):
    x = args[0]
    rest = list(args[1:])
    dim = kwargs.get("dim", rest[0] if rest and not isinstance(rest[0], bool) else None)
    keepdim = bool(kwargs.get("keepdim", rest[2] if len(rest) > 2 else False))
    spread = second(*args, **kwargs)
    if dim is None:
        mean = torch.mean(x)
        if keepdim:
            mean = mean.reshape([1] * ndim(x))
    else:
        mean = torch.mean(x, dim, keepdim)
    return spread, mean


@register(torch.std_mean)
def _std_mean(func, args, kwargs):
    return _moments(func, args, kwargs, torch.std)


@register(torch.var_mean)
def _var_mean(func, args, kwargs):
    return _moments(func, args, kwargs, torch.var)


@register(F.softmin)
def _softmin(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "dim", "_stacklevel", "dtype"))
    return F.softmax(-a["input"], a["dim"], dtype=a["dtype"])


@register(torch.ravel, T.ravel)
def _ravel(func, args, kwargs):
    return args[0].reshape(-1)


@register(torch.unsafe_split, T.unsafe_split, torch.split_with_sizes, torch.unsafe_split_with_sizes,
          T.unsafe_split_with_sizes)
def _split_alias(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "split_size", "dim"), {"dim": 0})
    return torch.split(a["input"], a["split_size"], a["dim"])


@register(torch.unsafe_chunk, T.unsafe_chunk)
def _chunk_alias(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "chunks", "dim"), {"dim": 0})
    return torch.chunk(a["input"], a["chunks"], a["dim"])


@register(torch.hsplit, T.hsplit, torch.vsplit, T.vsplit, torch.dsplit, T.dsplit)
def _xsplit(func, args, kwargs):
    """torch's rules: ``hsplit`` along dim 1 (dim 0 of a 1-d tensor), ``vsplit`` 0, ``dsplit`` 2."""
    a = bind(func, args, kwargs, ("input", "sections"))
    x, sec = a["input"], a["sections"]
    name, nd = func.__name__, ndim(x)
    dim = {"hsplit": 1 if nd > 1 else 0, "vsplit": 0, "dsplit": 2}[name]
    need = {"hsplit": 1, "vsplit": 2, "dsplit": 3}[name]
    if nd < need:
        raise RuntimeError(f"torch.{name} requires a tensor with at least {need} dimension, but got a tensor with "
                           f"{nd} dimensions!")
    if isinstance(sec, int) and x.shape[dim] % sec:
        raise RuntimeError(f"torch.{name} attempted to split along dimension {dim}, but the size of the dimension "
                           f"{x.shape[dim]} is not divisible by the split_size {sec}!")
    return torch.tensor_split(x, sec, dim)


def _atleast(func, args, kwargs, n):
    items = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
    out = []
    for t in items:
        while isinstance(t, ShardTensor) and ndim(t) < n:
            t = t.unsqueeze(-1) if (n == 3 and ndim(t) == 2) else t.unsqueeze(0)
        if not isinstance(t, ShardTensor):
            t = {1: torch.atleast_1d, 2: torch.atleast_2d, 3: torch.atleast_3d}[n](t)
        out.append(t)
    return out[0] if len(args) == 1 and not isinstance(args[0], (list, tuple)) else tuple(out)


register(torch.atleast_1d)(lambda func, args, kwargs: _atleast(func, args, kwargs, 1))
register(torch.atleast_2d)(lambda func, args, kwargs: _atleast(func, args, kwargs, 2))
register(torch.atleast_3d)(lambda func, args, kwargs: _atleast(func, args, kwargs, 3))


@register(torch.broadcast_tensors)
def _broadcast_tensors(func, args, kwargs):
    items = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
    shape = torch.broadcast_shapes(*(tuple(t.shape) for t in items))
    return tuple(t.expand(shape) for t in items)


@register(torch.dist, T.dist)
def _dist(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "other", "p"), {"p": 2})
    return torch.linalg.vector_norm(a["input"] - a["other"], a["p"])


@register(torch.linalg.vecdot)
def _vecdot(func, args, kwargs):
    a = bind(func, args, kwargs, ("x", "y"), kwonly=("dim",))
    return (a["x"].conj() * a["y"]).sum(-1 if a["dim"] is None else a["dim"])


@register(torch.equal, T.equal)
def _equal(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "other"))
    x, y = a["input"], a["other"]
    if tuple(x.shape) != tuple(y.shape):
        return False
    return bool((x == y).all().item())


@register(torch.allclose, T.allclose)
def _allclose(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "other", "rtol", "atol", "equal_nan"),
             {"rtol": 1e-5, "atol": 1e-8, "equal_nan": False})
    return bool(torch.isclose(a["input"], a["other"], a["rtol"], a["atol"], a["equal_nan"]).all().item())


@register(torch.trace, T.trace)
def _trace(func, args, kwargs):
    (x,) = args
    if ndim(x) != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {ndim(x)}")
    with no_subclass():
        part = torch.diagonal(x.to_local(), _diagonal_shift(x._spec, 2)).sum()
    return replicated(comm.all_reduce(part, x._spec.group), x._spec)


@register(torch.tril, T.tril, torch.triu, T.triu, T.tril_, T.triu_)
def _tril(func, args, kwargs):
    """Row ``i`` keeps columns ``j <= i + k`` (tril): on the local rows the diagonal moves by the row offset."""
    a = bind(func, args, kwargs, ("input", "diagonal"), {"diagonal": 0})
    x = a["input"]
    if not isinstance(x, ShardTensor):
        raise refuse(func, "only the input may be a ShardTensor")
    spec, nd = x._spec, ndim(x)
    if nd < 2:
        raise RuntimeError(f"{func.__name__}: input tensor must have at least 2 dimensions")
    k = int(a["diagonal"]) + _diagonal_shift(spec, nd)
    with no_subclass():
        out = func(x.to_local(), k)
    return x if func in (T.tril_, T.triu_) else wrap(out, spec, spec.dim)


def _diagonal_shift(spec, nd: int) -> int:
    """How far the main diagonal moves in this rank's block of a matrix sharded along its rows or columns."""
    off = spec.offsets[spec.rank]
    return off if spec.dim == nd - 2 else -off if spec.dim == nd - 1 else 0


@register(torch.prod, T.prod)
def _prod(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "dim", "keepdim"), {"keepdim": False}, kwonly=("dtype",))
    x = a["input"]
    if not isinstance(x, ShardTensor):
        raise refuse(func, "the reduced tensor must be the ShardTensor")
    spec, keep, dtype = x._spec, bool(a["keepdim"]), a["dtype"]
    if a["dim"] is not None:
        (d,) = norm_dims(a["dim"], ndim(x), func)
        with no_subclass():
            if d != spec.dim:
                out = torch.prod(x.to_local(), d, keep, dtype=dtype)
                return wrap(out, spec, spec.dim - (d < spec.dim and not keep))
            part = torch.prod(x.to_local(), d, True, dtype=dtype)
    else:
        with no_subclass():
            part = torch.prod(local_of(x), dtype=dtype).reshape(1)
        d = 0
    parts = comm.gather_uneven(part, [1] * spec.num_ranks, d, spec.group)
    with no_subclass():
        out = torch.prod(parts, d, keep) if a["dim"] is not None else torch.prod(parts)
    return replicated(out, spec)


# -- contractions, written as einsum (its rule all-reduces a contracted sharded dim) -----------------
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _contract(a, b, dims_a, dims_b):
    """``tensordot(a, b, (dims_a, dims_b))`` as one einsum: a's free dims, then b's."""
    na, nb = ndim(a), ndim(b)
    dims_a, dims_b = [d % max(na, 1) for d in dims_a], [d % max(nb, 1) for d in dims_b]
    sa = list(_LETTERS[:na])
    sb = list(_LETTERS[na:na + nb])
    for i, j in zip(dims_a, dims_b):
        sb[j] = sa[i]
    out = [c for i, c in enumerate(sa) if i not in dims_a] + [c for j, c in enumerate(sb) if j not in dims_b]
    return torch.einsum(f"{''.join(sa)},{''.join(sb)}->{''.join(out)}", a, b)


def _scaled_sum(func, inp, prod, beta, alpha):
    """``beta * input + alpha * prod`` as torch defines it (``beta == 0`` ignores ``input``, NaN included)."""
    out = prod if alpha == 1 else prod * alpha
    if beta == 0:
        return out
    return out + (inp if beta == 1 else inp * beta)


@register(torch.vdot, T.vdot, torch.dot, T.dot)
def _dot(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "other"))
    x, y = a["input"], a["other"]
    if ndim(x) != 1 or ndim(y) != 1:
        raise RuntimeError(f"1D tensors expected, but got {ndim(x)}D and {ndim(y)}D tensors")
    return _contract(x.conj() if func in (torch.vdot, T.vdot) else x, y, [0], [0])


@register(torch.inner, T.inner)
def _inner(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "other"))
    x, y = a["input"], a["other"]
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or ndim(x) == 0 or ndim(y) == 0:
        return x * y
    return _contract(x, y, [-1], [-1])


@register(torch.outer, T.outer, torch.ger, T.ger)
def _outer(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "vec2"))
    return _contract(a["input"], a["vec2"], [], [])


@register(torch.mv, T.mv)
def _mv(func, args, kwargs):
    a = bind(func, args, kwargs, ("input", "vec"))
    return _contract(a["input"], a["vec"], [1], [0])


@register(torch.tensordot)
def _tensordot(func, args, kwargs):
    a = bind(func, args, kwargs, ("a", "b", "dims"), {"dims": 2})
    x, y, dims = a["a"], a["b"], a["dims"]
    if isinstance(dims, torch.Tensor):
        dims = dims.tolist()
    if isinstance(dims, int):
        return _contract(x, y, list(range(ndim(x) - dims, ndim(x))), list(range(dims)))
    da, db = dims
    return _contract(x, y, [da] if isinstance(da, int) else list(da), [db] if isinstance(db, int) else list(db))


_ADD_PRODUCTS = {"addmm": ("ij,jk->ik", "mat1", "mat2"), "addmv": ("ij,j->i", "mat", "vec"),
                 "addr": ("i,j->ij", "vec1", "vec2"), "addbmm": ("bij,bjk->ik", "batch1", "batch2"),
                 "baddbmm": ("bij,bjk->bik", "batch1", "batch2")}


def _add_product(func, args, kwargs):
    eq, n1, n2 = _ADD_PRODUCTS[func.__name__.rstrip("_")]
    a = bind(func, args, kwargs, ("input", n1, n2), kwonly=("beta", "alpha"))
    beta = 1 if a["beta"] is None else a["beta"]
    alpha = 1 if a["alpha"] is None else a["alpha"]
    return _scaled_sum(func, a["input"], torch.einsum(eq, a[n1], a[n2]), beta, alpha)


register(*[f for n in _ADD_PRODUCTS for f in (getattr(torch, n, None), getattr(T, n, None)) if f is not None])(
    _add_product)


@register(F.bilinear)
def _bilinear(func, args, kwargs):
    """``y = x1^T W x2 + b`` per point: ``einsum('...i,oij,...j->...o')`` with the batch dims written out."""
    a = bind(func, args, kwargs, ("input1", "input2", "weight", "bias"))
    x1 = a["input1"]
    batch = _LETTERS[: ndim(x1) - 1]
    out = torch.einsum(f"{batch}y,xyz,{batch}z->{batch}x", x1, a["weight"], a["input2"])
    return out if a["bias"] is None else out + a["bias"]
