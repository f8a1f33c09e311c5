"""Device meshes: ``init_mesh`` and the domain axis.

meshshard shards points over one axis of a ``torch.distributed`` :class:`DeviceMesh`, the
*domain* axis (by convention the last one, named ``"domain"``). A 2-D mesh ``(dp, domain)`` runs
``dp`` samples at once, each sharded over a domain group of ``domain`` ranks.
"""

from __future__ import annotations

import atexit
import gc
import math
import os
import sys
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from . import comm
from ._checks import check_positive_real

__all__ = ["init_mesh", "mesh_device_type", "axis_group_rank", "release_groups", "DEFAULT_TIMEOUT_S"]

#: Process-group timeout used by :func:`init_mesh` when it creates the process group
#: (override with ``MESHSHARD_TIMEOUT`` seconds): a rank stuck in a collective raises after it.
DEFAULT_TIMEOUT_S = 300.0


#: Meshes made by :func:`init_mesh` or sharded over (:func:`axis_group_rank`): released at exit.
#: Keyed by identity: equal meshes (same layout) are distinct objects, each with its own registry.
_MESHES: dict[int, weakref.ref[DeviceMesh]] = {}
_AXIS_CACHE = "_meshshard_axis_cache"
_hook_registered = False


def _remember(mesh: DeviceMesh) -> None:
    global _hook_registered
    key = id(mesh)
    if key not in _MESHES:  # the callback forgets a mesh when it dies, before its id can be reused
        _MESHES[key] = weakref.ref(mesh, lambda _, key=key: _MESHES.pop(key, None))
    if not _hook_registered:
        atexit.register(release_groups)
        _hook_registered = True


def axis_group_rank(mesh: DeviceMesh, mesh_dim: int) -> tuple[dist.ProcessGroup, int]:
    """(process group, local rank) of a mesh axis, cached on the mesh: looked up on every op."""
    cache = mesh.__dict__.get(_AXIS_CACHE)
    if cache is None:
        cache = mesh.__dict__[_AXIS_CACHE] = {}
        _remember(mesh)
    hit = cache.get(mesh_dim)
    if hit is None:
        hit = cache[mesh_dim] = (mesh.get_group(mesh_dim), mesh.get_local_rank(mesh_dim))
    return hit


def release_groups() -> None:
    """Destroy the process groups at exit, so that their native threads end before finalization.

    Registered with ``atexit`` by the first :func:`init_mesh` (or sharded op); calling it earlier is
    allowed once the work is done. A still-initialized gloo group is destroyed (a local operation; an
    NCCL group is left to its owner). Once no group is initialized, the meshes meshshard knows drop
    their references to the destroyed groups and garbage is collected, which destroys the backends
    and joins their threads (see the module docstring).
    """
    if not dist.is_available():
        return
    if dist.is_initialized():
        try:  # "gloo", or per device: "cpu:gloo,cuda:nccl" (get_backend() says "undefined" for the latter)
            config = str(dist.get_backend_config())
        except Exception:
            return
        if {part.split(":")[-1].strip() for part in config.split(",")} != {"gloo"}:
            return
        dist.destroy_process_group()
    for ref in list(_MESHES.values()):
        mesh = ref()
        if mesh is None:
            continue
        registry = getattr(mesh, "_pg_registry", None)
        if isinstance(registry, dict):
            registry.clear()
        mesh.__dict__.pop(_AXIS_CACHE, None)
    _unpin_world_defaults()
    gc.collect()


def _unpin_world_defaults() -> None:
    """Drop the world group that ``torch.distributed.nn.functional`` keeps as its functions' default argument.

    Its functions are defined with ``group=group.WORLD``, evaluated when the module is first imported;
    it is imported late (building an optimizer imports ``torch._dynamo``, which imports it), so after
    ``init_process_group`` the defaults hold the world group for good. Called once the group is
    destroyed: ``None`` (what they hold when imported before) means the default group there too.
    """
    module = sys.modules.get("torch.distributed.nn.functional")
    if module is None:
        return
    for fn in list(vars(module).values()):
        defaults = getattr(fn, "__defaults__", None)
        if getattr(fn, "__module__", None) == module.__name__ and defaults and \
                any(isinstance(d, dist.ProcessGroup) for d in defaults):
            fn.__defaults__ = tuple(None if isinstance(d, dist.ProcessGroup) else d for d in defaults)


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
    _check_shape_type(shape)
    if backend is not None and backend not in ("gloo", "nccl", "mpi", "ucc", "xccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl' (got {backend!r})")
    if timeout is None and not dist.is_initialized():
        timeout = _env_timeout()
    if timeout is not None:
        check_positive_real(timeout, "timeout")
    if not dist.is_initialized():
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    shape = _mesh_shape(shape, dist.get_world_size())
    names = ("domain",) if len(shape) == 1 else ("dp", "domain")
    mesh = init_device_mesh(mesh_device_type(), shape, mesh_dim_names=names)
    _remember(mesh)
    return mesh


def _check_shape_type(shape: object) -> None:
    """``shape`` is ``None``, an int or a sequence of ints (``bool`` refused), else a ``TypeError``."""
    if shape is not None and not isinstance(shape, (int, tuple, list)) or isinstance(shape, bool):
        raise TypeError(f"shape must be None, an int P or a tuple (dp, domain) (got {type(shape).__name__})")
    if isinstance(shape, (tuple, list)) and not all(hasattr(s, "__index__") and not isinstance(s, bool) for s in shape):
        raise TypeError(f"shape must hold ints (got {shape!r})")


def _env_timeout() -> float:
    """The process-group timeout from ``MESHSHARD_TIMEOUT`` (seconds), or the default."""
    raw = os.environ.get("MESHSHARD_TIMEOUT", str(DEFAULT_TIMEOUT_S))
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"MESHSHARD_TIMEOUT must be a number of seconds (got {raw!r})") from None


def _mesh_shape(shape: int | tuple[int, ...] | list[int] | None, world: int) -> tuple[int, ...]:
    """``shape`` as a 1-D or 2-D tuple of positive ints whose product is ``world``."""
    if shape is None:
        shape = (world,)
    elif isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    if len(shape) not in (1, 2) or any(s < 1 for s in shape):
        raise ValueError(f"shape must be P or (dp, domain) with positive entries (got {shape})")
    ranks = math.prod(shape)
    if ranks != world:
        raise ValueError(f"mesh shape {shape} has {ranks} ranks but the world has {world}")
    return shape
