"""Device meshes: ``init_mesh`` and the domain axis.

meshshard shards points over one axis of a ``torch.distributed`` :class:`DeviceMesh`, the
*domain* axis (by convention the last one, named ``"domain"``). A 2-D mesh ``(dp, domain)`` runs
``dp`` samples at once, each sharded over a domain group of ``domain`` ranks.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from . import comm

__all__ = ["init_mesh", "mesh_device_type", "DEFAULT_TIMEOUT_S"]

#: Process-group timeout used by :func:`init_mesh` when it creates the process group
#: (override with ``MESHSHARD_TIMEOUT`` seconds): a rank stuck in a collective raises after it.
DEFAULT_TIMEOUT_S = 300.0


def mesh_device_type() -> str:
    """``"cuda"`` when the default process group runs NCCL, else ``"cpu"``."""
    return comm.group_device().type


def init_mesh(
    shape: int | tuple[int, ...] | None = None,
    *,
    backend: str | None = None,
    timeout: float | None = None,
) -> DeviceMesh:
    """Create a device mesh over the world (initialising the process group if needed).

    Works under ``torchrun`` (reads ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``) and inside an
    already initialised process group (e.g. :func:`meshshard.testing.run_distributed`).

    Parameters
    ----------
    shape:
        ``None`` or ``P`` for a 1-D mesh of all ranks named ``("domain",)``; ``(dp, domain)`` for a
        2-D mesh named ``("dp", "domain")``; its product must equal the world size.
    backend:
        ``"nccl"`` when CUDA is available, else ``"gloo"``, unless given.
    timeout:
        Process-group timeout in seconds (default ``MESHSHARD_TIMEOUT`` or 300), used when this call
        creates the process group. Every collective runs under it: a rank blocked on a peer that is
        stuck raises after ``timeout`` seconds; a rank whose peer died raises as soon as the backend
        notices. Either way the error is a :class:`~meshshard.errors.CollectiveError` that names
        the failing rank and the operation (see :mod:`meshshard.faults`).
    """
    if shape is not None and not isinstance(shape, (int, tuple, list)) or isinstance(shape, bool):
        raise TypeError(f"shape must be None, an int P or a tuple (dp, domain) (got {type(shape).__name__})")
    if isinstance(shape, (tuple, list)) and not all(hasattr(s, "__index__") and not isinstance(s, bool) for s in shape):
        raise TypeError(f"shape must hold ints (got {shape!r})")
    if backend is not None and backend not in ("gloo", "nccl", "mpi", "ucc", "xccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl' (got {backend!r})")
    if timeout is None and not dist.is_initialized():
        raw = os.environ.get("MESHSHARD_TIMEOUT", str(DEFAULT_TIMEOUT_S))
        try:
            timeout = float(raw)
        except ValueError:
            raise ValueError(f"MESHSHARD_TIMEOUT must be a number of seconds (got {raw!r})") from None
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be a number of seconds (got {type(timeout).__name__})")
        if not (timeout > 0 and timeout < float("inf")):
            raise ValueError(f"timeout must be positive and finite (got {timeout})")
    if not dist.is_initialized():
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    world = dist.get_world_size()
    if shape is None:
        shape = (world,)
    elif isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    if len(shape) not in (1, 2) or any(s < 1 for s in shape):
        raise ValueError(f"shape must be P or (dp, domain) with positive entries (got {shape})")
    if int(torch.tensor(shape).prod()) != world:
        raise ValueError(f"mesh shape {shape} has {int(torch.tensor(shape).prod())} ranks but the world has {world}")
    names = ("domain",) if len(shape) == 1 else ("dp", "domain")
    return init_device_mesh(mesh_device_type(), shape, mesh_dim_names=names)
