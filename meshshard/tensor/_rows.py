"""The row halo along the sharded dimension: each rank fetches the global rows it needs from their owners.

Structured grids sharded along H, W or D and serialized point orders (a space-filling curve) need
*neighbouring rows* along the sharded dim: a convolution's receptive field, a pooling window, the rows a
``reflect`` pad mirrors, the source rows of an interpolation, a window of 64 points that straddles a cut.
Every such op here is described by **which global rows each rank needs** — a function of the spec
(every rank's sizes) and the op's arguments alone, so every rank computes every rank's needs alike and
no request has to travel: one ``all_to_all_single`` moves exactly the rows that change hands.

* :func:`fetch_intervals` — the mechanism: rank ``r`` receives the global rows of ``wanted[r]`` (a
  list of half-open intervals, in the order it lists them), its own rows taken locally, the others
  from the ranks that own them (several ranks when shards are shorter than the reach, empty ranks
  included).
* :func:`row_halo` — ``before`` rows before and ``after`` rows after each rank's shard (clipped at
  the global ends; the two widths may differ).
* :func:`window_rows` — the global rows ``[lo_r, hi_r)`` with the rows outside ``[0, N)`` filled with a
  constant (zero padding of a convolution, ``-inf`` of a max pool).
* :func:`sizes_by_anchor` — how the rows of a result are owned: output row ``j`` belongs to the rank
  that owns its *anchor* input row (clamped into ``[0, N)``). Every rule here uses a non-decreasing
  anchor, so each rank's result rows are contiguous and in global order, and the result's sharding
  sizes follow from global shape arithmetic, identical on every rank.

Differentiable: the exchange is :func:`meshshard.comm.all_to_all`, whose backward sends each halo
row's gradient back to its owner, where autograd adds it to the gradient of the owned row (a row
fetched by several ranks collects all their contributions).

**Communication:** one ``all_to_all_single`` forward (this rank sends each peer the rows of its shard
that the peer needs and does not own; nothing is sent, and no collective runs, when no rank needs a
row it does not own — decided from the spec on every rank alike) and one backward (the same bytes).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

import torch

from .. import comm
from .._sizes import offsets_of, owner_of
from ._spec import ShardSpec

__all__ = ["fetch_intervals", "row_halo", "sizes_by_anchor", "window_rows"]

Interval = tuple[int, int]


def _bisect_right(seq: Sequence[int], x: int) -> int:
    """``bisect.bisect_right``; in Python when traced (dynamo cannot trace the C builtin)."""
    if not torch.compiler.is_dynamo_compiling():
        return bisect.bisect_right(seq, x)
    lo, hi = 0, len(seq)
    while lo < hi:
        mid = (lo + hi) // 2
        if x < seq[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _pieces(spec: ShardSpec, intervals: Sequence[Interval]) -> list[tuple[int, int, int]]:
    """``(owner, lo, hi)`` for every part of ``intervals`` owned by one rank, in interval order."""
    off = spec.offsets
    out = []
    for a, b in intervals:
        if a >= b:
            continue
        s = max(_bisect_right(off, a) - 1, 0)
        while s < spec.num_ranks and off[s] < b:
            lo, hi = max(a, off[s]), min(b, off[s + 1])
            if lo < hi:
                out.append((s, lo, hi))
            s += 1
    return out


def fetch_intervals(local: torch.Tensor, spec: ShardSpec, wanted: Sequence[Sequence[Interval]]) -> torch.Tensor:
    """This rank's rows of ``wanted[rank]`` along ``spec.dim``, concatenated in the order listed.

    ``wanted[r]`` lists half-open intervals of global rows inside ``[0, N_global)`` for every rank
    ``r``; it must be computed identically on every rank (from the spec and the op's arguments).

    **Shapes:** ``local`` ``(..., N_local, ...)`` -> ``(..., sum of interval lengths, ...)``.

    **Communication:** one ``all_to_all_single`` (only rows owned by another rank travel); none when no
    rank needs a row it does not own.
    """
    n = spec.num_global
    for r, intervals in enumerate(wanted):
        for a, b in intervals:
            if not 0 <= a <= b <= n and a < b:
                raise ValueError(f"internal: rank {r} asks for rows [{a}, {b}) outside [0, {n})")
    me, off, d = spec.rank, spec.offsets, spec.dim
    pieces = [_pieces(spec, w) for w in wanted]
    moved = local.movedim(d, 0)
    if not any(s != r for r, p in enumerate(pieces) for s, _, _ in p):
        parts = [moved[lo - off[me] : hi - off[me]] for _, lo, hi in pieces[me]]
        return (torch.cat(parts) if len(parts) != 1 else parts[0]).movedim(0, d) if parts else moved[:0].movedim(0, d)
    send_parts, send_sizes = [], []
    for r, p in enumerate(pieces):
        count = 0
        if r != me:
            for s, lo, hi in p:
                if s == me:
                    send_parts.append(moved[lo - off[me] : hi - off[me]])
                    count += hi - lo
        send_sizes.append(count)
    recv_sizes = [0 if s == me else sum(hi - lo for t, lo, hi in pieces[me] if t == s) for s in range(spec.num_ranks)]
    send = torch.cat(send_parts) if send_parts else moved[:0]
    recv = comm.all_to_all(send, send_sizes, recv_sizes, spec.group)
    cursor = list(offsets_of(recv_sizes)[:-1])
    parts = []
    for s, lo, hi in pieces[me]:
        if s == me:
            parts.append(moved[lo - off[me] : hi - off[me]])
        else:
            parts.append(recv[cursor[s] : cursor[s] + hi - lo])
            cursor[s] += hi - lo
    if not sum(recv_sizes):  # keep the exchange in the graph: its backward must run on every rank
        parts.append(recv[:0])
    out = torch.cat(parts) if len(parts) != 1 else parts[0]
    return out.movedim(0, d)


def window_rows(
    local: torch.Tensor, spec: ShardSpec, lo: Sequence[int], hi: Sequence[int], fill: float | None = 0.0
) -> torch.Tensor:
    """Global rows ``[lo[rank], hi[rank])`` along ``spec.dim`` (every rank's window given, alike on all ranks).

    Rows before 0 and from ``N_global`` on are ``fill`` (``None``: the window must lie inside
    ``[0, N_global)``). The filled rows are built from the local shard, so the result stays in the
    autograd graph even when it holds no real row. Callers must keep the result in the graph of what they
    return (on every rank): the exchange's backward is a collective.

    **Communication:** as :func:`fetch_intervals`.
    """
    n = spec.num_global
    wanted = [[(max(a, 0), min(b, n))] if max(a, 0) < min(b, n) else [] for a, b in zip(lo, hi)]
    mid = fetch_intervals(local, spec, wanted)
    a, b = lo[spec.rank], hi[spec.rank]
    top = max(0, min(b, 0) - a)
    bottom = max(0, b - max(a, n))
    if not top and not bottom:
        return mid
    if fill is None:
        raise ValueError(f"internal: window [{a}, {b}) leaves [0, {n}) and has no fill")
    d = spec.dim

    def pad(k: int) -> torch.Tensor:
        shape = list(local.shape)
        shape[d] = k
        return local.new_full(shape, fill)

    parts = ([pad(top)] if top else []) + [mid] + ([pad(bottom)] if bottom else [])
    return torch.cat(parts, d)


def row_halo(local: torch.Tensor, spec: ShardSpec, before: int, after: int) -> tuple[torch.Tensor, int, int]:
    """This rank's shard with up to ``before`` rows before it and ``after`` rows after it (clipped at the ends).

    Returns ``(rows, num_before, num_after)``: ``rows`` holds the global rows
    ``[offset - num_before, offset + N_local + num_after)``. A shard shorter than the widths gets rows
    from several ranks; an empty rank gets the rows around its (empty) place in the global order.

    **Communication:** as :func:`fetch_intervals`.
    """
    if before < 0 or after < 0:
        raise ValueError(f"row_halo widths must be non-negative (got before={before}, after={after})")
    n, off = spec.num_global, spec.offsets
    lo = [max(off[r] - before, 0) for r in range(spec.num_ranks)]
    hi = [min(off[r + 1] + after, n) for r in range(spec.num_ranks)]
    rows = window_rows(local, spec, lo, hi, None)
    me = spec.rank
    return rows, off[me] - lo[me], hi[me] - off[me + 1]


def sizes_by_anchor(spec: ShardSpec, num_out: int, anchor: Callable[[torch.Tensor], torch.Tensor]) -> tuple[int, ...]:
    """Per-rank counts of ``num_out`` result rows, row ``j`` owned by the owner of input row ``anchor(j)``.

    ``anchor`` maps a 1-D int64 tensor of result rows to input rows (non-decreasing; clamped into
    ``[0, N_global)``). With no input rows, every result row goes to rank 0.
    """
    p = spec.num_ranks
    if num_out == 0:
        return (0,) * p
    if spec.num_global == 0:
        return (num_out,) + (0,) * (p - 1)
    if torch.compiler.is_dynamo_compiling():  # traced: the same counts from Python ints (no data-dependent graph)
        return _sizes_by_bisect(spec, num_out, anchor)
    j = torch.arange(num_out, dtype=torch.long)
    rows = anchor(j).clamp(0, spec.num_global - 1)
    if num_out > 1 and bool((rows[1:] < rows[:-1]).any()):
        raise ValueError("internal: a result's anchor rows must be non-decreasing")
    owner = owner_of(rows, spec.offsets)
    return tuple(int(c) for c in torch.bincount(owner, minlength=p).tolist())


def _sizes_by_bisect(spec: ShardSpec, num_out: int, anchor: Callable) -> tuple[int, ...]:
    """:func:`sizes_by_anchor` by bisection on the non-decreasing ``anchor`` applied to ints: ``O(P log num_out)``."""

    def first_at_least(bound: int) -> int:  # the first j whose (clamped) anchor row is >= bound
        lo, hi = 0, num_out
        while lo < hi:
            mid = (lo + hi) // 2
            if min(max(anchor(mid), 0), spec.num_global - 1) >= bound:
                hi = mid
            else:
                lo = mid + 1
        return lo

    off = spec.offsets
    starts = [0] + [first_at_least(off[r]) for r in range(1, spec.num_ranks)] + [num_out]
    return tuple([starts[r + 1] - starts[r] for r in range(spec.num_ranks)])
