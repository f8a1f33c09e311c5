"""Concatenation along the sharded dimension: ``torch.cat`` of ShardTensors along the points.

The result holds every operand's rows in operand order, as the single-process ``cat`` of the
gathered tensors. **Its sharding:** rank r holds ``sum_j sizes_j[r]`` rows (the operands' sizes
added up rank by rank), so each rank keeps as many rows as it had and only the rows whose global
position falls on another rank move. Split-then-cat of one tensor (``torch.cat(x.split(k))``,
``torch.cat([x[:a], x[a:]])``) moves nothing. Operands may be sharded with different sizes; they
must all be ShardTensors on the same mesh axis (a plain tensor is refused: it is not known whether it
holds every row or this rank's). ``stack`` along the points then ``flatten`` needs no rule of its own:
``stack`` of equally sharded operands is local and the flatten keeps the sharding.

**Communication:** none when no row changes rank (decided from the sizes, alike on every rank);
otherwise one ``all_to_all`` (each rank sends only its moving rows; backward: one ``all_to_all``).
"""

from __future__ import annotations

import torch

from ... import comm
from ..._sizes import offsets_of
from ...errors import ShardingError
from .._tensor import ShardTensor, wrap_shard
from ._common import op_name, refuse


def _overlap(a0: int, a1: int, b0: int, b1: int) -> tuple[int, int]:
    return max(a0, b0), min(a1, b1)


def _check_specs(func, specs: list, d: int) -> None:
    """Every operand sharded like the first (mesh axis, dim ``d``, rank) and of its shape off dim ``d``."""
    ref = specs[0]
    nd = len(ref.global_shape)
    for s in specs[1:]:
        if s.mesh_id != ref.mesh_id or s.mesh_dim != ref.mesh_dim or s.dim != d or len(s.global_shape) != nd:
            raise ShardingError(f"[rank {ref.rank}] {op_name(func)}: the ShardTensors are sharded along different "
                                "dims or mesh axes")
        other = [n for i, n in enumerate(s.global_shape) if i != d]
        if other != [n for i, n in enumerate(ref.global_shape) if i != d]:
            raise RuntimeError(f"{op_name(func)}: sizes of tensors must match except in dimension {d} (got "
                               f"{tuple(ref.global_shape)} and {tuple(s.global_shape)})")


class _Pieces:
    """Where the result's rows come from: operand ``j``'s rows held by rank ``src`` that land on ``dst``."""

    def __init__(self, specs: list, sizes: list[int]):
        self.specs = specs
        self.out_off = offsets_of(sizes)
        self.base = offsets_of([s.num_global for s in specs])  # operand j's rows start at base[j] in the result

    def piece(self, j: int, src: int, dst: int) -> tuple[int, int]:
        """Global result rows ``[lo, hi)`` of operand j held by rank src that land on rank dst."""
        o = self.specs[j].offsets
        return _overlap(self.base[j] + o[src], self.base[j] + o[src + 1], self.out_off[dst], self.out_off[dst + 1])

    def moves(self, P: int) -> bool:
        return any(self.piece(j, q, s)[0] < self.piece(j, q, s)[1] for j in range(len(self.specs))
                   for q in range(P) for s in range(P) if q != s)

    def local_rows(self, locals_: list, rank: int, dst: int) -> list[torch.Tensor]:
        """This rank's rows bound for ``dst``, operand by operand."""
        out = []
        for j, x in enumerate(locals_):
            lo, hi = self.piece(j, rank, dst)
            if lo < hi:
                out.append(x.narrow(0, lo - self.base[j] - self.specs[j].offsets[rank], hi - lo))
        return out


def _exchange(pieces: _Pieces, locals_: list, nothing: torch.Tensor, rank: int, P: int, group) -> torch.Tensor:
    """The result rows of this rank, gathered from their holders in one ``all_to_all``, in global order."""
    send, send_sizes = [], []
    for dst in range(P):
        rows = pieces.local_rows(locals_, rank, dst)
        send += rows
        send_sizes.append(sum(x.shape[0] for x in rows))
    recv_sizes, starts = [], []  # received pieces arrive by source rank, then operand
    for src in range(P):
        spans = [pieces.piece(j, src, rank) for j in range(len(pieces.specs))]
        spans = [(lo, hi) for lo, hi in spans if lo < hi]
        starts += spans
        recv_sizes.append(sum(hi - lo for lo, hi in spans))
    buf = torch.cat(send, 0) if send else nothing
    got = comm.all_to_all(buf, send_sizes, recv_sizes, group)
    # reorder the pieces by global position
    at, order = 0, []
    for lo, hi in starts:
        order.append((lo, at, hi - lo))
        at += hi - lo
    index = [a + i for _, a, n in sorted(order) for i in range(n)]
    return got.index_select(0, torch.tensor(index, dtype=torch.long, device=got.device))


def cat_along_shard(func, tensors: list, d: int) -> ShardTensor:
    """``torch.cat(tensors, d)`` along the sharded dim ``d`` (see the module docstring)."""
    if not all(isinstance(t, ShardTensor) for t in tensors):
        raise refuse(func, "concatenating along the sharded dim needs every operand to be a ShardTensor",
                     "wrap a plain tensor with ShardTensor.from_local or ms.scatter first")
    specs = [t._spec for t in tensors]
    _check_specs(func, specs, d)
    ref = specs[0]
    P, rank = ref.num_ranks, ref.rank
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    sizes = [sum(s.sizes[r] for s in specs) for r in range(P)]
    pieces = _Pieces(specs, sizes)
    locals_ = [t.to_local().movedim(d, 0).to(dtype) for t in tensors]
    # no rows to send or keep: still in the graph of every operand, so this rank joins the backward
    nothing = torch.cat([x.narrow(0, 0, 0) for x in locals_], 0)
    if not pieces.moves(P):  # every rank already holds its result rows: concatenate locally, operand order
        out = torch.cat(pieces.local_rows(locals_, rank, rank) or [nothing], 0)
    else:
        out = _exchange(pieces, locals_, nothing, rank, P, ref.group)
    out = out.movedim(0, d)
    shape = list(ref.global_shape)
    shape[d] = sum(sizes)
    return wrap_shard(out, ref.resized(d, sizes, shape))
