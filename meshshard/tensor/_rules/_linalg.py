"""Ops on whole matrices and whole signals: linear algebra and FFTs, gathered when the sharded dim is theirs.

A factorisation, inverse, determinant or eigen-decomposition of a matrix sharded along its rows (or
columns), or an FFT along the points, couples every row with every other: it has no per-point
structure a halo could serve. Such an op takes one explicit path, **gather -> compute -> reshard**:

1. every ShardTensor operand is gathered (:meth:`ShardTensor.full_tensor`, differentiable);
2. the op runs on the full tensors, identically on every rank;
3. each tensor result whose shape has the input's rank and the input's global length along the
   sharded dim ``d`` comes back sharded **like the input** (each rank keeps its rows: no
   communication); every other result is a :class:`ReplicatedTensor`.

The decision uses only global shapes, so it is the same on every rank. Forward and backward are exact:
each rank's gradient of the gathered tensor is partial (its own rows' share, or ``g / P`` of a
replicated result) and the gather's backward sums them over the ranks.

When the sharded dim is *not* one the op couples (a batch dim of a batched matrix op, a dim an FFT
does not transform), the op runs on the local shard instead: no communication (taken only when the
ShardTensor is the op's one tensor operand, so nothing else needs broadcasting).

**Communication** (gathered path): one ``all_to_all_single`` per ShardTensor operand forward
(``P * N_local * row_bytes`` sent per rank; every rank then holds the whole ``N_global`` rows) and one
per operand in backward (a reduce-scatter of ``N_global * row_bytes``); the compute is repeated on
every rank (memory ``O(N_global)`` per rank). Batch-local path: none.

Ops on the gathered path: ``torch.linalg.*`` matrix functions (and their ``torch.*`` twins:
``cholesky``, ``lu``, ``qr``, ``svd``, ``det``, ``logdet``, ``matrix_exp``, ``pinverse``, ...),
``torch.fft.*`` along a transformed dim, ``cov``/``corrcoef``, ``pdist``, ``diag``/``diag_embed``/
``diagflat``/``block_diag``/``kron``, ``stft``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ...errors import UnsupportedOpError
from .._dispatch import register_rule as register
from .._tensor import ReplicatedTensor, ShardTensor
from ._common import ndim, no_subclass, replicated, shard_args, wrap

__all__ = ["gather_compute_reshard"]

_LINALG_BATCHED = """
cholesky cholesky_ex det eig eigh eigvals eigvalsh inv inv_ex ldl_factor ldl_factor_ex lu lu_factor lu_factor_ex
matrix_exp matrix_power matrix_rank pinv qr slogdet svd svdvals cond householder_product
""".split()
_LINALG_GATHERED = """
lstsq solve solve_ex solve_triangular lu_solve ldl_solve multi_dot tensorinv tensorsolve vander diagonal matrix_norm
""".split()
_TORCH_BATCHED = """
cholesky cholesky_inverse det logdet slogdet inverse matrix_exp matrix_power pinverse qr svd geqrf lu
""".split()
_TORCH_GATHERED = """
cholesky_solve lu_solve lu_unpack triangular_solve ormqr cov corrcoef diag diag_embed diagflat block_diag kron stft
""".split()
_FFT_1D = "fft ifft rfft irfft hfft ihfft".split()
_FFT_2D = "fft2 ifft2 rfft2 irfft2 hfft2 ihfft2".split()
_FFT_ND = "fftn ifftn rfftn irfftn hfftn ihfftn".split()
_FFT_SHIFT = "fftshift ifftshift".split()


def _funcs(owner, names: list[str]) -> list[Callable]:
    out = []
    for n in names:
        for o in (owner, torch.Tensor) if owner is torch else (owner,):
            f = getattr(o, n, None)
            if callable(f):
                out.append(f)
    return out


def _gather(a: Any) -> Any:
    if isinstance(a, ShardTensor):
        return a.full_tensor().to_plain().contiguous()
    if isinstance(a, ReplicatedTensor):
        return a.to_plain()
    if isinstance(a, (list, tuple)) and any(isinstance(b, ShardTensor) for b in a):
        return type(a)(_gather(b) for b in a)
    return a


def _reshard(out: Any, x: ShardTensor) -> Any:
    """Results shaped like the input along its sharded dim are sharded like it; the others replicated."""
    spec = x._spec
    if isinstance(out, torch.Tensor):
        out = out.resolve_conj().resolve_neg()
        d = spec.dim
        if out.dim() == len(spec.global_shape) and out.shape[d] == spec.num_global:
            with no_subclass():
                local = out.narrow(d, spec.offsets[spec.rank], spec.sizes[spec.rank])
            return wrap(local, spec, d)
        return replicated(out, spec)
    if hasattr(out, "n_fields"):
        return type(out)(tuple(_reshard(o, x) for o in out))
    if isinstance(out, (list, tuple)):
        return type(out)(_reshard(o, x) for o in out)
    return out


def gather_compute_reshard(func: Callable, args: tuple, kwargs: dict) -> Any:
    """Run ``func`` on the gathered operands on every rank; reshard the results like the first ShardTensor."""
    if kwargs.get("out") is not None:
        raise UnsupportedOpError(f"{func.__name__} on a ShardTensor does not support out=")
    x = shard_args(args, kwargs)[0]
    full_args = tuple(_gather(a) for a in args)
    full_kwargs = {k: _gather(v) for k, v in kwargs.items()}
    with no_subclass():
        out = func(*full_args, **full_kwargs)
    return _reshard(out, x)


def _only_operand(args: tuple, kwargs: dict) -> ShardTensor | None:
    """The ShardTensor when it is the call's one tensor operand, else ``None``."""
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    nested = [a for a in (*args, *kwargs.values()) if isinstance(a, (list, tuple))
              and any(isinstance(b, torch.Tensor) for b in a)]
    if len(tensors) == 1 and not nested and isinstance(tensors[0], ShardTensor):
        return tensors[0]
    return None


