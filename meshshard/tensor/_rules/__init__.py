"""Sharding rules, one module per op family; importing this package registers them all."""

from __future__ import annotations

from . import (  # noqa: F401  (registration side effects)
    _attention,
    _cat,
    _cluster,
    _conv,
    _distance,
    _grid,
    _index,
    _local,
    _loss,
    _norm,
    _random,
    _reduce,
    _scan,
    _scatter,
    _shape,
    _sort,
)
