"""The :class:`Partition` record: a permutation that makes every part contiguous, plus part sizes."""

from __future__ import annotations

import os
from dataclasses import InitVar, dataclass, field
from typing import Any

import numpy as np
import torch

from .._checks import check_positive_int
from .._sizes import offsets_tensor

__all__ = ["Partition"]

_FORMAT = "meshshard.Partition/1"


def _as_long(x: Any, name: str) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    elif isinstance(x, list | tuple):
        x = torch.as_tensor(x, dtype=torch.long)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a LongTensor (got {type(x).__name__})")
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor (got {x.dtype})")
    if x.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional (got shape {tuple(x.shape)})")
    return x.to(torch.long)


def _boxes_like(x: Any, num_parts: int, name: str, device: torch.device) -> torch.Tensor | None:
    if x is None:
        return None
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor of shape (P, 2, D) or None (got {type(x).__name__})")
    if x.ndim != 3 or x.shape[0] != num_parts or x.shape[1] != 2:
        raise ValueError(f"{name} must have shape ({num_parts}, 2, D) (got {tuple(x.shape)})")
    return x.to(device)


@dataclass(frozen=True, eq=False)
class Partition:
    r"""A partition of ``N`` points into ``P`` contiguous parts.

    A partition is a reordering plus sizes: part ``r`` owns the original points
    ``perm[offsets[r]:offsets[r + 1]]``. ``sizes`` is the single source of truth (they become the
    sharding shapes of a ``ShardTensor``); ``offsets`` and ``owner`` are derived from ``perm`` and
    ``sizes`` when the object is built.

    Construct it with :func:`meshshard.partition.partition`, from an owner array with
    :meth:`from_owner`, or directly from ``perm`` and ``sizes`` (``method="manual"``).

    Parameters
    ----------
    perm : LongTensor
        New order -> original index: position ``i`` of the partitioned order holds original point
        ``perm[i]``. Must be a permutation of ``0..N-1``.
    sizes : LongTensor
        Number of points of each part, non-negative, summing to ``N``. Moved to ``perm.device``.
    method : str
        How the partition was made (``"rcb"``, ``"morton"``, ``"hilbert"``, ``"manual"``, ...).
    params : dict
        Parameters of the method (plain Python values, saved with the partition).
    boxes : Tensor or None
        ``(P, 2, D)`` axis-aligned bounds ``[min corner, max corner]`` of each part's points. An
        empty part has the empty box ``[+inf, -inf]``, which intersects nothing.
    regions : Tensor or None
        ``(P, 2, D)`` cells that cover space: for ``rcb`` the leaves of the cut tree (``+-inf`` on
        the outer faces; neighbouring cells share their cut plane), for curve methods equal to
        ``boxes``. Every point lies in the closed region of its part.
    validate : bool
        Check that ``perm`` is a permutation (one ``bincount``, ``O(N)``). Partitioners that build
        ``perm`` themselves skip it.

    Attributes
    ----------
    offsets : LongTensor
        ``(P + 1,)`` exclusive prefix sum of ``sizes``.
    owner : LongTensor
        ``(N,)`` part of each *original* point.

    **Shapes**: ``perm``, ``owner``: ``(N_global,)``; ``sizes``: ``(P,)``; ``offsets``: ``(P + 1,)``;
    ``boxes``, ``regions``: ``(P, 2, D)``.

    Examples
    --------
    >>> import torch
    >>> part = Partition(perm=torch.tensor([2, 0, 1]), sizes=torch.tensor([1, 2]))
    >>> part.owner.tolist(), part.shard_indices(1).tolist()
    ([1, 1, 0], [0, 1])
    """

    perm: torch.Tensor
    sizes: torch.Tensor
    method: str = "manual"
    params: dict[str, Any] = field(default_factory=dict)
    boxes: torch.Tensor | None = None
    regions: torch.Tensor | None = None
    validate: InitVar[bool] = True
    offsets: torch.Tensor = field(init=False, repr=False)
    owner: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self, validate: bool) -> None:
        perm = _as_long(self.perm, "perm")
        sizes = _as_long(self.sizes, "sizes").to(perm.device)
        if sizes.numel() < 1:
            raise ValueError("sizes must have at least one part (got 0 parts)")
        if bool((sizes < 0).any()):
            raise ValueError(f"sizes must be non-negative (got {sizes.tolist()[:16]})")
        num_points = perm.numel()
        if int(sizes.sum()) != num_points:
            raise ValueError(f"sizes must sum to len(perm) = {num_points} (got sum {int(sizes.sum())})")
        num_parts = sizes.numel()
        if validate and num_points > 0:
            in_range = bool(((perm >= 0) & (perm < num_points)).all())
            if not in_range or bool((torch.bincount(perm, minlength=num_points) != 1).any()):
                raise ValueError(f"perm must be a permutation of 0..{num_points - 1}")
        if not isinstance(self.method, str):
            raise TypeError(f"method must be a string (got {type(self.method).__name__})")
        if not isinstance(self.params, dict):
            raise TypeError(f"params must be a dict (got {type(self.params).__name__})")
        offsets = offsets_tensor(sizes)
        owner = torch.empty(num_points, dtype=torch.long, device=perm.device)
        owner[perm] = torch.repeat_interleave(
            torch.arange(num_parts, device=perm.device), sizes, output_size=num_points
        )
        object.__setattr__(self, "perm", perm)
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "boxes", _boxes_like(self.boxes, num_parts, "boxes", perm.device))
        object.__setattr__(self, "regions", _boxes_like(self.regions, num_parts, "regions", perm.device))
        object.__setattr__(self, "offsets", offsets)
        object.__setattr__(self, "owner", owner)
        object.__setattr__(self, "_offsets_list", offsets.tolist())

    # ------------------------------------------------------------------ derived
    @property
    def num_parts(self) -> int:
        """Number of parts ``P``."""
        return self.sizes.numel()

    @property
    def num_points(self) -> int:
        """Number of points ``N``."""
        return self.perm.numel()

    @property
    def device(self) -> torch.device:
        """Device of the index tensors."""
        return self.perm.device

    def __repr__(self) -> str:
        sizes = self.sizes.tolist()
        shown = ", ".join(map(str, sizes[:8])) + (", ..." if len(sizes) > 8 else "")
        return (
            f"Partition(method={self.method!r}, num_parts={self.num_parts}, "
            f"num_points={self.num_points}, sizes=[{shown}])"
        )

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_owner(cls, owner: torch.Tensor | np.ndarray, num_parts: int, **kwargs: Any) -> Partition:
        """Build a partition from the part of each point.

        Stable: within a part, points keep their original relative order.

        Parameters
        ----------
        owner : LongTensor
            ``(N,)`` part index in ``[0, num_parts)`` of each point.
        num_parts : int
            ``P``; parts that own no point get size 0.
        **kwargs
            Passed to the constructor (``method``, ``params``, ``boxes``, ``regions``).
        """

        num_parts = check_positive_int(num_parts, "num_parts")
        owner = _as_long(owner, "owner")
        if owner.numel() > 0 and bool(((owner < 0) | (owner >= num_parts)).any()):
            bad = owner[(owner < 0) | (owner >= num_parts)][0]
            raise ValueError(f"owner must lie in [0, num_parts={num_parts}) (found {int(bad)})")
        sizes = torch.bincount(owner, minlength=num_parts)
        perm = torch.sort(owner, stable=True).indices
        kwargs.setdefault("validate", False)  # a sort always yields a permutation
        return cls(perm=perm, sizes=sizes, **kwargs)

    # ------------------------------------------------------------------ use
    def shard_indices(self, rank: int) -> torch.Tensor:
        """Original indices of the points of part ``rank`` (a view of ``perm``)."""
        if isinstance(rank, bool) or not isinstance(rank, int | np.integer):
            raise TypeError(f"rank must be an integer (got {type(rank).__name__})")
        if not 0 <= rank < self.num_parts:
            raise ValueError(f"rank must lie in [0, {self.num_parts}) (got {rank})")
        offsets = self._offsets_list  # type: ignore[attr-defined]
        return self.perm[offsets[rank] : offsets[rank + 1]]

    def apply(self, tensor: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
        """Reorder a per-point tensor (dim 0) into partition order: ``tensor[perm]``.

        A numpy array gives a numpy array. The inverse is :meth:`unapply`.

        **Shapes**: ``(N_global, *)`` -> ``(N_global, *)``.
        """
        self._check_rows(tensor)
        if isinstance(tensor, np.ndarray):
            return tensor[self.perm.cpu().numpy()]
        return tensor[self.perm.to(tensor.device)]

    def unapply(self, tensor: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
        """Undo :meth:`apply`: bring a tensor in partition order back to the original order."""
        self._check_rows(tensor)
        if isinstance(tensor, np.ndarray):
            out_np = np.empty_like(tensor)
            out_np[self.perm.cpu().numpy()] = tensor
            return out_np
        out = torch.empty_like(tensor)
        out[self.perm.to(tensor.device)] = tensor
        return out

    def _check_rows(self, tensor: Any) -> None:
        if not isinstance(tensor, torch.Tensor | np.ndarray):
            raise TypeError(f"tensor must be a torch.Tensor or numpy.ndarray (got {type(tensor).__name__})")
        if tensor.ndim < 1 or tensor.shape[0] != self.num_points:
            raise ValueError(f"tensor must have num_points = {self.num_points} rows (got shape {tuple(tensor.shape)})")

    def to(self, device: torch.device | str) -> Partition:
        """A copy with every tensor on ``device``."""
        return Partition(
            perm=self.perm.to(device),
            sizes=self.sizes.to(device),
            method=self.method,
            params=dict(self.params),
            boxes=None if self.boxes is None else self.boxes.to(device),
            regions=None if self.regions is None else self.regions.to(device),
        )

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the partition to ``path`` (``torch.save`` of CPU tensors and plain values)."""
        torch.save(
            {
                "format": _FORMAT,
                "perm": self.perm.cpu(),
                "sizes": self.sizes.cpu(),
                "method": self.method,
                "params": self.params,
                "boxes": None if self.boxes is None else self.boxes.cpu(),
                "regions": None if self.regions is None else self.regions.cpu(),
            },
            path,
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str], device: torch.device | str = "cpu") -> Partition:
        """Read a partition written by :meth:`save` onto ``device``."""
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise ValueError(f"path does not hold a saved Partition ({os.fspath(path)!r})")
        return cls(
            perm=state["perm"],
            sizes=state["sizes"],
            method=state["method"],
            params=state["params"],
            boxes=state["boxes"],
            regions=state["regions"],
        ).to(device)
