"""``ShardTensor``: a tensor sharded unevenly along one dimension, with its sharding sizes.

Design
------
A :class:`ShardTensor` **is** its local shard: a ``torch.Tensor`` subclass (made with
``as_subclass``, no copy) whose storage, shape and autograd node are the local shard's, plus a
frozen :class:`ShardSpec` (device mesh and mesh axis, shard dimension, every rank's local length —
the *sharding sizes* — and the global shape). Ops are intercepted with ``__torch_function__``
and routed through a registry of sharding rules (``meshshard.ops``): local ops run on the shard,
reductions over the sharded dimension become all-reduces, anything without a rule raises
:class:`~meshshard.errors.UnsupportedOpError`.

Why not subclass ``DTensor``: with uneven shards PyTorch 2.13's ``DTensor`` returned silently
wrong ``full_tensor()``/``mean()`` here and raised in backward, and its sharding propagation runs at
the ATen level after ``linear``/``layer_norm``/``softmax`` have been decomposed, where the point
dimension of a point cloud is no longer visible. Working at the ``torch`` function level keeps
rules short, lets autograd run on the real local tensors (exact gradients, no wrapper graph), and
costs a dictionary lookup per op. DTensors still interoperate: meshes are ``DeviceMesh`` objects,
and replicated ``DTensor`` weights are used through their local value.

Shapes are local: ``x.shape`` is the local shard's shape, so model code that reshapes per point
(``x.view(B, N, H, D)`` with ``N = x.shape[1]``) runs unchanged; ``x.global_shape`` is the whole
tensor's. Use ``x.mean(dim)`` rather than ``x.sum(dim) / x.shape[dim]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from . import comm, faults
from .errors import ShardingError

__all__ = ["ShardSpec", "ShardTensor", "ReplicatedTensor", "scatter", "validate_enabled"]


validate_enabled = comm.validate_enabled  # the one switch, shared with the collectives


@dataclass(frozen=True)
class ShardSpec:
    """Where a sharded tensor lives: metadata only, no data.

    Attributes
    ----------
    mesh, mesh_dim:
        The device mesh and the axis whose ranks hold the shards (the domain axis).
    dim:
        The sharded tensor dimension (non-negative).
    sizes:
        Every rank's local length along ``dim``, ordered by rank along ``mesh_dim``.
    global_shape:
        Shape of the whole tensor: the local shape with ``dim`` replaced by ``sum(sizes)``.
    """

    mesh: DeviceMesh = field(compare=False)
    mesh_dim: int
    dim: int
    sizes: tuple[int, ...]
    global_shape: torch.Size
    mesh_id: int = field(default=0, repr=False)
    _moved: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    @property
    def group(self) -> dist.ProcessGroup:
        return _group_of(self.mesh, self.mesh_dim)

    @property
    def rank(self) -> int:
        """This process's rank along the mesh axis (the index of its shard)."""
        return _local_rank_of(self.mesh, self.mesh_dim)

    @property
    def num_ranks(self) -> int:
        return len(self.sizes)

    @property
    def offsets(self) -> tuple[int, ...]:
        out = [0]
        for s in self.sizes:
            out.append(out[-1] + s)
        return tuple(out)

    @property
    def num_global(self) -> int:
        return self.global_shape[self.dim]

    def same_sharding(self, other: ShardSpec) -> bool:
        return self.mesh_id == other.mesh_id and self.mesh_dim == other.mesh_dim and self.sizes == other.sizes

    def moved(self, dim: int, local_shape: Sequence[int]) -> ShardSpec:
        """The spec of a local result of shape ``local_shape`` sharded along ``dim`` (memoised: on every op)."""
        key = (dim, tuple(local_shape))
        hit = self._moved.get(key)
        if hit is None:
            shape = list(local_shape)
            shape[dim] = self.num_global
            if dim == self.dim and torch.Size(shape) == self.global_shape:
                hit = self
            else:
                hit = ShardSpec(self.mesh, self.mesh_dim, dim, self.sizes, torch.Size(shape), self.mesh_id)
            if len(self._moved) < 64:
                self._moved[key] = hit
        return hit


def _cached(mesh: DeviceMesh, mesh_dim: int) -> tuple[dist.ProcessGroup, int]:
    """(process group, local rank) of a mesh axis, cached on the mesh: looked up on every op."""
    cache = mesh.__dict__.setdefault("_meshshard_axis_cache", {})
    hit = cache.get(mesh_dim)
    if hit is None:
        hit = cache[mesh_dim] = (mesh.get_group(mesh_dim), mesh.get_local_rank(mesh_dim))
    return hit


