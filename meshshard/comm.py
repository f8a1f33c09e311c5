"""Differentiable collectives and a collective counter.

Every collective meshshard issues goes through this module, as an ``autograd.Function`` with a
documented backward, and is recorded by any active :class:`CommCounter`.

Gradient convention (why ``all_reduce``'s backward is an all-reduce)
--------------------------------------------------------------------
A *sharded* tensor's gradient is exact on the rank that owns each element. A *replicated* tensor
(the same value on every rank of the group, e.g. the result of a reduction over the sharded
dimension, or a parameter) carries a **partial** gradient on each rank: the true gradient is the
sum over the group. This is what falls out naturally when a replicated value (a weight, a slice
token) is consumed by local work on each rank's shard, and it makes every parameter's gradient
partial, so :func:`meshshard.nn.sync_gradients` is one uniform sum. Consequences:

* ``all_reduce`` (sharded partial sums -> replicated): backward turns the partial gradient of the
  replicated result into the true gradient of every rank's input with another sum all-reduce.
* A replicated *loss* must be seeded with ``1 / P`` on each rank so the seeds sum to one;
  reductions return a :class:`~meshshard.tensor.ReplicatedTensor`, and every way into autograd
  (``backward()``, ``backward(g)``, ``torch.autograd.backward``, ``torch.autograd.grad``) seeds it so;
  ``torch.autograd.grad`` also sums the (partial) gradients of non-sharded inputs over the group.
"""

from __future__ import annotations

import math
import os
import pickle
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from . import faults

__all__ = [
    "Agreement",
    "CommCounter",
    "agree",
    "all_reduce",
    "all_reduce_max",
    "all_reduce_min",
    "all_gather_object",
    "barrier",
    "all_gather",
    "all_gather_object_sizes",
    "all_reduce_",
    "all_to_all",
    "check_split_sizes",
    "gather_uneven",
    "group_device",
    "group_rank_and_size",
    "ring_shift",
    "validate_enabled",
]

_ACTIVE: list[CommCounter] = []
_LOCK = threading.Lock()


@dataclass(eq=False)
class CommCounter:
    """Count the collectives (and bytes sent by this rank) issued inside a ``with`` block.

    >>> with CommCounter() as cc:        # doctest: +SKIP
    ...     y = x.mean(dim=0)
    >>> cc.counts["all_reduce"]          # doctest: +SKIP
    1

    Not run as a doctest: ``x`` is a ``ShardTensor``, which needs a process group.

    ``counts`` maps a collective's name (``all_reduce``, ``all_to_all``, ``all_gather``) to how
    many times it ran, forward and backward alike; ``bytes_sent`` maps it to the bytes this rank
    put on the wire (an all-reduce counts its buffer once). Counters compare by identity
    (``eq=False``), so nested counters with equal counts leave in the right order.
    """

    counts: Counter = field(default_factory=Counter)
    bytes_sent: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __enter__(self) -> CommCounter:
        with _LOCK:
            _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        with _LOCK:
            _ACTIVE.remove(self)


def validate_enabled() -> bool:
    """Whether opt-in cross-rank consistency checks run (``MESHSHARD_VALIDATE=1``).

    They cost one small collective each: sharding sizes in ``ShardTensor.from_local`` and the
    split sizes of every :func:`all_to_all` (hence every halo plan and halo exchange).
    """
    return os.environ.get("MESHSHARD_VALIDATE", "0") not in ("", "0", "false", "False")


