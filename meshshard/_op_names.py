"""The readable name of an op (``torch.add``, ``Tensor.sum``): one definition for every error message.

The dispatcher, ``DomainParallel``'s guards and the collective-failure context all name the op they refuse
or were running. The name is a constant to ``torch.compile`` (marked as ``torch._dynamo.assume_constant_result``
marks it), so a traced error message costs no graph break. This module imports nothing from meshshard, nor
``torch._dynamo`` (0.6 s in every process: each rank, worker and CLI run); that loads when something compiles.
"""

from __future__ import annotations

from collections.abc import Callable

from torch.overrides import resolve_name

__all__ = ["constant_result", "op_name"]

#: the attribute ``torch._dynamo.assume_constant_result`` sets on a function, and all it does
#: (tests/test_op_names.py checks that against the installed torch)
CONSTANT_RESULT_MARK = "_dynamo_marked_constant"


def constant_result(fn: Callable) -> Callable:
    """``fn``, marked for ``torch.compile`` to call it while tracing and use its result as a constant."""
    setattr(fn, CONSTANT_RESULT_MARK, True)
    return fn


@constant_result  # traced (compiled) code: the name of a function is a constant
def op_name(func: Callable) -> str:
    """``torch.overrides.resolve_name(func)``, else ``func.__name__``, else ``repr(func)``."""
    try:
        return resolve_name(func) or getattr(func, "__name__", repr(func))
    except Exception:
        return getattr(func, "__name__", repr(func))
