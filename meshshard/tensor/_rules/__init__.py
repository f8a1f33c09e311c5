"""Sharding rules, one module per op family; importing this package registers them all."""

from __future__ import annotations

from . import _attention, _index, _local, _reduce, _shape  # noqa: F401  (registration side effects)
