"""Names a package imports on first use (PEP 562): one ``__getattr__``/``__dir__`` pair for every package.

A package lists which submodule defines each public name and hands the table to :func:`lazy_exports`::

    __getattr__, __dir__ = lazy_exports(__name__, {"partition": "_core"}, submodules=("io",))

The first ``pkg.partition`` imports ``pkg._core`` and stores the value in the package's namespace, so the
next access is a plain attribute (``__getattr__`` runs once per name). An unknown name raises the usual
``AttributeError`` with ``name`` and ``obj`` set, so Python's traceback suggests a close public name.

>>> getattr_, dir_ = lazy_exports("xml", {}, submodules=("dom",))
>>> getattr_("dom").__name__
'xml.dom'
>>> "dom" in dir_()
True
>>> getattr_("dmo")
Traceback (most recent call last):
    ...
AttributeError: module 'xml' has no attribute 'dmo'
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["if_imported", "lazy_exports"]


def if_imported(module: str, name: str) -> Any:
    """``module.name`` if ``module`` has been imported, else ``None``: for an ``isinstance`` test against a class
    whose module is costly to import (DTensor's, ~0.7 s), since no instance of it exists before its import.

    >>> if_imported("json", "dumps") is __import__("json").dumps
    True
    >>> if_imported("no_such_module_here", "X") is None
    True
    """
    loaded = sys.modules.get(module)
    return None if loaded is None else getattr(loaded, name, None)


def lazy_exports(
    package: str, exports: Mapping[str, str], submodules: Iterable[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``(__getattr__, __dir__)`` pair of ``package``.

    Parameters
    ----------
    package
        The package's ``__name__``.
    exports
        Public name -> the submodule (relative to ``package``, no leading dot) that defines it.
    submodules
        Submodules that are themselves public attributes of ``package``, imported on first use.

    ``__dir__`` lists the package's current namespace together with every lazy name, imported or not.
    """
    exports = dict(exports)
    submodules = tuple(submodules)
    names = {*exports, *submodules}

    def __getattr__(name: str) -> Any:
        module = importlib.import_module(package)  # the package itself (already in sys.modules)
        if name in exports:
            value = getattr(importlib.import_module(f".{exports[name]}", package), name)
        elif name in submodules:
            value = importlib.import_module(f".{name}", package)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}", name=name, obj=module)
        setattr(module, name, value)  # cached: later look-ups do not come back here
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(importlib.import_module(package)), *names})

    return __getattr__, __dir__
