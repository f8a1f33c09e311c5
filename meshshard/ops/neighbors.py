"""Exact, partition-invariant neighbour search on sharded point clouds: ball query and kNN.

Semantics (the same for every world size, partition and kernel backend)
-----------------------------------------------------------------------
* Distances are Euclidean, computed as float64 squared distances from the given coordinates with
  one fixed formula; the ball is **closed**: a point at distance exactly ``radius`` is a neighbour.
* Within a row, neighbours are ordered by distance, ties by smaller **id**; truncation to
  ``max_neighbors`` keeps the first ones, i.e. the nearest. The ids are the ``ids=`` argument
  (e.g. each point's row in the original, unpartitioned cloud) or, by default, the **global
  index** (position in ``points.full_tensor()``).
* ``knn`` returns the ``k`` first points of that order over all points (fewer when there are fewer
  than ``k`` points in total).

So a sharded result, mapped with :meth:`Neighbors.global_index`, equals the single-process result
on the gathered points, unlike torch-cluster (traversal-order truncation) or a ring-based ball
query (rank-order truncation). With ``ids=`` the neighbour *sets* and their order, seen through
:meth:`Neighbors.global_ids`, are the same for every partition and world size, even when many
points are exactly equidistant (an integer lattice).

The local kernel is the fused grid kernel of :mod:`meshshard.kernels._fused` (numba; CPU and
CUDA) by default; ``backend=`` selects another one with identical results.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import faults
from .._checks import check_positive_int, check_radius
from ..errors import ShardingError
from ..halo import HaloPlan, ValueVerdict, build_plan, check_coordinate_tensor, check_values, value_verdict
from ..kernels import check_backend, knn_bound, nearest_neighbors
from ..tensor import ShardSpec, ShardTensor, local_of

__all__ = ["Neighbors", "ball_query", "knn"]


@dataclass
class Neighbors:
    """Per-query neighbour lists in the index space of the plan's extended tensor.

    Attributes
    ----------
    index : LongTensor ``(M_local, K)``
        Rows of ``plan.exchange(points)`` (``[owned; ghosts]``), ``-1`` padded; ordered by distance,
        ties by global index.
    count : LongTensor ``(M_local,)``
        Valid entries per row (``index[i, :count[i]] >= 0``).
    plan : HaloPlan
        ``plan.exchange(features)`` gives the extended tensor that ``index`` addresses.
    distances : Tensor ``(M_local, K)`` or None
        Euclidean distances in the points' dtype, ``inf`` padded (when requested).
    query_spec : ShardSpec or None
        Sharding of the queries (``None`` on plain tensors): lets layers return ShardTensors.
    point_ids : LongTensor ``(N_local + N_ghost,)`` or None
        The ``ids=`` of every row of the extended tensor (``None`` when no ids were given).
    """

    index: torch.Tensor
    count: torch.Tensor
    plan: HaloPlan
    distances: torch.Tensor | None = None
    query_spec: ShardSpec | None = field(default=None, repr=False)
    point_ids: torch.Tensor | None = field(default=None, repr=False)

    @property
    def num_queries(self) -> int:
        return self.index.shape[0]

    @property
    def max_neighbors(self) -> int:
        return self.index.shape[1]

    def global_index(self) -> torch.Tensor:
        """``(M_local, K)`` positions in ``points.full_tensor()``, ``-1`` padded, same order as ``index``."""
        return self.plan.to_global(self.index)

    def global_ids(self) -> torch.Tensor:
        """``(M_local, K)`` ids (the ``ids=`` given to the search) of the neighbours, ``-1`` padded.

        Without ``ids=`` this is :meth:`global_index`. With them it does not depend on the
        partition: compare results of different partitions or world sizes through it.
        """
        if self.point_ids is None:
            return self.global_index()
        table = self.point_ids.to(self.index.device)
        table = torch.cat([table, table.new_full((1,), -1)])
        return table[torch.where(self.index >= 0, self.index, table.shape[0] - 1)]

    def to_edge_index(self, global_index: bool = False) -> torch.Tensor:
        """PyG ``edge_index`` ``(2, E)``: row 0 the neighbour (source), row 1 the query (target).

        Sources address the extended tensor (``global_index=True``: global positions), targets
        the local queries; edges are grouped by query in row order (CSR order), so use it with
        ``MessagePassing`` on the bipartite pair ``(plan.exchange(x), x_queries)``.
        """
        valid = self.index >= 0
        rows = torch.arange(self.num_queries, device=self.index.device)[:, None].expand_as(self.index)
        source = (self.global_index() if global_index else self.index)[valid]
        return torch.stack([source, rows[valid]])

    def to_csr(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rowptr, col)``: ``col[rowptr[i]:rowptr[i + 1]]`` are query ``i``'s neighbours."""
        rowptr = torch.zeros(self.num_queries + 1, dtype=torch.long, device=self.index.device)
        torch.cumsum(self.count, 0, out=rowptr[1:])
        return rowptr, self.index[self.index >= 0]


