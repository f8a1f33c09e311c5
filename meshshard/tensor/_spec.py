"""``ShardSpec``: where a sharded tensor lives (metadata only, no data); offsets come from :mod:`meshshard._sizes`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from .._checks import check_int_sequence
from .._sizes import offsets_of
from ..device_mesh import axis_group_rank
from ._compile import parse_key, spec_key, tracing

__all__ = ["ShardSpec", "offsets_of"]



@dataclass(frozen=True)
class ShardSpec:
    """Where a sharded tensor lives: metadata only, identical on every rank.

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
    node_sizes:
        ``None``, or the sharding sizes of the *nodes* that the rows along ``dim`` belong to: every
        row this rank holds (an edge, a message) targets a node this rank owns under ``node_sizes``.
        Set by :func:`meshshard.ops.shard_edges` and carried by the ops that keep rows (pointwise
        ops, row subsets, rows gathered with such an index); ``x.new_zeros((N_nodes, ...))`` of such
        a tensor is sharded like the nodes, so a scatter's output is sharded without a guess (see
        :mod:`meshshard.tensor._rules._scatter`). Identical on every rank, like the rest of the spec.
    """

    mesh: DeviceMesh = field(compare=False)
    mesh_dim: int
    dim: int
    sizes: tuple[int, ...]
    global_shape: torch.Size
    mesh_id: int = field(default=0, repr=False)
    node_sizes: tuple[int, ...] | None = field(default=None, compare=False, repr=False)
    _moved: dict = field(default_factory=dict, compare=False, repr=False, hash=False)
    _axis: tuple | None = field(default=None, compare=False, repr=False, hash=False)
    # "dim;mesh_dim;sizes;global_shape;node_sizes": what a compiled graph is guarded on (set outside traced
    # code; traced code reads a graph input's spec through it: meshshard.tensor._compile)
    _key: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        if self._axis is None and self.mesh is not None:  # (group, rank), looked up once: dynamo cannot read a mesh
            object.__setattr__(self, "_axis", axis_group_rank(self.mesh, self.mesh_dim))
        ndim = len(self.global_shape)
        if not 0 <= self.dim < ndim:
            raise ValueError(f"dim must be in [0, {ndim}) for a {ndim}-d global shape (got {self.dim})")
        if any(s < 0 for s in self.sizes):
            raise ValueError(f"sizes must be non-negative (got {list(self.sizes)})")
        if sum(self.sizes) != self.global_shape[self.dim]:
            raise ValueError(
                f"sizes must sum to global_shape[dim] = {self.global_shape[self.dim]} (got sum {sum(self.sizes)})"
            )
        if not tracing():  # the guard key of a compiled graph that takes this spec as input (see guard_key)
            object.__setattr__(self, "_key", spec_key(self.dim, self.mesh_dim, self.sizes, self.global_shape,
                                                      self.node_sizes))

    @property
    def group(self) -> dist.ProcessGroup:
        return self._axis[0] if self._axis is not None else axis_group_rank(self.mesh, self.mesh_dim)[0]

    @property
    def rank(self) -> int:
        """This process's rank along the mesh axis (the index of its shard)."""
        return self._axis[1] if self._axis is not None else axis_group_rank(self.mesh, self.mesh_dim)[1]

    @property
    def num_ranks(self) -> int:
        return len(self.sizes)

    @property
    def offsets(self) -> tuple[int, ...]:
        hit = self._moved.get("offsets")
        if hit is None:
            hit = offsets_of(self.sizes)
            if not tracing():
                self._moved["offsets"] = hit
        return hit

    @property
    def num_global(self) -> int:
        return self.global_shape[self.dim]

    @property
    def ndim(self) -> int:
        return len(self.global_shape)

    def static_copy(self) -> ShardSpec:
        """Traced code: this (graph input's) spec rebuilt from the constants of its guard key."""
        dim, mesh_dim, sizes, shape, nodes = parse_key(self._key)
        return ShardSpec(self.mesh, mesh_dim, dim, sizes, torch.Size(shape), self.mesh_id, nodes, _axis=self._axis)

    def as_traced(self) -> ShardSpec:
        """This spec; in traced code, its :meth:`static_copy` (for a spec held by a module or a graph, not by
        a tensor argument: its ints are then constants guarded by one string, never symbols)."""
        if tracing() and self._key is not None:
            return self.static_copy()
        return self

    def local_length(self) -> int:
        return self.sizes[self.rank]

    def same_sharding(self, other: ShardSpec) -> bool:
        return self.mesh_id == other.mesh_id and self.mesh_dim == other.mesh_dim and self.sizes == other.sizes

    def moved(self, dim: int, local_shape: Sequence[int]) -> ShardSpec:
        """The spec of a local result of shape ``local_shape`` sharded along ``dim`` with the same sizes.

        Only the sharded dim's length differs between ranks, so the global shape is the local one
        with ``dim`` replaced by ``N_global`` (memoised: called on every op).
        """
        key = (dim, tuple(local_shape))
        hit = self._moved.get(key)
        if hit is None:
            shape = list(local_shape)
            shape[dim] = self.num_global
            if dim == self.dim and torch.Size(shape) == self.global_shape:
                hit = self
            else:
                hit = ShardSpec(self.mesh, self.mesh_dim, dim, self.sizes, torch.Size(shape), self.mesh_id,
                                self.node_sizes, _axis=self._axis)
            if len(self._moved) < 64 and not tracing():  # a traced spec does not outlive its trace
                self._moved[key] = hit
        return hit

    def resized(self, dim: int, sizes: Sequence[int], global_shape: Sequence[int]) -> ShardSpec:
        """A spec on the same mesh axis with new sizes (slices, masks, reshapes that scale the shard).

        Rows stay on their rank, so ``node_sizes`` is kept.
        """
        return ShardSpec(self.mesh, self.mesh_dim, dim, tuple(int(s) for s in sizes), torch.Size(global_shape),
                         self.mesh_id, self.node_sizes, _axis=self._axis)

    def with_node_sizes(self, node_sizes: Sequence[int] | None) -> ShardSpec:
        """This spec with ``node_sizes`` set (rows held by the owner of the node they target)."""
        return ShardSpec(self.mesh, self.mesh_dim, self.dim, self.sizes, self.global_shape, self.mesh_id,
                         None if node_sizes is None else tuple(int(s) for s in node_sizes), _axis=self._axis)

    def local_shape_of(self, global_shape: Sequence[int], dim: int | None = None) -> list[int]:
        """This rank's shape of a tensor of ``global_shape`` sharded like this spec along ``dim``."""
        shape = list(global_shape)
        shape[self.dim if dim is None else dim] = self.local_length()
        return shape


def as_sizes(value: Any, name: str, check_sign: bool = True) -> tuple[int, ...]:
    """``value`` (a sequence or 1-D tensor of non-negative ints) as a tuple (``_checks.check_int_sequence``)."""
    return check_int_sequence(value, name, minimum=0 if check_sign else None)


def norm_mesh_dim(mesh: DeviceMesh, mesh_dim: int | str | None) -> int:
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
