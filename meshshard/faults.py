"""Fault reports: when a collective fails, say which rank failed first and in which operation.

Without help, a rank whose peer raised or died only sees the backend's view (``Connection closed
by peer [127.0.0.1]:19356`` or ``Timed out waiting 300000ms for recv``), which names neither the
peer nor what it was doing. meshshard closes the gap with small notes in the default
process-group store (the rendezvous key-value store every rank already shares):

* **Culprit notes** ``meshshard/failure/<rank>``: a rank that raises inside a sharded op (any
  exception escaping ``ShardTensor.__torch_function__``), inside a :mod:`meshshard.comm`
  collective before it communicates (bad arguments), or inside a :func:`report_failures` block,
  writes ``"<op>: <ExceptionType>: <message>"`` there before the exception propagates.
* **Victim notes** ``meshshard/victim/<rank>``: a rank whose collective fails in the backend writes
  the collective it was in, then waits briefly (``MESHSHARD_FAULT_WAIT`` seconds, default 1) for
  the notes of every other rank of the group, and raises a :class:`~meshshard.errors.CollectiveError`::

      [rank 1] all_reduce (in torch.Tensor.mean, in PhysicsAttention.forward) failed:
      rank 2 failed first: ValueError: boom (backend error: RuntimeError: Connection closed by peer ...)

  A rank with neither note after the wait is named by elimination: ``rank 2 (no report; it may
  have died)``. When every rank reports a victim note (all timed out), the message lists the
  collective each one was in, which exposes mismatched collectives.

Timeouts: a collective blocked on a rank that is alive but stuck fails after the process-group
timeout (``meshshard.init_mesh(timeout=...)``, default ``MESHSHARD_TIMEOUT`` or 300 s); a dead
rank's peers fail as soon as the backend sees the connection drop (immediately with gloo).

Where: the message names the op being run (set by the dispatcher), the library function that issued the
collective (:func:`entry`: ``HaloPlan.build``, ``ball_query``, ``slice_tokens`` ...) and the layer
(:func:`layer`: ``PhysicsAttention.forward``, ``Transolver.forward`` ...), innermost first. All three
come from context variables; no stack frame is inspected. Decorate a ``forward`` of your own with
:func:`layer` to have it named too.

On the success path this costs one boolean test per collective and one context-variable set and reset
per sharded op, library entry and layer call: notes are written only when an
exception is already propagating. A rank that reported a failure and then
completes a collective retracts its note (the group moved on, e.g. the exception was caught on
every rank), so stale notes do not blame a rank for a later, unrelated failure.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from ._op_names import op_name
from .errors import CollectiveError

__all__ = [
    "FAILURE_PREFIX",
    "VICTIM_PREFIX",
    "clear_reports",
    "entry",
    "fault_wait_s",
    "install_excepthook",
    "layer",
    "report_failure",
    "running_op",
    "report_failures",
    "retract_stale_report",
]

FAILURE_PREFIX = "meshshard/failure/"
VICTIM_PREFIX = "meshshard/victim/"
_MARK = "_meshshard_reported"
_MAX_MESSAGE = 400

#: True while this process has a culprit note in the store (retracted by the next good collective).
_REPORTED = False

#: The torch op a sharded op entry (``ShardTensor.__torch_function__``) is running, innermost first: a
#: failing collective's message names it. Set by :func:`enter_op`, or by :func:`running_op` for entries of
#: one's own.
_CURRENT_OP: contextvars.ContextVar[Any] = contextvars.ContextVar("meshshard_current_op", default=None)

#: The innermost library function issuing collectives (:func:`entry`) and layer (:func:`layer`) being run.
_CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("meshshard_caller", default=None)
_LAYER: contextvars.ContextVar[str | None] = contextvars.ContextVar("meshshard_layer", default=None)

_F = TypeVar("_F", bound=Callable[..., Any])


def enter_op(func: Any) -> contextvars.Token:
    """Mark ``func`` as the op being run (until :func:`exit_op` with the returned token): the dispatcher's hook."""
    return _CURRENT_OP.set(func)