# -- argument checks ---------------------------------------------------------------------------------

def check_pair(points: object, queries: object) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Validated ``(points, queries, self_query)``; ``queries=None`` means the points themselves."""
    points, queries, self_query = check_pair_metadata(points, queries)
    check_values(points, "points")
    if not self_query:
        check_values(queries, "queries")
    return points, queries, self_query


def _pair_verdicts(points: torch.Tensor, queries: torch.Tensor, self_query: bool) -> tuple[ValueVerdict, ...]:
    """The value checks of :func:`check_pair`, a ShardTensor's NaN/Inf verdicts left to the plan to agree."""
    return value_verdict(points, "points") + (() if self_query else value_verdict(queries, "queries"))


def check_pair_metadata(points: object, queries: object) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """:func:`check_pair` from metadata only (types, shapes, meshes, devices): the same verdict on every rank."""
    points = check_coordinate_tensor(points, "points")
    if queries is None or queries is points:
        return points, points, True
    queries = check_coordinate_tensor(queries, "queries")
    if queries.shape[1] != points.shape[1]:
        raise ValueError(
            f"points and queries must have the same dimension D (got {points.shape[1]} and {queries.shape[1]})"
        )
    p_sharded, q_sharded = isinstance(points, ShardTensor), isinstance(queries, ShardTensor)
    if p_sharded != q_sharded:
        raise TypeError(
            "points and queries must both be ShardTensors or both plain tensors "
            f"(got {type(points).__name__} and {type(queries).__name__})"
        )
    if p_sharded:
        ps, qs = points.spec, queries.spec
        if ps.mesh_id != qs.mesh_id or ps.mesh_dim != qs.mesh_dim:
            raise ShardingError(
                f"[rank {ps.rank}] points and queries must be sharded over the same mesh axis "
                f"(got mesh {ps.mesh_id} axis {ps.mesh_dim} and mesh {qs.mesh_id} axis {qs.mesh_dim})"
            )
    if points.device != queries.device:
        raise ValueError(f"points and queries must be on one device (got {points.device} and {queries.device})")
    return points, queries, False


def _check_ids(ids: object, points: torch.Tensor) -> torch.Tensor | None:
    """The local ``(N_local,)`` int64 ids, checked against ``points`` from metadata only."""
    if ids is None:
        return None
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"ids must be a torch.Tensor or ShardTensor of point ids (got {type(ids).__name__})")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"ids must hold integers (got {ids.dtype})")
    if isinstance(points, ShardTensor) != isinstance(ids, ShardTensor):
        raise TypeError(
            "ids must be sharded like the points: both ShardTensors or both plain tensors "
            f"(got {type(points).__name__} points and {type(ids).__name__} ids)"
        )
    if isinstance(ids, ShardTensor):
        if ids.shard_dim != 0 or ids.to_local().dim() != 1 or ids.sharding_sizes != points.sharding_sizes:
            raise ValueError(
                "ids must be a 1-d ShardTensor with the points' sharding sizes "
                f"{points.sharding_sizes} (got sizes {ids.sharding_sizes} and shape {tuple(ids.global_shape)})"
            )
    elif ids.dim() != 1 or ids.shape[0] != points.shape[0]:
        raise ValueError(f"ids must have shape ({points.shape[0]},), one per point (got {tuple(ids.shape)})")
    return local_of(ids).detach().to(points.device, torch.long)


