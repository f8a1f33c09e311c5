"""More pointwise ops: special functions, complex construction and views, shrinkage activations.

They are element by element, so they take :func:`._local.pointwise_rule` (local on every shard, operands
sharded alike or broadcasting plain tensors, ``out=`` refused). The few with a dimension of their own
(``glu``'s halves, ``view_as_complex``'s pair dim, ``prelu``'s channel dim) are local when that dim is
not the sharded one and refused otherwise.

**Communication:** none.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._dispatch import bind
from .._dispatch import register_rule as register
from .._tensor import ShardTensor
from ._common import dim_of, ndim, no_subclass, refuse, wrap
from ._local import pointwise_rule

T = torch.Tensor

_TORCH = """
digamma lgamma mvlgamma polygamma i0 igamma igammac ldexp nextafter logaddexp logaddexp2 frexp isclose isreal
complex polar conj_physical resolve_conj resolve_neg rsub xlogy special_xlog1py
""".split()
_SPECIAL = """
airy_ai bessel_j0 bessel_j1 bessel_y0 bessel_y1 chebyshev_polynomial_t chebyshev_polynomial_u
chebyshev_polynomial_v chebyshev_polynomial_w entr erfcx hermite_polynomial_h hermite_polynomial_he i0 i0e i1 i1e
laguerre_polynomial_l legendre_polynomial_p log_ndtr modified_bessel_i0 modified_bessel_i1 modified_bessel_k0
modified_bessel_k1 ndtr ndtri polygamma scaled_modified_bessel_k0 scaled_modified_bessel_k1
shifted_chebyshev_polynomial_t shifted_chebyshev_polynomial_u shifted_chebyshev_polynomial_v
shifted_chebyshev_polynomial_w spherical_bessel_j0 xlog1py xlogy zeta digamma psi gammaln multigammaln gammainc
gammaincc erfc erfinv exp2 expm1 log1p sinc round
""".split()
_METHODS = "cdouble cfloat chalf".split()


def _collect() -> list:
    out = []
    for name in _TORCH:
        for owner in (torch, T):
            for n in (name, name + "_"):
                f = getattr(owner, n, None)
                if callable(f):
                    out.append(f)
    out += [f for n in _SPECIAL if callable(f := getattr(torch.special, n, None))]
    out += [getattr(T, n) for n in _METHODS if hasattr(T, n)]
    out += [F.hardshrink, T.hardshrink, F.softshrink, T.real.__get__, T.imag.__get__]
    return [f for f in out if f is not None]


register(*_collect())(pointwise_rule)


@register(F.glu)
def _glu(func, args, kwargs):
    """``glu`` halves ``dim``: local when ``dim`` is not the sharded dim."""
    a = bind(func, args, kwargs, ("input", "dim"), {"dim": -1})
    x = a["input"]
    if dim_of(func, x, a["dim"]) == x._spec.dim:
        raise refuse(func, "dim is the sharded dim (its two halves live on different ranks)",
                     "shard another dim or reshard so that dim is not sharded")
    with no_subclass():
        out = func(x.to_local(), a["dim"])
    return wrap(out, x._spec, x._spec.dim)


@register(torch.view_as_complex)
def _view_as_complex(func, args, kwargs):
    """The last dim (the real/imaginary pair) must not be the sharded one."""
    (x,) = args
    if x._spec.dim == ndim(x) - 1:
        raise refuse(func, "the sharded dim is the (real, imag) pair dim")
    with no_subclass():
        out = func(x.to_local())
    return wrap(out, x._spec, x._spec.dim)


@register(F.prelu, torch.prelu)
def _prelu(func, args, kwargs):
    """``prelu`` scales channel ``c`` (dim 1, or dim 0 of a 1-d input) by ``weight[c]``: local unless the channel
    dim is sharded with a per-channel weight."""
    a = bind(func, args, kwargs, ("input", "weight"))
    x, w = a["input"], a["weight"]
    if not isinstance(x, ShardTensor) or isinstance(w, ShardTensor):
        raise refuse(func, "only the input may be a ShardTensor (the weight is a plain tensor)")
    channel = 1 if ndim(x) >= 2 else 0
    if x._spec.dim == channel and w.numel() != 1:
        raise refuse(func, "the channel dim is sharded and the weight is per channel", "shard the points")
    with no_subclass():
        out = func(x.to_local(), w)
    return wrap(out, x._spec, x._spec.dim)
