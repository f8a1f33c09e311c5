"""Typed reports: frozen dataclasses that also read like the dicts they replace.

The planner's and the halo simulator's reports (:class:`meshshard.planning.Plan`,
:class:`meshshard.halo.HaloReport`) are frozen dataclasses with named, typed fields. They derive
from :class:`Record`, so ``report["ranks"]`` and ``report.ranks`` read the same field (code and
documents written against the old dict reports keep working), and :meth:`Record.to_dict` gives
plain Python for ``json.dump``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

__all__ = ["Record"]


class Record:
    """Mixin for a frozen dataclass: read-only dict-style access to its fields and ``to_dict``."""

    def __getitem__(self, key: str) -> Any:
        if key not in self._names():
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return key in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def keys(self) -> tuple[str, ...]:
        """The field names, in declaration order."""
        return self._names()

    def get(self, key: str, default: Any = None) -> Any:
        """The field ``key``, or ``default`` when there is no such field."""
        return getattr(self, key) if key in self._names() else default

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts, lists and numbers all the way down (nested records and dataclasses too)."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def _names(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self))  # type: ignore[arg-type]