def _group_of(mesh: DeviceMesh, mesh_dim: int) -> dist.ProcessGroup:
    return _cached(mesh, mesh_dim)[0]


def _local_rank_of(mesh: DeviceMesh, mesh_dim: int) -> int:
    return _cached(mesh, mesh_dim)[1]


def _as_sizes(value: Any, name: str, check_sign: bool = True) -> tuple[int, ...]:
    """``value`` (a sequence or 1-D tensor of non-negative ints) as a tuple, else an error naming ``name``."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{name} must be a 1-D integer tensor or a sequence of ints (got {value.dtype} "
                            f"of shape {tuple(value.shape)})")
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) and not hasattr(value, "__array__"):
        raise TypeError(f"{name} must be a sequence of ints (got {type(value).__name__})")
    out = []
    for v in list(value):
        if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__index__"):
            raise TypeError(f"{name} must hold ints (got {type(v).__name__} in {list(value)!r})")
        if isinstance(v, float) and not v.is_integer():
            raise TypeError(f"{name} must hold ints (got {v!r})")
        out.append(int(v))
    if check_sign and any(v < 0 for v in out):
        raise ValueError(f"{name} must be non-negative (got {tuple(out)})")
    return tuple(out)


def _norm_mesh_dim(mesh: DeviceMesh, mesh_dim: int | str | None) -> int:
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"Expected 'mesh' to be a DeviceMesh (got {type(mesh).__name__})")
    if mesh_dim is None:
        return mesh.ndim - 1
    if isinstance(mesh_dim, str):
        names = mesh.mesh_dim_names or ()
        if mesh_dim not in names:
            raise ValueError(f"mesh_dim {mesh_dim!r} is not a dimension name of the mesh (names: {names})")
        return names.index(mesh_dim)
    if not -mesh.ndim <= mesh_dim < mesh.ndim:
        raise ValueError(f"mesh_dim must be in [-{mesh.ndim}, {mesh.ndim}) (got {mesh_dim})")
    return mesh_dim % mesh.ndim


class ShardTensor(torch.Tensor):
    """A tensor sharded (unevenly) along one dimension over one axis of a device mesh.

    Build one with :meth:`from_local` or :func:`scatter`; it behaves like its local shard for
    local ops and like the global tensor for reductions over the sharded dimension.

    **Shapes:** local ``(..., N_local, ...)`` with ``N_local = sharding_sizes[rank]``; global
    ``(..., N_global, ...)``, ``N_global = sum(sharding_sizes)``.
    """

    _spec: ShardSpec

    @staticmethod
    def from_local(
        local: torch.Tensor,
        mesh: DeviceMesh,
        sizes: Sequence[int] | torch.Tensor | None = None,
        dim: int = 0,
        *,
        mesh_dim: int | str | None = None,
        validate: bool | None = None,
    ) -> ShardTensor:
        """Wrap this rank's shard.

        Parameters
        ----------
        local:
            This rank's shard (any shape with ``ndim > dim``); kept, not copied; autograd flows
            through to it.
        mesh:
            The device mesh; the shards live on its axis ``mesh_dim`` (default: the last axis).
        sizes:
            Every rank's local length along ``dim``. Given: **no communication**. ``None``: one
            small all-gather of the local lengths.
        dim:
            The sharded dimension (0: points; 1 with a leading batch dimension).
        validate:
            Check with one all-gather that every rank passed the same ``sizes``
            (default: ``MESHSHARD_VALIDATE``); a mismatch raises :class:`ShardingError`.

        **Communication:** none when ``sizes`` is given (one ``all_gather`` of one int64 when
        validating); one ``all_gather`` of one int64 per rank otherwise.
        """
        if isinstance(local, ShardTensor):
            raise TypeError("from_local expects a plain torch.Tensor (got a ShardTensor); use it as it is")
        if not isinstance(local, torch.Tensor):
            raise TypeError(f"Expected 'local' to be a torch.Tensor (got {type(local).__name__})")
        if not isinstance(mesh, DeviceMesh):
            raise TypeError(f"Expected 'mesh' to be a DeviceMesh (got {type(mesh).__name__})")
        if local.dim() == 0:
            raise ValueError("local must have at least one dimension to shard (got a 0-d tensor)")
        if not -local.dim() <= dim < local.dim():
            raise ValueError(
                f"dim must be in [-{local.dim()}, {local.dim()}) for a {local.dim()}-d local tensor (got {dim})"
            )
        dim %= local.dim()
        mdim = _norm_mesh_dim(mesh, mesh_dim)
        group, rank = _cached(mesh, mdim)
        world = mesh.size(mdim)
        n_local = local.shape[dim]
        if sizes is None:
            sizes_t = comm.all_gather_object_sizes(n_local, group, device=local.device)
        else:
            sizes_t = _as_sizes(sizes, "sizes")
            if len(sizes_t) != world:
                raise ValueError(
                    f"sizes must have one entry per rank of mesh axis {mdim} ({world}) (got {len(sizes_t)}: {sizes_t})"
                )
            if sizes_t[rank] != n_local:
                raise ValueError(
                    f"[rank {rank}] sizes[{rank}] = {sizes_t[rank]} but the local tensor has {n_local} "
                    f"entries along dim {dim} (shape {tuple(local.shape)})"
                )
            if validate if validate is not None else validate_enabled():
                shape = list(local.shape)
                shape[dim] = sum(sizes_t)
                _check_same_on_all_ranks(sizes_t, group, rank, local.device, tuple(shape))
        shape = list(local.shape)
        shape[dim] = sum(sizes_t)
        spec = ShardSpec(mesh, mdim, dim, sizes_t, torch.Size(shape), id(mesh))
        return _wrap(local, spec)

    # -- metadata ---------------------------------------------------------------------------
    @property
    def spec(self) -> ShardSpec:
        return self._spec

    @property
    def sharding_sizes(self) -> tuple[int, ...]:
        """Every rank's local length along the sharded dimension (the sharding-shape metadata)."""
        return self._spec.sizes

    @property
    def offsets(self) -> tuple[int, ...]:
        """``(0, s0, s0+s1, ..., N_global)``: rank r holds global rows ``offsets[r]:offsets[r+1]``."""
        return self._spec.offsets

    @property
    def shard_dim(self) -> int:
        return self._spec.dim

    @property
    def global_shape(self) -> torch.Size:
        return self._spec.global_shape

    @property
    def mesh(self) -> DeviceMesh:
        return self._spec.mesh

    # -- conversions ------------------------------------------------------------------------
    def to_local(self) -> torch.Tensor:
        """This rank's shard as a plain tensor (a differentiable alias, no copy)."""
        with torch._C.DisableTorchFunctionSubclass():
            return self.as_subclass(torch.Tensor)

    def full_tensor(self) -> ReplicatedTensor:
        """The whole tensor on every rank (differentiable).

        **Communication:** one ``all_to_all_single`` (this rank sends its shard to every rank:
        ``P * N_local * row_bytes``); backward: one ``all_to_all_single`` (reduce-scatter).
        """
        spec = self._spec
        full = comm.gather_uneven(self.to_local(), spec.sizes, spec.dim, spec.group)
        return ReplicatedTensor._make(full, spec.num_ranks)

    def reshard(self, new_sizes: Sequence[int] | torch.Tensor) -> ShardTensor:
        """Move rows so that rank r holds ``new_sizes[r]`` of them, global order kept.

        **Communication:** one ``all_to_all_single``; each rank sends only the rows that change
        owner (its own block is copied locally by the collective).
        """
        spec = self._spec
        new_sizes = _as_sizes(new_sizes, "new_sizes", check_sign=False)
        if len(new_sizes) != spec.num_ranks or any(s < 0 for s in new_sizes):
            raise ValueError(f"new_sizes must be {spec.num_ranks} non-negative ints (got {new_sizes})")
        if sum(new_sizes) != spec.num_global:
            raise ValueError(f"new_sizes must sum to N_global = {spec.num_global} (got {sum(new_sizes)})")
        old_off = spec.offsets
        new_off = [0]
        for s in new_sizes:
            new_off.append(new_off[-1] + s)
        r = spec.rank

        def overlap(a0: int, a1: int, b0: int, b1: int) -> int:
            return max(0, min(a1, b1) - max(a0, b0))

        send = [overlap(old_off[r], old_off[r + 1], new_off[s], new_off[s + 1]) for s in range(spec.num_ranks)]
        recv = [overlap(old_off[s], old_off[s + 1], new_off[r], new_off[r + 1]) for s in range(spec.num_ranks)]
        moved = self.to_local().movedim(spec.dim, 0)
        out = comm.all_to_all(moved, send, recv, spec.group).movedim(0, spec.dim)
        shape = list(out.shape)
        shape[spec.dim] = spec.num_global
        new_spec = ShardSpec(spec.mesh, spec.mesh_dim, spec.dim, new_sizes, torch.Size(shape), spec.mesh_id)
        return _wrap(out, new_spec)

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # noqa: D105
        with torch._C.DisableTorchFunctionSubclass():
            body = torch.Tensor.__repr__(self.as_subclass(torch.Tensor))
        s = self._spec
        return f"ShardTensor(dim={s.dim}, sizes={s.sizes}, global_shape={tuple(s.global_shape)}, local={body})"

    def __reduce_ex__(self, proto):
        raise TypeError("a ShardTensor cannot be pickled: save x.to_local() and its sharding_sizes instead")

    def validate(self) -> ShardTensor:
        """Check the spec against the data and across ranks; return ``self``.

        Checks that the local length along the sharded dimension is ``sharding_sizes[rank]`` and
        that every rank of the mesh axis holds the same sharding sizes and global shape. Runs
        automatically in :meth:`from_local` under ``MESHSHARD_VALIDATE=1`` (or ``validate=True``).

        Raises
        ------
        ShardingError
            Naming the rank(s) that disagree and what each holds.

        **Communication:** one ``all_gather`` of ``P + ndim`` int64 per rank.
        """
        spec = self._spec
        with torch._C.DisableTorchFunctionSubclass():
            n_local = self.shape[spec.dim]
        _check_same_on_all_ranks(spec.sizes, spec.group, spec.rank, self.device, tuple(spec.global_shape), n_local)
        return self

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        try:
            return _dispatch(func, types, args, kwargs or {})
        except Exception as exc:  # name this rank as the culprit for peers blocked in a collective
            faults.report_failure(exc, faults._op_name(func))
            raise


