"""Sharding rules, one module per op family; importing this package registers them all."""

from __future__ import annotations

from . import (  # noqa: F401  (registration side effects)
    _attention,
    _cat,
    _cluster,
    _compose,
    _conv,
    _distance,
    _grid,
    _index,
    _linalg,
    _local,
    _loss,
    _norm,
    _pointwise,
    _random,
    _reduce,
    _scan,
    _scatter,
    _select,
    _shape,
    _sort,
)
