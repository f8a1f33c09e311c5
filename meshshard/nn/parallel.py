"""Gradient synchronisation for models run on ShardTensors."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from .. import comm, faults
from .._lazy import if_imported
from ..errors import ShardingError

__all__ = ["sync_gradients"]


@faults.entry
def sync_gradients(module: torch.nn.Module, mesh: DeviceMesh, *, domain_dim: int | str | None = None) -> None:
    """Make every parameter's ``.grad`` the single-process gradient, on every rank.

    Call after ``loss.backward()`` and before ``optimizer.step()``. Replicated parameters used on
    sharded inputs hold *partial* gradients on each rank of the domain axis (see
    :mod:`meshshard.comm`): they are summed over the domain axis. On a 2-D mesh
    ``(dp, domain)`` they are then averaged over the data-parallel axis, as DDP would.

    Ranks first agree on which parameters have a gradient: a parameter that backward reached on
    some ranks only (a branch taken for one rank's points, or for one sample) contributes zero on
    the others, so it gets a zero ``.grad`` there before the sum, and every rank ends with the same
    gradients; a parameter reached on no rank keeps ``.grad = None`` everywhere. Ranks whose modules
    differ (another number, shape or dtype of parameters) raise the same
    :class:`~meshshard.errors.ShardingError` on every rank.

    **Communication:** per group (the domain group, and the data-parallel group on a 2-D mesh), two
    small ``all_gather`` (:func:`meshshard.comm.agree`: the parameters' signature, then which have a
    gradient), then one ``all_reduce`` of all gradients flattened into one buffer (per dtype).
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"Expected 'module' to be a torch.nn.Module (got {type(module).__name__})")
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"Expected 'mesh' to be a DeviceMesh (got {type(mesh).__name__})")
    dom = mesh.ndim - 1 if domain_dim is None else domain_dim
    if isinstance(dom, str):
        dom = (mesh.mesh_dim_names or ()).index(dom)
    groups = [(mesh.get_group(dom), None)]
    if mesh.ndim == 2:
        dp = 1 - dom
        groups.append((mesh.get_group(dp), mesh.size(dp)))
    groups = [(g, m) for g, m in groups if dist.get_world_size(g) > 1]
    all_params = list(module.parameters())
    reached = [p.grad is not None for p in all_params]
    for group, _ in groups:
        reached = _agree_reached(all_params, reached, group)
    params = []
    for p, has in zip(all_params, reached):
        if has and p.grad is None:  # reached on another rank only: a zero contribution here
            p.grad = torch.zeros_like(p)
        if has:
            params.append(p)
    if not params:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    dtensor = if_imported("torch.distributed.tensor", "DTensor")  # None: no DTensor exists
    for p in params:
        grad = p.grad.to_local() if dtensor is not None and isinstance(p.grad, dtensor) else p.grad
        by_dtype.setdefault(grad.dtype, []).append(grad)
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        for group, mean_over in groups:
            comm.all_reduce_(flat, group)  # through comm: counted, and a failing peer is named
            if mean_over:
                flat /= mean_over
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def _signature(params: list[torch.nn.Parameter]) -> list[int]:
    """How many parameters, how many elements, and a deterministic hash of their shapes and dtypes."""
    code = 0
    for p in params:
        for v in (*p.shape, len(p.shape), _DTYPES.index(p.dtype) if p.dtype in _DTYPES else 99):
            code = (code * 1_000_003 + int(v) + 1) % _PRIME
    return [len(params), sum(p.numel() for p in params), code]


_PRIME = (1 << 61) - 1
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128)


def _agree_reached(params: list[torch.nn.Parameter], reached: list[bool], group) -> list[bool]:
    """Which parameters have a gradient on some rank of ``group`` (after checking ranks hold the same parameters)."""
    sigs = comm.agree(None, group, payload=_signature(params)).payloads
    if not bool((sigs == sigs[0]).all()):
        rank = dist.get_rank()
        detail = "; ".join(f"rank {r}: {int(s[0])} parameters of {int(s[1])} elements" for r, s in enumerate(sigs))
        raise ShardingError(
            f"[rank {rank}] sync_gradients: every rank must hold the same parameters (numbers, shapes, dtypes); "
            f"found {detail}"
        )
    masks = comm.agree(None, group, payload=[int(r) for r in reached]).payloads
    return [bool(v) for v in masks.any(dim=0).tolist()] if len(reached) else []
