"""The tensor core: ``ShardSpec``, ``ShardTensor``, its dispatch and its sharding rules.

Importing this package registers every rule (``_rules/``, one module per op family).
"""

from __future__ import annotations

from . import _rules  # noqa: F401  (registration side effects)

# inspected_by_compiler, tracing, local_of, replicated, wrap, wrap_shard, plain_alias: building blocks for the
# ops and nn layers (importable from the package, not user API)
from ._compile import inspected_by_compiler as inspected_by_compiler
from ._compile import tracing as tracing
from ._dispatch import has_rule, register_rule
from ._rules._common import local_of as local_of
from ._rules._common import replicated as replicated
from ._rules._common import wrap as wrap
from ._spec import ShardSpec
from ._tensor import ReplicatedTensor, ShardTensor, scatter, validate_enabled
from ._tensor import plain_alias as plain_alias
from ._tensor import wrap_shard as wrap_shard

__all__ = [
    "ReplicatedTensor", "ShardSpec", "ShardTensor", "has_rule", "register_rule", "scatter",
    "validate_enabled",
]
