"""Offsets from uneven sizes: the single source every layer derives them from.

Partitioners return per-part sizes; a ``ShardSpec`` carries per-rank sizes. Everything else (a
``Partition``'s offsets, a shard's global row range, a graph split by target) derives its offsets
here. This module imports nothing from meshshard, so the lowest layer can use it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["offsets_of", "offsets_tensor", "owner_of", "ring_bytes"]


def offsets_of(sizes: Sequence[int]) -> tuple[int, ...]:
    """``(0, s0, s0+s1, ..., sum(sizes))`` for a sequence of sizes."""
    out = [0]
    for s in sizes:
        out.append(out[-1] + int(s))
    return tuple(out)


def offsets_tensor(sizes: torch.Tensor) -> torch.Tensor:
    """``offsets_of`` for a 1-D integer tensor: a ``(P + 1,)`` int64 tensor on the same device."""
    offsets = torch.zeros(sizes.numel() + 1, dtype=torch.long, device=sizes.device)
    torch.cumsum(sizes.to(torch.long), 0, out=offsets[1:])
    return offsets


def owner_of(ids: torch.Tensor, offsets: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """The part (rank) that owns each global row id: ``r`` with ``offsets[r] <= id < offsets[r + 1]``.

    ``offsets`` as :func:`offsets_of` gives them (``P + 1`` entries from 0); an empty part owns
    nothing. Returns int64 of ``ids``' shape on its device; an id below 0 gives -1 and one at or past
    ``offsets[-1]`` gives ``P`` (callers that clamp them do so where they decide it).

    >>> owner_of(torch.tensor([0, 2, 3, 6]), offsets_of([3, 0, 4])).tolist()
    [0, 0, 2, 2]
    """
    offs = torch.as_tensor(offsets, dtype=torch.long, device=ids.device)
    return torch.searchsorted(offs, ids.to(torch.long).contiguous(), right=True) - 1


def ring_bytes(sizes: Sequence[int], row_bytes: int) -> list[int]:
    """Bytes each rank sends per exchange in a ring that moves every point to every other rank.

    The baseline of the halo reports (planner, :func:`meshshard.halo.simulate_halo`, the graph halo):
    rank ``r`` sends its ``sizes[r]`` rows of ``row_bytes`` bytes to each of the ``P - 1`` others.
    """
    world = len(sizes)
    return [(world - 1) * int(n) * int(row_bytes) for n in sizes]
