"""Exceptions raised by meshshard."""

from __future__ import annotations

__all__ = ["ShardingError", "UnsupportedOpError"]


class ShardingError(RuntimeError):
    """Ranks disagree, or two operands are sharded incompatibly (different sizes, dims or meshes)."""


class UnsupportedOpError(NotImplementedError):
    """An op was applied to a ShardTensor for which meshshard has no sharding rule."""