def _dispatch(func, types, args, kwargs):
    """Bound to ``meshshard._dispatch.dispatch`` when that module loads (it imports this one)."""
    from . import ops  # noqa: F401  (registers the sharding rules, also when only this module was imported)
    from ._dispatch import dispatch

    return dispatch(func, types, args, kwargs)


def _wrap(local: torch.Tensor, spec: ShardSpec) -> ShardTensor:
    """``local`` (a plain tensor) as a ShardTensor with ``spec``: no copy, autograd kept."""
    out = local.as_subclass(ShardTensor)
    out._spec = spec
    return out


def _check_same_on_all_ranks(
    sizes: tuple[int, ...],
    group,
    rank: int,
    device,
    global_shape: tuple[int, ...] = (),
    n_local: int | None = None,
) -> None:
    """Raise :class:`ShardingError` on **every** rank unless all ranks hold the same sizes (and
    shape), and (given ``n_local``) every rank's local length is its entry of the sizes.

    One ``all_gather``; every rank sees every rank's view, so all raise together (none is left
    waiting in a later collective).
    """
    world = len(sizes)
    if dist.get_world_size(group) != world:
        raise ShardingError(
            f"[rank {rank}] the spec has {world} sharding sizes but the process group has "
            f"{dist.get_world_size(group)} ranks"
        )
    local = sizes[rank] if n_local is None else n_local
    mine = torch.tensor([*sizes, *global_shape, local], dtype=torch.long, device=device)
    everyone = comm.all_gather(mine, group).cpu()
    views = everyone[:, :-1]
    differ = [r for r in range(world) if not torch.equal(views[r], views[rank])]
    if differ:
        what = "sharding sizes" if any(not torch.equal(views[r, :world], views[rank, :world]) for r in differ) else (
            "global shapes"
        )
        detail = "; ".join(
            f"rank {r} has {tuple(views[r, :world].tolist())}"
            + (f" shape {tuple(views[r, world:].tolist())}" if global_shape else "")
            for r in range(world)
        )
        raise ShardingError(f"[rank {rank}] {what} disagree between ranks {[rank, *differ]}: {detail}")
    wrong = [r for r in range(world) if int(everyone[r, -1]) != sizes[r]]
    if wrong:
        detail = "; ".join(f"rank {r} holds {int(everyone[r, -1])} (sharding_sizes[{r}] = {sizes[r]})" for r in wrong)
        raise ShardingError(
            f"[rank {rank}] local shard lengths do not match the spec on ranks {wrong}: {detail}"
        )


