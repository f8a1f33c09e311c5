"""The op registry behind ``ShardTensor.__torch_function__``, and argument normalisation.

A rule is registered next to its code with :func:`register_rule` (public as ``ms.register_rule``)::

    @register_rule(torch.sum, torch.Tensor.sum)
    def _sum(func, args, kwargs): ...

It receives the original ``func``, ``args`` and ``kwargs`` and reads them through :func:`bind`, which
maps torch's aliases (``axis`` -> ``dim``, ``keepdims`` -> ``keepdim``) and positional/keyword forms
onto one dict and **refuses** any argument the rule did not declare (``out=``, an unknown keyword):
a rule never guesses at a raw ``*args, **kwargs``.

Rules decide from metadata that is identical on every rank (the :class:`ShardSpec`, global shapes,
dtypes and the normalised arguments), so an op succeeds on every rank or raises the same error on
every rank. They run the local computation under :data:`no_subclass` (so ``func`` sees plain tensors
and autograd records the real local ops) and wrap results back as ShardTensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .._op_names import constant_result, op_name
from ..errors import UnsupportedOpError

__all__ = ["register_rule", "dispatch", "bind", "op_name", "func_name", "no_subclass", "has_rule"]

Rule = Callable[[Callable, tuple, dict], Any]
_RULES: dict[Callable, Rule] = {}

no_subclass = torch._C.DisableTorchFunctionSubclass

_ALIASES = {"axis": "dim", "keepdims": "keepdim"}
_MISSING = object()


def register_rule(*funcs: Callable) -> Callable[[Rule], Rule]:
    """Register a sharding rule for every torch function or method in ``funcs``.

    The rule is called as ``rule(func, args, kwargs)`` whenever ``func`` is applied with a
    :class:`~meshshard.ShardTensor` among its arguments, and returns the result (ShardTensors for
    sharded results, plain tensors for replicated ones). It must decide only from what every rank
    sees alike (specs, global shapes, dtypes, arguments) and raise the same error on every rank
    otherwise. Example: a per-point op that works row by row on the local shard::

        import meshshard as ms
        from meshshard.tensor import ShardTensor

        @ms.register_rule(torch.special.i0)
        def _i0(func, args, kwargs):
            x = args[0]
            local = func(x.to_local())
            return ShardTensor.from_local(local, x.mesh, sizes=x.sharding_sizes, dim=x.shard_dim)

    A rule registered later for the same function replaces the earlier one.
    """

    if not funcs:
        raise TypeError("register_rule needs at least one torch function or method (got none)")
    for f in funcs:
        if f is not None and not callable(f):
            raise TypeError(f"register_rule takes torch functions or methods (got {type(f).__name__} {f!r})")

    def deco(rule: Rule) -> Rule:
        if not callable(rule):
            raise TypeError(f"a sharding rule must be callable as rule(func, args, kwargs) (got {type(rule).__name__})")
        for f in funcs:
            if f is not None:
                _RULES[f] = rule
        return rule

    return deco


def has_rule(func: Callable) -> bool:
    """Whether ``func`` has a sharding rule."""
    return func in _RULES


@constant_result  # traced code: a function's name is a constant
def func_name(func: Callable) -> str:
    """``func.__name__`` (``""`` if it has none)."""
    return getattr(func, "__name__", "")


def dispatch(func: Callable, args: tuple, kwargs: dict) -> Any:
    rule = _RULES.get(func)
    if rule is None:
        raise UnsupportedOpError(
            f"meshshard.ShardTensor has no sharding rule for {op_name(func)}. Work on the local shard with "
            "x.to_local() (and rewrap with ShardTensor.from_local), gather with x.full_tensor(), or add a rule "
            "with meshshard.register_rule (see its docstring)."
        )
    return rule(func, args, kwargs)


def bind(
    func: Callable,
    args: Sequence,
    kwargs: dict,
    names: Sequence[str],
    defaults: dict | None = None,
    *,
    kwonly: Sequence[str] = (),
) -> dict:
    """Normalise ``args``/``kwargs`` of ``func`` onto the parameter ``names`` (positional order).

    torch's aliases ``axis``/``keepdims`` become ``dim``/``keepdim``; ``out=`` and any keyword not in
    ``names`` or ``kwonly`` raise :class:`UnsupportedOpError` (decided from the call alone, so on
    every rank alike). Missing parameters take ``defaults`` (``None`` if absent there).
    """
    if len(args) > len(names):
        raise UnsupportedOpError(
            f"{op_name(func)} on a ShardTensor: expected at most {len(names)} positional arguments "
            f"({', '.join(names)}) (got {len(args)})"
        )
    out = dict(zip(names, args))
    for key, value in kwargs.items():
        key = _ALIASES.get(key, key)
        if key == "out" and value is None:
            continue
        if key not in names and key not in kwonly:
            raise UnsupportedOpError(
                f"{op_name(func)} on a ShardTensor does not support the argument {key!r}"
                + (" (write the result to a new tensor instead)" if key == "out" else "")
            )
        if key in out:
            raise TypeError(f"{op_name(func)} got multiple values for argument {key!r}")
        out[key] = value
    for name in (*names, *kwonly):
        if name not in out:
            out[name] = (defaults or {}).get(name)
    return out
