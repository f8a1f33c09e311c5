"""Gradient synchronisation for models run on ShardTensors."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from .. import comm

__all__ = ["sync_gradients"]


def sync_gradients(module: torch.nn.Module, mesh: DeviceMesh, *, domain_dim: int | str | None = None) -> None:
    """Make every parameter's ``.grad`` the single-process gradient, on every rank.

    Call after ``loss.backward()`` and before ``optimizer.step()``. Replicated parameters used on
    sharded inputs hold *partial* gradients on each rank of the domain axis (see
    :mod:`meshshard.comm`): they are summed over the domain axis. On a 2-D mesh
    ``(dp, domain)`` they are then averaged over the data-parallel axis, as DDP would.

    **Communication:** one ``all_reduce`` over the domain group of all gradients flattened into
    one buffer (per dtype), plus one over the data-parallel group on a 2-D mesh.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"Expected 'module' to be a torch.nn.Module (got {type(module).__name__})")
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"Expected 'mesh' to be a DeviceMesh (got {type(mesh).__name__})")
    params = [p for p in module.parameters() if p.grad is not None]
    if not params:
        return
    dom = mesh.ndim - 1 if domain_dim is None else domain_dim
    if isinstance(dom, str):
        dom = (mesh.mesh_dim_names or ()).index(dom)
    groups = [(mesh.get_group(dom), None)]
    if mesh.ndim == 2:
        dp = 1 - dom
        groups.append((mesh.get_group(dp), mesh.size(dp)))
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in params:
        grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad  # replicated DTensor weights
        by_dtype.setdefault(grad.dtype, []).append(grad)
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        for group, mean_over in groups:
            if dist.get_world_size(group) == 1:
                continue
            comm.all_reduce_(flat, group)  # through comm: counted, and a failing peer is named
            if mean_over:
                flat /= mean_over
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
