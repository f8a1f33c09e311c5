"""The tensor core: ``ShardSpec``, ``ShardTensor``, its dispatch and its sharding rules.

Importing this package registers every rule (``_rules/``, one module per op family).
"""

from __future__ import annotations

from . import _rules  # noqa: F401  (registration side effects)
from ._dispatch import has_rule, register_rule
from ._spec import ShardSpec, offsets_of
from ._tensor import ReplicatedTensor, ShardTensor, scatter, validate_enabled

__all__ = [
    "ReplicatedTensor", "ShardSpec", "ShardTensor", "has_rule", "offsets_of", "register_rule", "scatter",
    "validate_enabled",
]