def _local(func: Callable, args: tuple, kwargs: dict, x: ShardTensor) -> Any:
    with no_subclass():
        local = x.to_local()
        if x._spec.sizes[x._spec.rank] == 0:  # an empty rank: its results are empty along the sharded dim
            out = _empty_result(func, args, kwargs, x, local)
        else:
            out = _resolved(func(*args, **kwargs))
    return wrap(out, x._spec, x._spec.dim)


def _resolved(out: Any) -> Any:
    """Lazy conjugate/negative views (``ifft`` of a real input returns one) made plain, as every rank's are."""
    if isinstance(out, torch.Tensor):
        return out.resolve_conj().resolve_neg()
    if hasattr(out, "n_fields"):
        return type(out)(tuple(_resolved(o) for o in out))
    if isinstance(out, (list, tuple)):
        return type(out)(_resolved(o) for o in out)
    return out


def _empty_result(func: Callable, args: tuple, kwargs: dict, x: ShardTensor, local: torch.Tensor) -> Any:
    """An empty shard's results, shaped by torch on the meta device and kept on the input's graph.

    torch's kernels differ on empty inputs (MKL's FFT raises; linalg results come without a grad_fn),
    while a backward that reaches a collective on the other ranks (the loss's all-reduce) must run on
    this rank too. Adding the empty shard's sum (0) changes no value.
    """
    meta = local.detach().to("meta")
    swap = {id(x): meta}
    out = func(*(swap.get(id(a), a) for a in args), **{k: swap.get(id(v), v) for k, v in kwargs.items()})

    def real(o):
        if isinstance(o, torch.Tensor):
            t = torch.zeros(o.shape, dtype=o.dtype, device=local.device)
            if local.requires_grad and (o.dtype.is_floating_point or o.dtype.is_complex):
                t = t + local.sum().to(o.dtype)
            return t
        if hasattr(o, "n_fields"):
            return type(o)(tuple(real(p) for p in o))
        if isinstance(o, (list, tuple)):
            return type(o)(real(p) for p in o)
        return o

    return real(out)


def _batched_matrix_rule(func, args, kwargs):
    """A batched matrix op: local along a batch dim, gathered when the matrix dims hold the sharded one."""
    x = _only_operand(args, kwargs)
    if x is not None and x._spec.dim < ndim(x) - 2 and kwargs.get("out") is None:
        return _local(func, args, kwargs, x)
    return gather_compute_reshard(func, args, kwargs)


register(*_funcs(torch.linalg, _LINALG_BATCHED), *_funcs(torch, _TORCH_BATCHED))(_batched_matrix_rule)
register(*_funcs(torch.linalg, _LINALG_GATHERED), *_funcs(torch, _TORCH_GATHERED), F.pdist)(gather_compute_reshard)


def _fft_dims(func: Callable, args: tuple, kwargs: dict, nd: int) -> set[int]:
    """The dims an FFT (or shift) transforms, from its arguments (torch's defaults)."""
    name = func.__name__
    if name in _FFT_SHIFT:
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        dims = range(nd) if dim is None else [dim] if isinstance(dim, int) else dim
    elif name in _FFT_1D:
        dims = [kwargs.get("dim", args[2] if len(args) > 2 else -1)]
    else:
        s = kwargs.get("s", args[1] if len(args) > 1 else None)
        dim = kwargs.get("dim", args[2] if len(args) > 2 else None)
        if dim is None and name in _FFT_2D:
            dim = (-2, -1)
        if dim is None:
            dims = range(nd) if s is None else range(nd - len(s), nd)
        else:
            dims = [dim] if isinstance(dim, int) else dim
    return {int(d) % nd for d in dims}


@register(*_funcs(torch.fft, _FFT_1D + _FFT_2D + _FFT_ND + _FFT_SHIFT))
def _fft(func, args, kwargs):
    """FFTs and shifts: local when they do not transform the sharded dim, else gathered."""
    x = _only_operand(args, kwargs)
    if x is not None and kwargs.get("out") is None:
        try:
            dims = _fft_dims(func, args, kwargs, ndim(x))
        except (TypeError, ValueError):
            dims = None  # an odd argument: torch raises its own error on the gathered path
        if dims is not None and x._spec.dim not in dims:
            return _local(func, args, kwargs, x)
    return gather_compute_reshard(func, args, kwargs)


@register(torch.linalg.cross, torch.cross, torch.Tensor.cross)
def _cross(func, args, kwargs):
    """Cross products of 3-vectors along ``dim``: per point (local) unless ``dim`` is the sharded one."""
    from ._local import pointwise_rule

    names = ("input", "other", "dim")
    a = dict(zip(names, args), **kwargs)
    tensors = [t for t in (a.get("input"), a.get("other")) if isinstance(t, torch.Tensor)]
    nd = max(ndim(t) for t in tensors)
    dim = a.get("dim", -1 if func is torch.linalg.cross else None)
    if dim is None:  # torch.cross's legacy default: the first dim of length 3
        shape = torch.broadcast_shapes(*(tuple(t.shape) for t in tensors))
        dim = next((i for i, s in enumerate(shape) if s == 3), -1)
    dim = int(dim) % max(nd, 1)
    x = shard_args(args, kwargs)[0]
    operands = (a.get("input"), a.get("other"))
    if dim != nd - (ndim(x) - x._spec.dim):  # the sharded dim, aligned from the right
        return pointwise_rule(torch.linalg.cross, operands, {"dim": dim})
    return gather_compute_reshard(torch.linalg.cross, operands, {"dim": dim})
