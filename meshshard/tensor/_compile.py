"""``torch.compile`` support: what the sharded types do while dynamo traces them.

Dynamo inlines ``ShardTensor.__torch_function__``: the sharding rules run at trace time and the
graph holds only the local ops and the collectives of :mod:`meshshard.comm` (as
``_c10d_functional`` ops, with autograd through them). Two moments need care:

* While dynamo and AOTAutograd *inspect* an input (fakeify it: ``_base``, ``size()``,
  ``is_mkldnn``...) they call tensor methods for real, outside any trace:
  :func:`inspected_by_compiler` is true then and those calls pass through to the local tensor.
  Inside traced code it is constant ``False``.
* Python operators whose ``Tensor`` dunder torch writes in Python (``x ** 2``, ``1 - x``, ``2 / x``):
  :func:`traced_dunder` gives the torch ops they stand for.
* The sharding metadata (:class:`~meshshard.tensor.ShardSpec`) is Python data read by the rules;
  see :func:`spec_guard_key` for how a compiled graph is tied to the sizes it was traced with.
"""

from __future__ import annotations

import torch

__all__ = ["allow_subclass_inputs", "inspected_by_compiler", "traced_dunder", "tracing"]


def tracing() -> bool:
    """Whether dynamo is tracing the current code (constant inside a trace)."""
    return torch.compiler.is_dynamo_compiling()


def inspected_by_compiler() -> bool:
    """Whether the compiler (not traced user code) is calling a tensor method: pass it through."""
    return torch.compiler.is_compiling() and not torch.compiler.is_dynamo_compiling()


def allow_subclass_inputs() -> None:
    """Turn off AOTAutograd's first-call custom-op aliasing check (the one global setting meshshard changes).

    ``torch._functorch.config.check_custom_op_aliasing`` runs the first call of every compiled
    function under a debug dispatch mode that, in torch 2.13, fails for any ``__torch_function__``
    subclass input ("Multiple dispatch failed for aten.view ... returned NotImplemented";
    pytorch#193932). The check only validates *custom* ops' aliasing; meshshard's one custom op
    (``meshshard::seeded_rand``) returns a new tensor.
    """
    import torch._functorch.config as functorch_config

    functorch_config.check_custom_op_aliasing = False


allow_subclass_inputs()


# -- the guard on the sharding metadata -------------------------------------------------------------
# Dynamo guards on what traced code reads from a graph input: the spec's ints are read through the
# source ``L['x']._spec...`` and guarded, but after one change *automatic dynamic* turns such a local
# int into a symbol, and only the fields a rule happened to read are guarded (a rank whose local
# length is unchanged could keep a graph its peers replace). Instead, a spec that enters a traced
# region is read through one string, its *guard key*: dynamo guards it with one EQUALS_MATCH (strings
# are never made symbolic) and the traced code rebuilds the spec from the string's constants. The
# key holds the sharding sizes, the global shape, the dims and the node sizes: identical on every
# rank, so every rank's guard passes or fails on the same call.


def spec_key(dim: int, mesh_dim: int, sizes, global_shape, node_sizes) -> str:
    """The guard key of a spec: ``"dim;mesh_dim;sizes;global_shape;node_sizes"`` (comma-separated ints)."""
    ns = "-" if node_sizes is None else ",".join([str(s) for s in node_sizes])
    return (f"{dim};{mesh_dim};{','.join([str(s) for s in sizes])};{','.join([str(s) for s in global_shape])};"
            f"{ns}")


def parse_key(key: str) -> tuple[int, int, tuple[int, ...], tuple[int, ...], tuple[int, ...] | None]:
    """The inverse of :func:`spec_key` (run by traced code on a constant: its results are constants)."""
    parts = key.split(";")
    sizes = tuple([int(s) for s in parts[2].split(",")])
    shape = tuple([int(s) for s in parts[3].split(",")])
    nodes = None if parts[4] == "-" else tuple([int(s) for s in parts[4].split(",")])
    return int(parts[0]), int(parts[1]), sizes, shape, nodes


# -- Tensor methods written in Python -------------------------------------------------------------------
def _python_methods() -> dict:
    """``{method.__get__: method}`` for the methods of ``torch.Tensor`` written in Python (``norm``...)."""
    import types

    return {f.__get__: f for f in vars(torch.Tensor).values() if isinstance(f, types.FunctionType)}


_METHODS = _python_methods()


def bind_method(func, args, kwargs):
    """Traced code: ``x.norm`` reaches ``__torch_function__`` as ``Tensor.norm.__get__``: bind the method to ``x``
    (its call then dispatches as usual). Eager Python never asks this (it binds methods itself).

    **Communication:** none.
    """
    import functools

    return functools.partial(_METHODS[func], args[0])


def register_method_binding() -> None:
    from ._dispatch import register_rule

    register_rule(*_METHODS)(bind_method)


# -- Python operators whose Tensor dunder is written in Python ---------------------------------------------
def _dunder_impls() -> tuple:
    """``((dunder, impl), ...)``: the ops each dunder of ``torch/_tensor.py`` runs, as its body does.

    ``impl(call, self, other)`` runs them through ``call`` (:func:`meshshard.tensor._tensor.redispatch`)."""
    T = torch.Tensor
    pairs = [
        (T.__pow__, lambda call, x, o: call(torch.pow, x, o)),
        (T.__ipow__, lambda call, x, o: call(T.pow_, x, o)),
        (T.__rpow__, lambda call, x, o: call(torch.pow, o, x)),
        (T.__rsub__, lambda call, x, o: call(torch.rsub, x, o)),
        (T.__rtruediv__, lambda call, x, o: call(torch.mul, call(torch.reciprocal, x), o)),
        (getattr(T, "__rdiv__", None), lambda call, x, o: call(torch.mul, call(torch.reciprocal, x), o)),
        (T.__floordiv__, lambda call, x, o: call(torch.floor_divide, x, o)),
        (T.__rfloordiv__, lambda call, x, o: call(torch.floor_divide, o, x)),
        (T.__rmod__, lambda call, x, o: call(torch.remainder, o, x)),
        (T.__rmatmul__, lambda call, x, o: call(torch.matmul, o, x)),
    ]
    return tuple([(d, f) for d, f in pairs if d is not None])


_DUNDER_IMPLS = _dunder_impls()


def traced_dunder(func):
    """Traced code: the ops behind ``func`` if it is a ``Tensor`` dunder torch writes in Python, else ``None``.

    Those dunders (``__pow__``, ``__rsub__``, ``__rtruediv__``, ``__rpow__``, ``__floordiv__``, ``__rfloordiv__``,
    ``__rmod__``, ``__rmatmul__``, ``__ipow__``) wrap their body in a ``TypeError -> NotImplemented`` handler.
    Traced by dynamo (torch 2.13), such a dunder reaches ``__torch_function__`` as a function that the rule
    registry's dict lookup misses (``is`` still finds it; the miss would also leave a guard that fails on the
    frame that made it), and calling it on the local shard comes back as ``NotImplemented``. So traced code runs
    the body's own ops instead (``x ** 2`` -> ``torch.pow(x, 2)``, ``1 - x`` -> ``torch.rsub(x, 1)``, ``2 / x``
    -> ``x.reciprocal() * 2``), each through its sharding rule: the same local ops as eager, which dispatches the
    dunder itself. Eager Python never asks this.

    **Communication:** none (that of the ops it stands for).
    """
    for dunder, impl in _DUNDER_IMPLS:
        if func is dunder:
            return impl
    return None
