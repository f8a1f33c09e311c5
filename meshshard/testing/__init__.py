"""Run functions on several ``torch.distributed`` ranks from pytest (or any script).

Test your own sharded model against its serial twin in a few lines::

    import torch.distributed as dist
    from meshshard import comm
    from meshshard.testing import run_distributed

    def check(n):                       # module level: it is pickled by reference
        t = torch.full((1,), float(dist.get_rank() + n))
        return comm.all_reduce(t).item()  # every collective through meshshard.comm: counted, named on failure

    def test_sum():
        assert run_distributed(check, 3, 1) == [6.0, 6.0, 6.0]

:func:`run_distributed` keeps one persistent :class:`WorkerPool` per
``(world_size, backend, timeout)``, so the ~3 s import of torch is paid once per world size and
not once per test. Rendezvous is a ``FileStore`` in a private temporary directory. Every worker
runs one intra-op thread, so world sizes 1-4 work on a 2-core machine. A rank that raises, hangs
or dies fails the call with a :class:`DistributedError` holding every failing rank's traceback;
the pool is then rebuilt on the next call. The process-group ``timeout`` (seconds, default 60,
or ``MESHSHARD_TEST_TIMEOUT``) turns a deadlock into an error on the blocked ranks.

At most ``MESHSHARD_TEST_POOL_RANKS`` (default 10: one pool each of 1-4 ranks) pooled processes stay
alive: a new pool first stops the least recently used ones. Each rank holds 0.3-0.6 GB, and a suite
with fault tests (a pool per short timeout) would otherwise keep dozens of them.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable
from typing import Any

from ._pool import DistributedError, RankFailure, WorkerPool

__all__ = ["DistributedError", "RankFailure", "WorkerPool", "run_distributed", "shutdown_pools"]

_POOLS: dict[tuple[int, str | None, float], WorkerPool] = {}  # least recently used first


def _max_pooled_ranks() -> int:
    return int(os.environ.get("MESHSHARD_TEST_POOL_RANKS", "10"))


def _default_timeout() -> float:
    return float(os.environ.get("MESHSHARD_TEST_TIMEOUT", "60"))


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float | None = None,
    backend: str | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; return the results ordered by rank.

    The default process group is initialised in every worker before ``fn`` runs, so ``fn`` may
    call :func:`meshshard.init_mesh` and the collectives of :mod:`meshshard.comm`.

    Raises
    ------
    DistributedError
        If any rank raised, died, or did not answer within ``2 * timeout + 30`` seconds.
    """
    timeout = _default_timeout() if timeout is None else float(timeout)
    return _pool_for(world_size, backend, timeout).run(fn, *args, deadline=2 * timeout + 30.0, **kwargs)


def _pool_for(world_size: int, backend: str | None, timeout: float) -> WorkerPool:
    """The pool of ``world_size`` ranks for a call with this process-group ``timeout``.

    A timeout shorter than the default is what a fault test measures, so it gets a pool of its own;
    a default or longer one only bounds a hang (the call's deadline stays ``2 * timeout + 30``), so an
    open pool with at least that timeout serves it rather than starting ``world_size`` more processes.
    """
    key = (world_size, backend, timeout)
    pool = _POOLS.get(key)
    if pool is None or pool.closed:
        pool = None
        if timeout >= _default_timeout():
            for other_key, other in _POOLS.items():
                world, back, limit = other_key
                if world == world_size and back == backend and limit >= timeout and not other.closed:
                    key, pool = other_key, other
                    break
    if pool is None:
        _make_room(world_size)
        pool = WorkerPool(world_size, backend=backend, timeout=timeout)
    _POOLS.pop(key, None)
    _POOLS[key] = pool  # now the most recently used
    return pool


def _make_room(world_size: int) -> None:
    """Stop the least recently used pools until ``world_size`` more ranks fit under the cap (calls from
    this process run one at a time, so every pool here is idle)."""
    for key in [k for k, p in _POOLS.items() if p.closed]:
        del _POOLS[key]
    live = sum(p.world_size for p in _POOLS.values())
    while _POOLS and live + world_size > _max_pooled_ranks():
        oldest = next(iter(_POOLS))
        pool = _POOLS.pop(oldest)
        live -= pool.world_size
        pool.close()


def shutdown_pools() -> None:
    """Stop every pool started by :func:`run_distributed` (also done at interpreter exit)."""
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


atexit.register(shutdown_pools)