class ReplicatedTensor(torch.Tensor):
    """A plain tensor that holds the same value on every rank of a domain group.

    Reductions over a sharded dimension return one. It behaves exactly like a ``torch.Tensor``
    except for :meth:`backward`, which seeds the gradient with ``1 / P`` on each of the ``P`` ranks:
    replicated values carry partial gradients that sum to the true one (see :mod:`meshshard.comm`),
    so ``loss.backward()`` followed by :func:`meshshard.nn.sync_gradients` gives the
    single-process parameter gradients.
    """

    _group_size: int = 1

    @staticmethod
    def _make(t: torch.Tensor, group_size: int) -> ReplicatedTensor:
        with torch._C.DisableTorchFunctionSubclass():
            out = t.as_subclass(ReplicatedTensor)
        out._group_size = group_size
        return out

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if not all(issubclass(cls, t) for t in types):
            return NotImplemented
        with torch._C.DisableTorchFunctionSubclass():
            ret = func(*args, **(kwargs or {}))
        if func is torch.Tensor.as_subclass:
            return ret
        return _as_replicated(ret, _first_group_size(args, kwargs))

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        if gradient is None:
            if self.numel() != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            gradient = torch.full_like(self.to_plain(), 1.0 / self._group_size)
        # Not under DisableTorchFunctionSubclass: that state would carry into the backward pass,
        # and a checkpointed block recomputed there would see plain tensors and skip its collectives.
        torch.autograd.backward(self.to_plain(), gradient, retain_graph, create_graph, inputs=inputs)

    def to_plain(self) -> torch.Tensor:
        """A plain-tensor alias (its ``backward()`` seeds 1, not ``1 / P``)."""
        with torch._C.DisableTorchFunctionSubclass():
            return self.as_subclass(torch.Tensor)


