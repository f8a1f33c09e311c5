r"""Space-filling-curve keys (Morton / Z-order and Hilbert) for 2-D and 3-D points.

Coordinates are quantised on one cubic grid over the bounding box (the same scale on every axis,
so the curve keeps the cloud's aspect ratio): ``bits`` bits per axis, 21 in 3-D (63-bit keys)
and 31 in 2-D (62-bit keys), so keys fit a non-negative ``int64``.
"""

from __future__ import annotations

import torch

__all__ = ["DEFAULT_BITS", "hilbert_keys", "morton_keys", "quantize"]

DEFAULT_BITS = {2: 31, 3: 21}


def quantize(points: torch.Tensor, bits: int, bounds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Integer grid coordinates in ``[0, 2**bits - 1]`` on a cube spanning the bounding box.

    ``bounds``: the ``float64`` ``(lo, hi)`` corners of the bounding box, when ``points`` are one
    rank's chunk of a larger cloud (default: the box of ``points``).

    **Shapes**: ``(N, D)`` float -> ``(N, D)`` int64.
    """
    x = points.to(torch.float64)
    if x.shape[0] == 0:
        return torch.zeros(x.shape, dtype=torch.long, device=x.device)
    lo, hi = (x.amin(dim=0), x.amax(dim=0)) if bounds is None else bounds
    extent = float((hi - lo).max())
    top = (1 << bits) - 1
    scale = top / extent if extent > 0 else 0.0
    return ((x - lo) * scale).floor_().clamp_(0, top).to(torch.long)


def _spread(v: torch.Tensor, dim: int) -> torch.Tensor:
    """Insert ``dim - 1`` zero bits between the bits of ``v`` (magic-number bit spreading)."""
    if dim == 3:
        v = v & 0x1FFFFF
        v = (v | (v << 32)) & 0x1F00000000FFFF
        v = (v | (v << 16)) & 0x1F0000FF0000FF
        v = (v | (v << 8)) & 0x100F00F00F00F00F
        v = (v | (v << 4)) & 0x10C30C30C30C30C3
        v = (v | (v << 2)) & 0x1249249249249249
        return v
    v = v & 0x7FFFFFFF
    v = (v | (v << 16)) & 0x0000FFFF0000FFFF
    v = (v | (v << 8)) & 0x00FF00FF00FF00FF
    v = (v | (v << 4)) & 0x0F0F0F0F0F0F0F0F
    v = (v | (v << 2)) & 0x3333333333333333
    v = (v | (v << 1)) & 0x5555555555555555
    return v


def _interleave(cols: list[torch.Tensor]) -> torch.Tensor:
    """Interleave bits; ``cols[0]`` gives the most significant bit of every group."""
    dim = len(cols)
    key = torch.zeros_like(cols[0])
    for i, c in enumerate(cols):
        key |= _spread(c, dim) << (dim - 1 - i)
    return key


def morton_keys(grid: torch.Tensor) -> torch.Tensor:
    """Morton (Z-order) keys of integer grid coordinates; axis 0 is the least significant bit.

    **Shapes**: ``(N, D)`` int64 -> ``(N,)`` int64.

    Examples
    --------
    >>> morton_keys(torch.tensor([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1]])).tolist()
    [1, 2, 4, 7]
    """
    dim = grid.shape[1]
    return _interleave([grid[:, a] for a in reversed(range(dim))])


def hilbert_keys(grid: torch.Tensor, bits: int, chunk: int = 1 << 20) -> torch.Tensor:
    """Hilbert keys of integer grid coordinates in ``[0, 2**bits)``.

    Skilling's transpose construction ("Programming the Hilbert curve", AIP Conf. Proc. 707,
    2004): undo the excess work of a Gray-coded traversal axis by axis from the top bit down,
    Gray-encode, then interleave. Vectorised over points; the Python loops run over bits and
    axes only (and over blocks of ``chunk`` points). Consecutive keys are face-neighbouring grid
    cells.

    **Shapes**: ``(N, D)`` int64 -> ``(N,)`` int64.
    """
    if grid.shape[0] > chunk:
        # Blocks keep the ~100 temporaries of the bit loop in cache (and, on CPU, out of mmap).
        return torch.cat([hilbert_keys(grid[i : i + chunk], bits, chunk) for i in range(0, grid.shape[0], chunk)])
    dim = grid.shape[1]
    # int32 halves the memory traffic of the bit loop (coordinates have at most 31 bits); masks
    # replace branches: `keep` is -1 where the tested bit is clear and 0 where it is set.
    x = [grid[:, a].to(torch.int32) for a in range(dim)]
    level = bits - 1
    while level > 0:
        q = 1 << level
        low = q - 1
        for i in range(dim):
            bit = (x[i] >> level) & 1
            if i == 0:
                x[0] ^= low & -bit
                continue
            t = (x[0] ^ x[i]) & (bit - 1) & low  # exchange low bits of x[0] and x[i] where clear
            x[0] ^= t | (low & -bit)  # invert low bits of x[0] where set
            x[i] ^= t
        level -= 1
    for i in range(1, dim):
        x[i] ^= x[i - 1]
    t = torch.zeros_like(x[0])
    level = bits - 1
    while level > 0:
        t ^= ((1 << level) - 1) & -((x[dim - 1] >> level) & 1)
        level -= 1
    return _interleave([(xi ^ t).to(torch.long) for xi in x])