def _record(name: str, nbytes: int) -> None:
    if torch.compiler.is_dynamo_compiling():  # a compiled step's collectives are graph ops, not counted here
        return
    for counter in _ACTIVE:
        counter.counts[name] += 1
        counter.bytes_sent[name] += int(nbytes)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _world(group: dist.ProcessGroup | None) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def _call(name: str, group: dist.ProcessGroup | None, collective, *args, **kwargs):
    """Run ``collective(*args, group=group, **kwargs)``; name the culprit if it fails.

    A backend failure (a peer died, raised, or is stuck past the process-group timeout) becomes a
    :class:`~meshshard.errors.CollectiveError` naming this rank, ``name``, where it was issued and
    the rank that failed first (see :mod:`meshshard.faults`). A ``ValueError``/``TypeError`` is
    this rank's own bad argument: it is reported as this rank's failure and re-raised unchanged.
    """
    if torch.compiler.is_dynamo_compiling():  # traced: dynamo turns ``dist.*`` into functional collectives
        return collective(*args, group=group, **kwargs)
    try:
        out = collective(*args, group=group, **kwargs)
    except (ValueError, TypeError) as exc:
        faults.report_failure(exc, name)
        raise
    except Exception as exc:
        raise faults.collective_failed(name, group, exc) from exc
    faults.retract_stale_report()  # this rank may have failed earlier, yet the group moved on
    return out


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        out = tensor.clone(memory_format=torch.contiguous_format)
        _record("all_reduce", _nbytes(out))
        _call("all_reduce", group, dist.all_reduce, out, op=dist.ReduceOp.SUM)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # The output is replicated, so its gradient is partial on each rank (see module docstring).
        out = grad.clone(memory_format=torch.contiguous_format)
        _record("all_reduce", _nbytes(out))
        _call("all_reduce", ctx.group, dist.all_reduce, out, op=dist.ReduceOp.SUM)
        return out, None


def all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Differentiable sum all-reduce: every rank gets ``sum_r tensor_r`` (a new tensor).

    **Communication:** one ``all_reduce`` of ``tensor.nbytes`` forward; one of the same size in
    backward. With a group of one rank (or no process group) it is the identity and sends nothing.
    """
    if _world(group) == 1:
        return tensor
    return _AllReduceSum.apply(tensor, group)


def all_reduce_max(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Element-wise max over ranks, **not** differentiable (used for shifts and arg-reductions)."""
    return _all_reduce_detached(tensor, group, dist.ReduceOp.MAX)


def _all_reduce_detached(tensor: torch.Tensor, group: dist.ProcessGroup | None, op: dist.ReduceOp) -> torch.Tensor:
    """A detached copy of ``tensor`` all-reduced with ``op`` (one ``all_reduce``; nothing with one rank)."""
    out = tensor.detach().clone(memory_format=torch.contiguous_format)
    if _world(group) == 1:
        return out
    _record("all_reduce", _nbytes(out))
    _call("all_reduce", group, dist.all_reduce, out, op=op)
    return out


def _all_to_all_raw(
    tensor: torch.Tensor,
    send_sizes: Sequence[int],
    recv_sizes: Sequence[int],
    group: dist.ProcessGroup | None,
) -> torch.Tensor:
    """``all_to_all_single`` along dim 0 with uneven split sizes (gloo and NCCL both accept it).

    Rows travel as raw bytes (a free view), so every dtype moves, including those gloo does not
    reduce (bool, int16, complex).
    """
    tensor = tensor.contiguous()
    out = tensor.new_empty((int(sum(recv_sizes)), *tensor.shape[1:]))
    row_bytes = tensor.element_size() * math.prod(tensor.shape[1:])
    _record("all_to_all", row_bytes * int(sum(send_sizes)))
    recv, send = list(map(int, recv_sizes)), list(map(int, send_sizes))
    if tensor.dtype not in (torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8):
        width = math.prod(tensor.shape[1:])
        if width == 0:  # rows of no bytes (the same trailing shape on every rank): nothing to move
            return out
        row = width * tensor.element_size()
        flat = tensor.reshape(-1)
        if flat.stride(0) != 1:  # an empty or one-element tensor may carry any stride; view(uint8) needs 1
            flat = flat.clone(memory_format=torch.contiguous_format)
        send_bytes = flat.view(torch.uint8).reshape(tensor.shape[0], row)
        out_bytes = out.reshape(-1).view(torch.uint8).reshape(out.shape[0], row)
        _call("all_to_all", group, dist.all_to_all_single, out_bytes, send_bytes, recv, send)
        return out
    _call("all_to_all", group, dist.all_to_all_single, out, tensor, recv, send)
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, send_sizes, recv_sizes, group):
        ctx.send_sizes, ctx.recv_sizes, ctx.group = send_sizes, recv_sizes, group
        return _all_to_all_raw(tensor, send_sizes, recv_sizes, group)

    @staticmethod
    def backward(ctx, grad):
        # Rows went r -> s in forward; their gradients go s -> r.
        return _all_to_all_raw(grad, ctx.recv_sizes, ctx.send_sizes, ctx.group), None, None, None