def extended_ids(
    local_ids: torch.Tensor | None, points: torch.Tensor, plan: HaloPlan
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(tie-break ids of [owned; ghosts] for the kernel, ids kept in Neighbors)``."""
    if local_ids is None:
        gidx = plan.extended_global_index.to(points.device) if plan.group is not None else None
        return gidx, None
    ext = plan.exchange(local_ids) if plan.group is not None else local_ids
    return ext, ext



def _finish(
    index: torch.Tensor,
    count: torch.Tensor,
    dist2: torch.Tensor,
    plan: HaloPlan,
    queries: torch.Tensor,
    dtype: torch.dtype,
    return_distances: bool,
    point_ids: torch.Tensor | None,
) -> Neighbors:
    distances = dist2.sqrt().to(dtype) if return_distances else None
    spec = queries.spec if isinstance(queries, ShardTensor) else None
    return Neighbors(
        index=index, count=count, plan=plan, distances=distances, query_spec=spec, point_ids=point_ids
    )


# -- ops ---------------------------------------------------------------------------------------------
@faults.entry
def ball_query(
    points: ShardTensor | torch.Tensor,
    queries: ShardTensor | torch.Tensor | None,
    radius: float,
    max_neighbors: int,
    *,
    return_distances: bool = False,
    backend: str | None = None,
    plan: HaloPlan | None = None,
    regions: torch.Tensor | None = None,
    ids: ShardTensor | torch.Tensor | None = None,
) -> Neighbors:
    r"""All points within ``radius`` of each query (closed ball), nearest ``max_neighbors`` first.

    For query :math:`q` the result is :math:`\{p : \|p - q\| \le r\}` sorted by distance, ties by
    id (``ids``, default the global index), truncated to ``max_neighbors``. Identical for every
    world size and partition.

    Parameters
    ----------
    points:
        ``(N_local, D)`` coordinates: a ShardTensor sharded along dim 0, or a plain tensor
        (single process).
    queries:
        ``(M_local, D)`` query coordinates sharded over the same mesh axis (e.g. volume points
        querying surface points), or ``None`` / ``points`` itself for a self query (every point
        finds itself).
    radius:
        Positive finite radius.
    max_neighbors:
        ``K >= 1``: the row width of ``index``.
    return_distances:
        Also fill :attr:`Neighbors.distances`.
    backend:
        Local kernel: ``"numba"`` (the fused grid kernel, CPU and CUDA; the default when numba is
        installed), ``"scipy"`` (k-d tree), ``"grid"`` (pure-torch cell list) or
        ``"torch_cluster"``; all give identical results.
    plan:
        Reuse a plan built for these points and queries with a radius ``>= radius`` (no
        communication at all then).
    regions:
        ``(P, 2, D)`` boxes containing each rank's queries: saves the plan's all-gather.
    ids:
        ``(N_local,)`` integer ids of the points, unique over all ranks, sharded like the points
        (e.g. ``ms.scatter(torch.arange(N), part, mesh)``: each point's row in the original
        cloud). Equidistant points are ordered by them, so :meth:`Neighbors.global_ids` is the
        same for every partition. Default: the global index.

    Returns
    -------
    Neighbors
        ``index`` ``(M_local, K)`` into ``plan.exchange(points)``, ``count`` ``(M_local,)``,
        ``global_index()``, ``plan``.

    **Communication:** building the plan (see :meth:`HaloPlan.build`): one small ``all_gather``
    and three ``all_to_all`` (counts, candidate coordinates in float64, keep mask). The query
    itself is local. With ``ids`` on a ShardTensor: one more ``all_to_all`` (the ghosts' ids,
    int64, :meth:`HaloPlan.exchange`). Nothing else on plain tensors or with a given ``plan``.

    Examples
    --------
    >>> import torch
    >>> pts = torch.tensor([[0.0], [1.0], [3.0], [1.0]])
    >>> nbr = ball_query(pts, None, 1.0, 3)
    >>> nbr.index.tolist(), nbr.count.tolist()
    ([[0, 1, 3], [1, 3, 0], [2, -1, -1], [1, 3, 0]], [3, 3, 1, 3])
    """
    points, queries, self_query = check_pair_metadata(points, queries)
    radius = check_radius(radius)
    max_neighbors = check_positive_int(max_neighbors, "max_neighbors")
    backend = check_backend(backend, points.device)
    local_ids = _check_ids(ids, points)
    local_points, local_queries = local_of(points).detach(), local_of(queries).detach()
    if plan is None:
        # metadata and radius are checked above; the values' verdicts are agreed in the plan's counts exchange
        plan = build_plan(
            points, None if self_query else queries, radius * radius, regions=regions, backend=backend,
            verdicts=_pair_verdicts(points, queries, self_query),
        )
    else:
        check_pair(points, queries)  # no communication with a given plan: the values are checked here
        if not isinstance(plan, HaloPlan):
            raise TypeError(f"plan must be a HaloPlan (got {type(plan).__name__})")
        if plan.radius is None or plan.radius < radius or plan.num_owned != local_points.shape[0]:
            raise ValueError(
                f"plan must be built for these {local_points.shape[0]} points with a radius >= {radius} "
                f"(got a plan for {plan.num_owned} points with radius {plan.radius})"
            )
    ext_points = (
        torch.cat([local_points, plan.ghost_points.to(local_points.device)]) if plan.num_ghosts else local_points
    )
    gidx, kept_ids = extended_ids(local_ids, points, plan)
    index, count, dist2 = nearest_neighbors(
        ext_points,
        local_queries,
        max_neighbors,
        radius * radius,
        point_gidx=gidx,
        backend=backend,
        queries_are_prefix=self_query,
    )
    return _finish(index, count, dist2, plan, queries, points.dtype, return_distances, kept_ids)


@faults.entry
def knn(
    points: ShardTensor | torch.Tensor,
    queries: ShardTensor | torch.Tensor | None,
    k: int,
    *,
    return_distances: bool = False,
    backend: str | None = None,
    ids: ShardTensor | torch.Tensor | None = None,
) -> Neighbors:
    """The ``k`` nearest points of each query, exactly (ties by id), on any partition.

    Parameters
    ----------
    points, queries:
        As in :func:`ball_query` (``queries=None``: the points; each point is its own nearest).
    k:
        ``k >= 1``; rows have fewer valid entries only when there are fewer than ``k`` points.
    return_distances, backend, ids:
        As in :func:`ball_query`.

    Returns
    -------
    Neighbors
        ``index`` ``(M_local, k)`` into ``plan.exchange(points)``.

    Algorithm: a local pass over the owned points gives each query an upper bound ``b_q`` on its
    squared ``k``-th distance (``inf`` when the rank owns fewer than ``k`` points); a halo with
    per-query radii ``sqrt(b_q)`` brings every point that can be among the ``k`` nearest; an exact
    second pass over ``[owned; ghosts]`` selects them.

    **Communication:** one halo plan with per-query radii (one small ``all_gather``, three
    ``all_to_all``), plus one ``all_to_all`` of the ghosts' ids with ``ids``; nothing on plain
    tensors. A rank that owns fewer than ``k`` points receives every point.
    """
    points, queries, self_query = check_pair_metadata(points, queries)
    k = check_positive_int(k, "k")
    backend = check_backend(backend, points.device)
    local_ids = _check_ids(ids, points)
    verdicts = _pair_verdicts(points, queries, self_query)  # plain tensors: checked here
    local_points, local_queries = local_of(points).detach(), local_of(queries).detach()
    if isinstance(points, ShardTensor):
        # a rank with NaN/Inf rows skips the local bound: build_plan raises on every rank after its counts
        bad = any(v.bad_rows for v in verdicts)
        bound = (torch.zeros(0, dtype=torch.float64, device=local_points.device) if bad
                 else knn_bound(local_points, local_queries, k, backend=backend, strict=True))
        plan = build_plan(points, None if self_query else queries, bound, backend=backend, verdicts=verdicts)
        ext_points = torch.cat([local_points, plan.ghost_points.to(local_points.device)])
    else:
        plan = build_plan(points, queries, torch.zeros(0, dtype=torch.float64), backend=backend)
        ext_points = local_points
    gidx, kept_ids = extended_ids(local_ids, points, plan)
    index, count, dist2 = nearest_neighbors(ext_points, local_queries, k, point_gidx=gidx, backend=backend)
    return _finish(index, count, dist2, plan, queries, points.dtype, return_distances, kept_ids)
