"""Sharding rules, one module per op family; importing this package registers them all."""

from __future__ import annotations

from . import _conv, _distance, _index, _local, _loss, _norm, _reduce, _scatter, _shape  # noqa: F401  (registration)
