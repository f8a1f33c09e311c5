"""Persistent pools of ``torch.distributed`` worker processes for tests.

Importing torch costs seconds per process, so spawning W processes per test would dominate a suite.
A :class:`WorkerPool` starts W processes once, joins them into one process group through a
``FileStore`` in a private temporary directory (no TCP ports, so no clashes between concurrent
suites), and then runs any number of functions on them. A failure on any rank (an exception, a
collective that timed out, a rank that died) fails the call with every rank's report and tears the
pool down; the next call builds a fresh one, so one broken test cannot poison the next.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

from .._checks import check_positive_int

__all__ = ["DistributedError", "RankFailure", "WorkerPool"]

_GRACE_S = 3.0  # after one rank fails, how long to wait for the others' own reports


@dataclass(frozen=True)
class RankFailure:
    """What one rank reported (or what the pool observed) when a distributed call failed."""

    rank: int
    kind: str  # "exception", "timeout" (no answer before the deadline) or "died"
    message: str
    traceback: str = ""


class DistributedError(RuntimeError):
    """A function run on several ranks failed on at least one of them.

    ``failures`` holds one :class:`RankFailure` per failing rank, ordered by rank; the message
    contains each failing rank's traceback.
    """

    def __init__(self, failures: Sequence[RankFailure], what: str = "distributed call"):
        self.failures = list(failures)
        parts = [f"{what} failed on rank(s) {[f.rank for f in self.failures]}"]
        for f in self.failures:
            parts.append(f"--- rank {f.rank} ({f.kind}): {f.message}")
            if f.traceback:
                parts.append(f.traceback.rstrip())
        super().__init__("\n".join(parts))


def _default_backend(world_size: int) -> str:
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl"
    return "gloo"


def _worker_main(
    rank: int,
    world_size: int,
    store_path: str,
    backend: str,
    timeout_s: float,
    num_threads: int,
    conn: Connection,
) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(num_threads)
    os.environ["MESHSHARD_RANK"] = str(rank)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
    )
    try:
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                return
            if msg is None:
                return
            path, payload = msg
            for p in reversed(path):
                if p not in sys.path:
                    sys.path.insert(0, p)
            try:
                # Unpickles only what this pool's own parent sent over its private pipe (never a file).
                fn, args, kwargs = pickle.loads(payload)
                result = fn(*args, **kwargs)
                conn.send(("ok", pickle.dumps(result)))
            except BaseException as exc:  # report everything, including KeyboardInterrupt in fn
                conn.send(("err", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


class WorkerPool:
    """``world_size`` long-lived processes joined in one process group.

    Parameters
    ----------
    world_size:
        Number of ranks (>= 1).
    backend:
        ``"gloo"`` or ``"nccl"``; default NCCL when there are enough CUDA devices, else gloo.
    timeout:
        Process-group timeout in seconds: a collective that waits longer raises on that rank.
    num_threads:
        ``torch.set_num_threads`` in every worker (1 keeps W workers from fighting over cores).
    """

    def __init__(
        self,
        world_size: int,
        backend: str | None = None,
        timeout: float = 60.0,
        num_threads: int = 1,
    ) -> None:
        check_positive_int(world_size, "world_size")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive (got {timeout!r})")
        from .._spawn import check_main_guard

        check_main_guard("run_distributed")
        self.world_size = world_size
        self.backend = backend or _default_backend(world_size)
        self.timeout = float(timeout)
        self._tmpdir = tempfile.mkdtemp(prefix="meshshard-pool-")
        ctx = mp.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        store_path = os.path.join(self._tmpdir, "store")
        for rank in range(world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_worker_main,
                args=(rank, world_size, store_path, self.backend, self.timeout, num_threads, child),
                daemon=True,
                name=f"meshshard-worker-{rank}",
            )
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        self.closed = False

    def run(self, fn: Callable[..., Any], *args: Any, deadline: float | None = None, **kwargs: Any) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank; return the per-rank results, ordered by rank.

        ``fn`` and its arguments are pickled (``fn`` by reference: a module-level function).
        ``deadline`` (seconds, default ``2 * timeout + 30``) bounds the whole call, process start
        included, so that a rank that never returns (an endless loop, not a collective) fails too.
        """
        if self.closed:
            raise RuntimeError("this WorkerPool is closed")
        payload = pickle.dumps((fn, args, kwargs))
        path = list(sys.path)
        for conn in self._conns:
            conn.send((path, payload))
        limit = time.monotonic() + (deadline if deadline is not None else 2 * self.timeout + 30.0)
        results: dict[int, Any] = {}
        failures: dict[int, RankFailure] = {}
        pending = {conn: rank for rank, conn in enumerate(self._conns)}
        grace_started = False
        while pending:
            now = time.monotonic()
            if failures and not grace_started:
                # The others may be blocked in a collective with the failed rank: give them a
                # moment to report their own errors, then stop waiting.
                limit, grace_started = min(limit, now + _GRACE_S), True
            ready = wait(list(pending), timeout=max(0.0, limit - now))
            if not ready:
                break
            for conn in ready:
                rank = pending.pop(conn)
                try:
                    reply = conn.recv()
                except (EOFError, OSError):
                    code = self._procs[rank].exitcode
                    failures[rank] = RankFailure(rank, "died", f"worker process exited (exit code {code})")
                    continue
                if reply[0] == "ok":
                    # Unpickles only what this pool's own worker sent over its private pipe (never a file).
                    results[rank] = pickle.loads(reply[1])
                else:
                    failures[rank] = RankFailure(rank, "exception", reply[1], reply[2])
        if failures or pending:
            for rank in pending.values():
                if rank not in failures:
                    failures[rank] = RankFailure(
                        rank, "timeout", "no answer before the deadline (hung, or waiting on a failed rank)"
                    )
            if not self._still_consistent(failures, pending):
                self.close()
            raise DistributedError([failures[r] for r in sorted(failures)], what=getattr(fn, "__name__", "call"))
        return [results[r] for r in range(self.world_size)]

    @staticmethod
    def _still_consistent(failures: dict[int, RankFailure], pending: dict) -> bool:
        """Whether the process group survived a failed call, so the pool can be kept.

        Every rank answered, and none failed inside the communication backend: then every
        collective any rank issued completed on all ranks (an unmatched one would have left its
        rank blocked, or failed with a backend timeout), and the group is in step. Anything else
        (a hang, a death, a backend error) rebuilds the pool.
        """
        if pending:
            return False
        markers = ("timed out", "timeout", "gloo", "nccl", "connection", "process group", "processgroup")
        for f in failures.values():
            text = (f.message + f.traceback).lower()
            if f.kind != "exception" or any(m in text for m in markers):
                return False
        return True

    def close(self) -> None:
        """Stop every worker (politely, then by force) and remove the rendezvous directory."""
        if self.closed:
            return
        self.closed = True
        for conn in self._conns:
            try:
                conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        end = time.monotonic() + 2.0
        for proc in self._procs:
            proc.join(timeout=max(0.0, end - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5.0)
        for conn in self._conns:
            conn.close()
        shutil.rmtree(self._tmpdir, ignore_errors=True)
