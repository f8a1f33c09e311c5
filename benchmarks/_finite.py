"""The check every benchmark that trains or evaluates a model makes before it reports anything.

A benchmark of a broken model fails, it does not report (the developers' guide, habit 24):
timings and memory of a model whose losses are NaN measure nothing. Each benchmark passes its
losses, outputs or checksums here right after computing them, and again before saving.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["NotFiniteError", "check_finite"]


class NotFiniteError(RuntimeError):
    """A benchmark's model produced NaN or infinite losses/outputs: nothing is reported."""


def _non_finite(obj) -> list[float]:
    """NaN/inf values found in ``obj`` (for a tensor: how many, as that many copies of the first)."""
    import torch

    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if hasattr(t, "to_local"):  # a ShardTensor: this rank's part
            t = t.to_local()
        if not (t.is_floating_point() or t.is_complex()):
            return []
        bad = t[~torch.isfinite(t)]
        return [complex(bad[0]).real if t.is_complex() else float(bad[0])] * bad.numel() if bad.numel() else []
    if isinstance(obj, bool):
        return []
    if isinstance(obj, (int, float)):
        return [] if math.isfinite(obj) else [float(obj)]
    if isinstance(obj, Mapping):
        return [v for item in obj.values() for v in _non_finite(item)]
    if isinstance(obj, (list, tuple)):
        return [v for item in obj for v in _non_finite(item)]
    raise TypeError(f"check_finite expects numbers, tensors, lists or dicts of them (got {type(obj).__name__})")


def check_finite(what: str, values) -> None:
    """Raise :class:`NotFiniteError` naming ``what`` if any value in ``values`` is NaN or infinite.

    ``values``: a number, a tensor (a ShardTensor: this rank's shard) or nested lists, tuples and
    dicts of them.
    """
    bad = _non_finite(values)
    if bad:
        raise NotFiniteError(
            f"{what}: {len(bad)} non-finite value(s) (first {bad[0]}); the model is broken, so this "
            "benchmark refuses to report its timings"
        )
