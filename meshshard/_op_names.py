"""The readable name of an op (``torch.add``, ``Tensor.sum``): one definition for every error message.

The dispatcher, ``DomainParallel``'s guards and the collective-failure context all name the op they refuse
or were running. The name is a constant to ``torch.compile`` (``assume_constant_result``), so a traced
error message costs no graph break. This module imports nothing from meshshard.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.overrides import resolve_name

__all__ = ["op_name"]


@torch._dynamo.assume_constant_result  # traced (compiled) code: the name of a function is a constant
def op_name(func: Callable) -> str:
    """``torch.overrides.resolve_name(func)``, else ``func.__name__``, else ``repr(func)``."""
    try:
        return resolve_name(func) or getattr(func, "__name__", repr(func))
    except Exception:
        return getattr(func, "__name__", repr(func))