def all_to_all(
    tensor: torch.Tensor,
    send_sizes: Sequence[int],
    recv_sizes: Sequence[int],
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Differentiable uneven all-to-all along dim 0.

    Rank r sends rows ``tensor[sum(send_sizes[:s]) : sum(send_sizes[:s+1])]`` to rank s and
    receives ``recv_sizes[s]`` rows from rank s, concatenated in rank order.

    **Shapes:** ``tensor`` ``(sum(send_sizes), *C)`` -> ``(sum(recv_sizes), *C)``.

    **Communication:** one ``all_to_all_single`` forward (this rank sends
    ``sum(send_sizes) * row_bytes``, its own block included), one in backward with the roles of
    the sizes swapped. Backward only routes gradients; rows sent to several ranks have their
    gradients added by the autograd of whatever gathered them (e.g. ``index_select``).
    """
    if tensor.shape[0] != sum(send_sizes):
        exc = ValueError(f"all_to_all: tensor has {tensor.shape[0]} rows but send_sizes sum to {sum(send_sizes)}")
        faults.report_failure(exc, "all_to_all")
        raise exc
    if _world(group) == 1:
        return tensor
    if validate_enabled():
        check_split_sizes(send_sizes, recv_sizes, group)
    return _AllToAll.apply(tensor, tuple(map(int, send_sizes)), tuple(map(int, recv_sizes)), group)


@dataclass(frozen=True)
class Agreement:
    """What :func:`agree` found: every rank's verdict and payload, identical on every rank.

    ``errors[i]`` is the message of the ``i``-th rank of the group (``None`` if it found no problem);
    ``payloads`` is a ``(P, k)`` int64 tensor (CPU) of every rank's ``payload``; ``ranks`` are the
    global ranks of the group, in group order.
    """

    errors: tuple[str | None, ...]
    payloads: torch.Tensor
    ranks: tuple[int, ...]

    @property
    def failed(self) -> tuple[int, ...]:
        """The global ranks that reported a problem."""
        return tuple(r for r, e in zip(self.ranks, self.errors) if e is not None)

    def first_error(self) -> str | None:
        """``"[rank r] message"`` of the first rank that reported a problem, or ``None``."""
        for rank, error in zip(self.ranks, self.errors):
            if error is not None:
                return f"[rank {rank}] {error}"
        return None

    def message(self, what: str = "") -> str:
        """One line naming every rank that reported a problem and what it said (the same on every rank)."""
        found = "; ".join(f"rank {r}: {e}" for r, e in zip(self.ranks, self.errors) if e is not None)
        return f"{what or 'a check failed'} on rank(s) {list(self.failed)}: {found}"


def agree(
    local_error: str | None,
    group: dist.ProcessGroup | None = None,
    *,
    payload: Sequence[int] = (),
    error_type: type[Exception] | None = None,
    what: str = "",
) -> Agreement:
    """Share every rank's local verdict (and a few integers) so that all ranks decide alike.

    The one home of cross-rank agreement: a check that looks at this rank's own data passes its
    finding here (``None`` when all is well, else a one-line message) before anyone raises, so a
    problem found on one rank is raised on **every** rank and no rank is left waiting in a later
    collective. ``payload`` (the same length on every rank) travels in the same collective, for
    checks that compare ranks' metadata (sizes, shapes) on top of their own verdicts.

    With ``error_type`` given, raises ``error_type("[rank me] <what> on rank(s) [...]: rank r:
    <message>; ...")`` on every rank when any rank reported a problem (only the ``[rank me]`` prefix
    differs between ranks); otherwise returns the :class:`Agreement` for the caller to decide.

    **Communication:** one ``all_gather`` of ``len(payload) + 2`` int64 per rank; when some rank
    reported a problem, a second ``all_gather`` of the longest message's bytes. Nothing with one rank
    (or no process group).
    """
    world = _world(group)
    ranks = tuple(dist.get_process_group_ranks(group)) if group is not None and world > 1 else tuple(range(world))
    raw = b"" if local_error is None else str(local_error).encode("utf-8", "replace")
    mine = torch.tensor([int(local_error is not None), len(raw), *map(int, payload)], dtype=torch.long)
    if world == 1:
        errors: tuple[str | None, ...] = (None if local_error is None else str(local_error),)
        table = mine[None]
    else:
        device = group_device(group)
        table = all_gather(mine.to(device), group).cpu()
        errors = (None,) * world
        if bool(table[:, 0].any()):
            longest = int(table[:, 1].max())
            buf = torch.zeros(longest, dtype=torch.uint8)
            buf[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else buf[:0]
            texts = all_gather(buf.to(device), group).cpu()
            errors = tuple(
                bytes(texts[r, : int(table[r, 1])].tolist()).decode("utf-8", "replace") if int(table[r, 0]) else None
                for r in range(world)
            )
    out = Agreement(errors, table[:, 2:], ranks)
    if error_type is not None and out.failed:
        me = dist.get_rank() if dist.is_initialized() else 0
        raise error_type(f"[rank {me}] {out.message(what)}")
    return out


def check_split_sizes(
    send_sizes: Sequence[int],
    recv_sizes: Sequence[int],
    group: dist.ProcessGroup | None = None,
    *,
    local_error: str | None = None,
) -> None:
    """Check that what every rank sends each peer is what that peer expects to receive.

    An uneven all-to-all whose split sizes disagree between ranks corrupts data or hangs; this
    check turns it into a :class:`~meshshard.errors.ShardingError` raised on **every** rank, naming
    each disagreeing pair. Run by :func:`all_to_all` under ``MESHSHARD_VALIDATE=1``.

    ``local_error``: a problem this rank found on its own (e.g. an inconsistent halo plan); it is
    shared in the same collective (:func:`agree`), so every rank raises, naming the ranks that
    reported one and what each found.

    **Communication:** one ``all_gather`` of ``2 P + 2`` int64 per rank (a second one, of the
    messages, when some rank reported a ``local_error``).
    """
    from .errors import ShardingError

    world = _world(group)
    if len(send_sizes) != world or len(recv_sizes) != world:
        raise ValueError(
            f"send_sizes and recv_sizes must have one entry per rank ({world}) "
            f"(got {len(send_sizes)} and {len(recv_sizes)})"
        )
    found = agree(local_error, group, payload=[*map(int, send_sizes), *map(int, recv_sizes)],
                  error_type=ShardingError, what="inconsistent")
    table, ranks = found.payloads, found.ranks
    name = ranks.__getitem__
    me = dist.get_rank() if dist.is_initialized() else 0
    send, recv = table[:, :world], table[:, world:]  # send[r, s]: r sends s; recv[s, r]: s expects from r
    bad = (send != recv.t()).nonzero().tolist()
    if bad:
        pairs = "; ".join(
            f"rank {name(r)} sends {int(send[r, s])} rows to rank {name(s)}, which expects {int(recv[s, r])}"
            for r, s in bad[:8]
        )
        more = f" (and {len(bad) - 8} more)" if len(bad) > 8 else ""
        raise ShardingError(f"[rank {me}] all_to_all split sizes disagree between ranks: {pairs}{more}")


class _GatherUneven(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local, sizes, dim, group):
        ctx.sizes, ctx.dim, ctx.group = sizes, dim, group
        rank = dist.get_rank(group)
        moved = local.movedim(dim, 0)
        # Each rank sends its whole shard to every rank: gloo rejects uneven all_gather.
        send = moved.repeat(len(sizes), *([1] * (moved.dim() - 1))) if moved.shape[0] else moved
        send_sizes = [sizes[rank]] * len(sizes)
        full = _all_to_all_raw(send, send_sizes, sizes, group)
        return full.movedim(0, dim)

    @staticmethod
    def backward(ctx, grad):
        # The full tensor is replicated: its gradient is partial on every rank. The true gradient
        # of this rank's shard is the sum over ranks of their partial gradients on its rows: a
        # reduce-scatter, done as an all-to-all followed by a local sum.
        sizes, group = ctx.sizes, ctx.group
        rank = dist.get_rank(group)
        moved = grad.movedim(ctx.dim, 0).contiguous()
        recv_sizes = [sizes[rank]] * len(sizes)
        parts = _all_to_all_raw(moved, sizes, recv_sizes, group)
        local = parts.reshape(len(sizes), sizes[rank], *moved.shape[1:]).sum(0)
        return local.movedim(0, ctx.dim), None, None, None


def gather_uneven(
    local: torch.Tensor, sizes: Sequence[int], dim: int = 0, group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """Concatenate every rank's shard along ``dim`` on every rank (uneven sizes allowed).

    **Communication:** one ``all_to_all_single`` forward (this rank sends its shard to each of
    the P ranks: ``P * N_local * row_bytes``); one in backward (a reduce-scatter of the partial
    gradients: ``N_global * row_bytes``).
    """
    sizes = tuple(int(s) for s in sizes)
    if _world(group) == 1:
        return local
    return _GatherUneven.apply(local, sizes, dim, group)


def all_gather_object_sizes(n: int, group: dist.ProcessGroup | None = None, device=None) -> tuple[int, ...]:
    """All-gather one integer per rank (e.g. local lengths); one small ``all_gather``."""
    world = _world(group)
    if world == 1:
        return (int(n),)
    t = torch.tensor([int(n)], dtype=torch.long, device=device)
    out = [torch.empty_like(t) for _ in range(world)]
    _record("all_gather", _nbytes(t))
    _call("all_gather", group, dist.all_gather, out, t)
    return tuple(int(o.item()) for o in out)


def all_gather(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Stack every rank's equally shaped ``tensor`` along a new dim 0 (**not** differentiable).

    **Shapes:** ``(*S)`` -> ``(P, *S)``.

    **Communication:** one ``all_gather`` of ``tensor.nbytes`` per rank; nothing with one rank.
    """
    world = _world(group)
    t = tensor.detach().contiguous()
    if world == 1:
        return t[None].clone()
    out = [torch.empty_like(t) for _ in range(world)]
    _record("all_gather", _nbytes(t))
    _call("all_gather", group, dist.all_gather, out, t)
    return torch.stack(out)


def all_reduce_(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """In-place sum all-reduce of a plain tensor (**not** differentiable; e.g. gradient buffers).

    **Communication:** one ``all_reduce`` of ``tensor.nbytes``; nothing with one rank.
    """
    if _world(group) == 1:
        return tensor
    _record("all_reduce", _nbytes(tensor))
    _call("all_reduce", group, dist.all_reduce, tensor)
    return tensor


class RingShift:
    """A started :func:`ring_shift`; :meth:`wait` returns the received tensor."""

    def __init__(self, works: list, recv: torch.Tensor, group: dist.ProcessGroup | None, send=None):
        # ``send`` is held until the transfer is done: the caller may drop its own reference meanwhile
        self._works, self._recv, self._group, self._send = works, recv, group, send

    def wait(self) -> torch.Tensor:
        for work in self._works:
            try:
                work.wait()
            except Exception as exc:
                raise faults.collective_failed("ring_shift", self._group, exc) from exc
        self._works, self._send = [], None
        return self._recv


def _ring_all_to_all(tensor: torch.Tensor, recv: torch.Tensor, rank: int, world: int,
                     group: dist.ProcessGroup | None) -> torch.Tensor:
    """One ring step as an ``all_to_all_single`` (traced: dynamo makes it a functional collective, which
    ``isend``/``irecv`` cannot be): rows of dim ``-2`` go only to ``rank + 1`` and come only from ``rank - 1``.
    The split sizes are this rank's shapes, which every rank derives from the same metadata."""
    send = tensor.movedim(-2, 0).contiguous()
    out = recv.movedim(-2, 0).contiguous()
    send_splits, recv_splits = [0] * world, [0] * world
    send_splits[(rank + 1) % world] += send.shape[0]
    recv_splits[(rank - 1) % world] += out.shape[0]
    _call("ring_shift", group, dist.all_to_all_single, out, send, recv_splits, send_splits)
    return out.movedim(0, -2)


def ring_shift(
    tensor: torch.Tensor,
    recv_shape: Sequence[int],
    group: dist.ProcessGroup | None = None,
    *,
    tag: int = 0,
) -> RingShift:
    """Start passing ``tensor`` one step around the ring of ``group`` (**not** differentiable).

    Rank ``r`` sends ``tensor`` to rank ``r + 1`` and receives a tensor of ``recv_shape`` (same
    dtype) from rank ``r - 1`` (indices modulo the group size), with non-blocking ``isend``/``irecv``
    so that the caller can compute while the block travels; :meth:`RingShift.wait` returns the
    received tensor. An empty tensor is neither sent nor received: both ends know the sizes (every
    rank derives them from the same metadata), so they skip alike. ``tag`` keeps two shifts in
    flight at once apart (e.g. keys/values and their gradient accumulators in ring attention).
    Used inside autograd Functions that route their gradients themselves. Traced by dynamo
    (``torch.compile``), which cannot compile ``isend``/``irecv``, the step is one
    ``all_to_all_single`` with nonzero splits only to ``r + 1`` and from ``r - 1`` (a functional
    collective in the graph; :meth:`RingShift.wait` returns its result).

    **Communication:** one ``isend`` of ``tensor.nbytes`` and one ``irecv`` (counted once as
    ``ring_shift``), or traced one ``all_to_all_single`` of the same bytes; nothing with one rank.
    """
    world = _world(group)
    recv = tensor.new_empty(tuple(int(s) for s in recv_shape))
    if world == 1:
        recv.copy_(tensor)
        return RingShift([], recv, group)
    rank = dist.get_rank(group)
    if torch.compiler.is_dynamo_compiling():
        return RingShift([], _ring_all_to_all(tensor, recv, rank, world, group), group)
    send = tensor.contiguous()
    _record("ring_shift", _nbytes(send))
    works = []
    if recv.numel():
        works.append(_call("ring_shift", group, dist.irecv, recv, group_src=(rank - 1) % world, tag=tag))
    if send.numel():
        works.append(_call("ring_shift", group, dist.isend, send, group_dst=(rank + 1) % world, tag=tag))
    return RingShift(works, recv, group, send)


def all_reduce_min(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Element-wise min over ranks, **not** differentiable (e.g. "did every rank succeed?" flags).

    **Communication:** one ``all_reduce`` of ``tensor.nbytes``; nothing with one rank.
    """
    return _all_reduce_detached(tensor, group, dist.ReduceOp.MIN)


def all_gather_object(obj: object, group: dist.ProcessGroup | None = None) -> list:
    """Every rank's picklable ``obj``, in rank order (for small metadata, not tensors on the hot path).

    **Communication:** one ``all_gather_object`` (recorded with the pickled size of ``obj``); nothing
    with one rank.
    """
    world = _world(group)
    if world == 1:
        return [obj]
    out: list = [None] * world
    _record("all_gather_object", len(pickle.dumps(obj)))
    _call("all_gather_object", group, dist.all_gather_object, out, obj)
    return out


def barrier(group: dist.ProcessGroup | None = None) -> None:
    """Wait until every rank of ``group`` has reached this call.

    **Communication:** one ``barrier``; nothing with one rank (or no process group).
    """
    if _world(group) == 1:
        return
    _record("barrier", 0)
    _call("barrier", group, dist.barrier)


def group_rank_and_size(group: dist.ProcessGroup | None = None) -> tuple[int, int] | None:
    """This process's rank in ``group`` and the size of ``group``; ``None`` without a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.get_rank(group), dist.get_world_size(group)


def group_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where a collective over ``group`` needs its tensors: the current CUDA device under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