def _first_group_size(args, kwargs) -> int:
    for a in list(args) + list((kwargs or {}).values()):
        if isinstance(a, ReplicatedTensor):
            return a._group_size
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, ReplicatedTensor):
                    return b._group_size
    return 1


def _as_replicated(ret, size: int):
    if type(ret) is torch.Tensor:
        return ReplicatedTensor._make(ret, size)
    if hasattr(ret, "n_fields"):  # torch.return_types structseqs, e.g. (values, indices)
        return type(ret)(tuple(_as_replicated(r, size) for r in ret))
    if isinstance(ret, (list, tuple)):
        return type(ret)(_as_replicated(r, size) for r in ret)
    return ret


def scatter(
    global_tensor: torch.Tensor,
    partition: Any,
    mesh: DeviceMesh,
    dim: int = 0,
    *,
    mesh_dim: int | str | None = None,
) -> ShardTensor:
    """Keep this rank's shard of a tensor every rank can see (e.g. loaded from the same file).

    ``partition`` is a :class:`meshshard.partition.Partition` (rank r keeps
    ``global_tensor[perm[offsets[r]:offsets[r+1]]]``, i.e. partition order) or a sequence of
    sizes (rank r keeps the contiguous rows ``offsets[r]:offsets[r+1]``).

    **Communication:** none: every rank indexes its own rows.
    """
    if not isinstance(global_tensor, torch.Tensor):
        raise TypeError(f"Expected 'global_tensor' to be a torch.Tensor (got {type(global_tensor).__name__})")
    if isinstance(global_tensor, ShardTensor):
        raise TypeError("scatter expects a plain (global) tensor, got a ShardTensor")
    if global_tensor.dim() == 0:
        raise ValueError("global_tensor must have at least one dimension to shard (got a 0-d tensor)")
    if not -global_tensor.dim() <= dim < global_tensor.dim():
        raise ValueError(f"dim must be in [-{global_tensor.dim()}, {global_tensor.dim()}) (got {dim})")
    dim %= global_tensor.dim()
    mdim = _norm_mesh_dim(mesh, mesh_dim)
    rank = _local_rank_of(mesh, mdim)
    n = global_tensor.shape[dim]
    perm = getattr(partition, "perm", None)
    sizes = _as_sizes(partition.sizes if perm is not None else partition, "partition")
    if len(sizes) != mesh.size(mdim):
        raise ValueError(
            f"the partition has {len(sizes)} parts but mesh axis {mdim} has {mesh.size(mdim)} ranks"
        )
    if sum(sizes) != n:
        raise ValueError(f"the partition covers {sum(sizes)} points but global_tensor has {n} along dim {dim}")
    start = sum(sizes[:rank])
    if perm is not None and (not isinstance(perm, torch.Tensor) or perm.numel() != n):
        raise ValueError(f"partition.perm must be a tensor of {n} indices (got {getattr(perm, 'shape', perm)})")
    if perm is None:
        local = global_tensor.narrow(dim, start, sizes[rank])
    else:
        idx = perm[start : start + sizes[rank]].to(global_tensor.device)
        local = global_tensor.index_select(dim, idx)
    return ShardTensor.from_local(local, mesh, sizes=sizes, dim=dim, mesh_dim=mdim, validate=False)