def exit_op(token: contextvars.Token) -> None:
    """Restore the op that ran before the matching :func:`enter_op`."""
    _CURRENT_OP.reset(token)


@contextlib.contextmanager
def running_op(func: Any) -> Iterator[None]:
    """Within the block, a failing collective's message names ``func`` as the op being run.

    ``ShardTensor`` ops do this themselves (``all_reduce (in torch.Tensor.mean, ...)``); use it for an
    op entry of your own that issues collectives.
    """
    token = enter_op(func)
    try:
        yield
    finally:
        exit_op(token)


def _naming(var: contextvars.ContextVar[str | None], fn: _F) -> _F:
    """``fn``, which sets ``var`` to its qualified name while it runs (not while dynamo traces it)."""
    label = fn.__qualname__.rsplit(".<locals>.", 1)[-1]

    @functools.wraps(fn)
    def named(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_dynamo_compiling():  # traced code has no context to name
            return fn(*args, **kwargs)
        token = var.set(label)
        try:
            return fn(*args, **kwargs)
        finally:
            var.reset(token)

    return named  # type: ignore[return-value]


def entry(fn: _F) -> _F:
    """Decorator: a collective failing while ``fn`` runs names it (``all_to_all (in HaloPlan.build)``).

    For the library's functions that issue collectives; the innermost decorated function is named.
    Put it below ``@classmethod``/``@staticmethod``.
    """
    return _naming(_CALLER, fn)


def layer(forward: _F) -> _F:
    """Decorator for a module's ``forward``: a collective failing while it runs names the layer.

    >>> class Pool(torch.nn.Module):
    ...     @layer
    ...     def forward(self, x):
    ...         return _context()
    >>> Pool()(None)
    ' (in Pool.forward)'

    The innermost decorated layer is named (``PhysicsAttention.forward`` inside ``Transolver.forward``).
    """
    return _naming(_LAYER, forward)


def fault_wait_s() -> float:
    """Seconds a failed rank waits for the other ranks' notes (``MESHSHARD_FAULT_WAIT``, default 1)."""
    try:
        return max(0.0, float(os.environ.get("MESHSHARD_FAULT_WAIT", "1.0")))
    except ValueError:
        return 1.0


def _store() -> Any | None:
    if not dist.is_available() or not dist.is_initialized():
        return None
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # no store (e.g. a fake backend): reports are best-effort
        return None


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def report_failure(exc: BaseException, op: str) -> None:
    """Write this rank's culprit note for ``exc`` raised in ``op`` (once per exception).

    Called by meshshard on exceptions escaping sharded ops; call it yourself for failures in your
    own code (or use :func:`report_failures`). A no-op without a process group, for
    :class:`~meshshard.errors.CollectiveError` (this rank is a victim, not the culprit), and for an
    exception already reported.
    """
    global _REPORTED
    if isinstance(exc, CollectiveError) or getattr(exc, _MARK, False):
        return
    try:
        setattr(exc, _MARK, True)
    except Exception:
        pass
    store = _store()
    if store is None:
        return
    try:
        store.set(f"{FAILURE_PREFIX}{dist.get_rank()}", f"{time.time():.3f}|{op}: {_short(exc)}")
        _REPORTED = True
    except Exception:
        pass


@contextlib.contextmanager
def report_failures(op: str = "user code") -> Iterator[None]:
    """Report any exception raised in the block as this rank's failure, then re-raise it.

    >>> with report_failures("forward"):          # doctest: +SKIP
    ...     y = model(x)

    Not run as a doctest: the report goes to the other ranks of a process group.

    The other ranks, blocked in their next collective, then raise a
    :class:`~meshshard.errors.CollectiveError` naming this rank, ``op`` and the exception.
    """
    try:
        yield
    except BaseException as exc:
        report_failure(exc, op)
        raise


def install_excepthook() -> None:
    """Report an uncaught exception of this process before it dies (opt-in, e.g. in a training script)."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        if exc is not None:
            report_failure(exc, "uncaught exception")
        previous(exc_type, exc, tb)

    sys.excepthook = hook


def clear_reports(group: dist.ProcessGroup | None = None) -> None:
    """Delete the notes of every rank of ``group`` (e.g. after recovering from a failure)."""
    global _REPORTED
    store = _store()
    _REPORTED = False
    if store is None:
        return
    for rank in dist.get_process_group_ranks(group) if group is not None else range(dist.get_world_size()):
        for prefix in (FAILURE_PREFIX, VICTIM_PREFIX):
            try:
                store.delete_key(f"{prefix}{rank}")
            except Exception:
                pass


def retract_stale_report() -> None:
    """Call after a collective completed: if this rank had reported a failure, the note is stale; delete it.

    Costs nothing when this rank reported nothing (a module flag is read).
    """
    if _REPORTED:
        _retract()


def _retract() -> None:
    """This rank completed a collective after reporting a failure: its note is stale."""
    global _REPORTED
    _REPORTED = False
    store = _store()
    if store is not None:
        try:
            store.delete_key(f"{FAILURE_PREFIX}{dist.get_rank()}")
        except Exception:
            pass


def _context() -> str:
    """Where the failing collective was issued: the op being run, the library entry, the layer (innermost each).

    Read from context variables (:data:`_CURRENT_OP`, :func:`entry`, :func:`layer`): no stack frame is inspected.
    """
    func = _CURRENT_OP.get()
    parts = [op_name(func) if func is not None else None, _CALLER.get(), _LAYER.get()]
    named = [f"in {p}" for p in parts if p]
    return f" ({', '.join(named)})" if named else ""


def _read(store: Any, key: str) -> str | None:
    try:
        if store.check([key]):
            return store.get(key).decode(errors="replace")
    except Exception:
        return None
    return None


def collective_failed(name: str, group: dist.ProcessGroup | None, exc: BaseException) -> CollectiveError:
    """The :class:`CollectiveError` to raise when collective ``name`` failed in the backend with ``exc``.

    Writes this rank's victim note, waits up to :func:`fault_wait_s` for the other ranks' notes,
    and names the culprit(s). Called by :mod:`meshshard.comm`; use it to wrap collectives of your own.
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    if _REPORTED:  # this rank reached a collective again: its own earlier note is stale
        _retract()
    where = f"{name}{_context()}"
    store = _store()
    culprits: dict[int, str] = {}
    victims: dict[int, str] = {}
    silent: list[int] = []
    if store is not None:
        try:
            store.set_timeout(timedelta(seconds=max(1.0, fault_wait_s())))
            store.set(f"{VICTIM_PREFIX}{rank}", f"{time.time():.3f}|{where}")
        except Exception:
            pass
        peers = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
        deadline = time.monotonic() + fault_wait_s()
        while True:
            for r in peers:
                if r == rank or r in culprits:
                    continue
                note = _read(store, f"{FAILURE_PREFIX}{r}")
                if note is not None:
                    culprits[r] = note.split("|", 1)[-1]
                elif r not in victims:
                    note = _read(store, f"{VICTIM_PREFIX}{r}")
                    if note is not None:
                        victims[r] = note.split("|", 1)[-1]
            silent = [r for r in peers if r != rank and r not in culprits and r not in victims]
            if not silent or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
    if culprits:
        why = "; ".join(f"rank {r} failed first: {text}" for r, text in sorted(culprits.items()))
    elif silent:
        names = ", ".join(f"rank {r}" for r in silent)
        why = f"{names} did not report (no report; it may have died or be stuck outside a collective)"
    elif victims:
        why = "every other rank failed in a collective too (mismatched collectives?): " + "; ".join(
            f"rank {r} in {text}" for r, text in sorted(victims.items())
        )
    else:
        why = "unknown rank (no report; it may have died)"
    message = f"[rank {rank}] {where} failed: {why} (backend error: {_short(exc)})"
    return CollectiveError(message, rank=rank, op=name, culprits=sorted(culprits) or silent)
