"""Sharded graphs: the halo-extended local graph that exact domain-parallel message passing needs.

A graph is split by **targets**: rank ``r`` owns every edge whose target node it owns (nodes are
sharded like the point coordinates, a :class:`~meshshard.ShardTensor` along dim 0). An edge's
source may live on another rank: such sources are the rank's *ghosts*, and a
:class:`~meshshard.HaloPlan` built from their ids brings their features. The local graph has
nodes ``[owned; ghosts]`` and an ``edge_index`` over those rows, so any message-passing layer run
on ``plan.exchange(x)`` computes every owned node's exact output (every incoming edge of an owned
node is local).

With ``hops=k`` the halo is the k-hop in-neighbourhood: the local graph also holds every incoming
edge of the ghosts up to ``k - 1`` hops away, so ``k`` layers can run after **one** exchange and
still be exact on the owned rows (the ghosts' rows become wrong one hop per layer, from outside in).

Why by hand: PyG's distributed package samples neighbourhoods of mini-batches; nothing in the
ecosystem builds the exact full-graph halo of one graph split over ranks, so this module does,
with ``meshshard.comm`` collectives only to find the ghosts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from .. import comm, faults
from .._checks import check_positive_int
from .._records import Record
from .._sizes import offsets_of, owner_of, ring_bytes
from ..halo import HaloPlan, check_coordinates
from ..partition import MeshPartition, Partition
from ..tensor import ShardSpec, ShardTensor, local_of, tracing, wrap_shard
from .neighbors import Neighbors

__all__ = ["ShardedGraph", "ShardedEdges", "cells_to_edges", "shard_edges", "simulate_graph_halo", "GraphHaloReport"]


def cells_to_edges(cells: torch.Tensor, mode: str = "cycle") -> torch.Tensor:
    """Undirected mesh edges of ``cells`` as a directed ``edge_index`` ``(2, E)`` (both directions, unique).

    Parameters
    ----------
    cells:
        ``(C, F)`` integer point ids per cell (``-1`` pads cells with fewer corners).
    mode:
        ``"cycle"``: consecutive corners, closing the polygon (triangles, quads: the surface mesh
        graph MeshGraphNet uses); ``"all"``: every pair of corners (tetrahedra, cliques).

    Returns
    -------
    LongTensor ``(2, E)``
        Sorted by (target, source): row 0 sources, row 1 targets; no self loops, no duplicates.

    **Communication:** none (a local function of the cells it is given).
    """
    if not isinstance(cells, torch.Tensor) or cells.dim() != 2 or cells.is_floating_point():
        raise TypeError(f"cells must be an integer tensor of shape (C, F) (got {getattr(cells, 'shape', cells)!r})")
    if mode not in ("cycle", "all"):
        raise ValueError(f"mode must be 'cycle' or 'all' (got {mode!r})")
    cells = cells.long()
    num_corners = cells.shape[1]
    if mode == "cycle":
        if num_corners < 2:
            pairs = cells.new_zeros((0, 2))
        else:
            # -1 padding: close each polygon on its last valid corner
            valid = cells >= 0
            last = cells.gather(1, (valid.sum(1, keepdim=True) - 1).clamp(min=0))
            filled = torch.where(valid, cells, last)
            pairs = torch.stack([filled, filled.roll(-1, 1)], -1).reshape(-1, 2)
    else:
        a, b = torch.triu_indices(num_corners, num_corners, 1)
        pairs = torch.stack([cells[:, a], cells[:, b]], -1).reshape(-1, 2)
    pairs = pairs[(pairs >= 0).all(1) & (pairs[:, 0] != pairs[:, 1])]
    both = torch.cat([pairs, pairs.flip(1)])
    key = torch.unique(both[:, 1] * (int(cells.max().clamp(min=0)) + 1) + both[:, 0])
    n = int(cells.max().clamp(min=0)) + 1
    return torch.stack([key % n, key // n])


@dataclass
class ShardedGraph:
    """This rank's part of a graph split by targets, with the halo of its edges' sources.

    Build with :meth:`from_edges`, :meth:`from_cells` or :meth:`from_neighbors`.

    Attributes
    ----------
    plan : HaloPlan
        Brings the ghosts: ``plan.exchange(x)`` is ``[owned; ghosts]`` (``num_nodes`` rows).
    edge_index : LongTensor ``(2, E_local)``
        Source and target rows of the extended tensor; targets are owned (``< num_owned``) with
        ``hops=1``; with more hops, ghosts closer than ``hops`` also have their incoming edges.
    edge_id : LongTensor ``(E_local,)``
        Position of each local edge in the edge list the graph was built from (the owner's list
        for an edge fetched from another rank).
    in_degree : LongTensor ``(num_nodes,)``
        Global in-degree of every extended node (what ``GCNConv`` normalises with).
    self_loops : LongTensor ``(num_nodes,)``
        How many of those incoming edges are self loops.
    pos : Tensor ``(num_nodes, D)``
        Coordinates of the extended nodes.
    hops : int
        Layers the halo covers per exchange.
    spec : ShardSpec or None
        Sharding of the nodes (``None`` for a single-process graph on plain tensors).
    """

    plan: HaloPlan
    edge_index: torch.Tensor
    edge_id: torch.Tensor
    in_degree: torch.Tensor
    self_loops: torch.Tensor
    pos: torch.Tensor
    hops: int = 1
    spec: ShardSpec | None = field(default=None, repr=False)

    # -- sizes ----------------------------------------------------------------------------------
    @property
    def num_owned(self) -> int:
        return self.plan.num_owned

    @property
    def num_nodes(self) -> int:
        """Rows of the extended tensor: owned nodes and ghosts."""
        return self.plan.num_owned + self.plan.num_ghosts

    @property
    def num_ghosts(self) -> int:
        return self.plan.num_ghosts

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])

    @property
    def global_index(self) -> torch.Tensor:
        """``(num_nodes,)`` global node id of every extended row."""
        return self.plan.extended_global_index

    def global_edge_index(self) -> torch.Tensor:
        """``(2, E_local)`` the local edges in global node ids."""
        return self.global_index.to(self.edge_index.device)[self.edge_index]

    def owned_edges(self) -> torch.Tensor:
        """Boolean ``(E_local,)``: edges whose target is owned (each graph edge is owned by one rank)."""
        return self.edge_index[1] < self.num_owned

    # -- features ---------------------------------------------------------------------------------
    @faults.entry
    def exchange(self, x: ShardTensor | torch.Tensor) -> torch.Tensor:
        """``[owned; ghosts]`` rows of a per-node tensor (see :meth:`HaloPlan.exchange`).

        **Communication:** one ``all_to_all`` forward, one backward (none single-process).
        """
        return self.plan.exchange(x)

    def edge_vectors(self, pos: ShardTensor | torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(pos_source - pos_target, |.|)`` per local edge: ``(E_local, D)`` and ``(E_local, 1)``.

        ``pos=None`` uses the coordinates the graph was built from (no communication); a per-node
        ``(N_local, D)`` tensor is exchanged first (differentiable: one ``all_to_all`` forward and
        one backward). Equal to the single-process values edge by edge.
        """
        ext = self.pos if pos is None else self.exchange(pos)
        src, dst = self.edge_index
        rel = ext[src] - ext[dst]
        return rel, rel.norm(dim=-1, keepdim=True)

    def wrap(self, local: torch.Tensor) -> ShardTensor | torch.Tensor:
        """Owned per-node rows as a ShardTensor sharded like the nodes (plain tensor single-process)."""
        if self.spec is None:
            return local
        if tracing():  # the nodes' spec moved to this tensor's shape, from constants (no mesh lookup traced)
            return wrap_shard(local, self.spec.as_traced().moved(0, local.shape))
        return ShardTensor.from_local(
            local, self.spec.mesh, sizes=self.spec.sizes, mesh_dim=self.spec.mesh_dim, validate=False
        )

    def bytes_per_exchange(self, row_bytes: int | torch.Tensor) -> dict[str, int]:
        """Bytes this rank sends and receives per exchange (see :meth:`HaloPlan.bytes_per_exchange`)."""
        return self.plan.bytes_per_exchange(row_bytes)

    # -- construction -----------------------------------------------------------------------------
    @classmethod
    @faults.entry
    def from_edges(
        cls,
        points: ShardTensor | torch.Tensor,
        edge_index: torch.Tensor,
        *,
        hops: int = 1,
        partition: Partition | MeshPartition | None = None,
    ) -> ShardedGraph:
        """Build from a global edge list.

        Parameters
        ----------
        points:
            ``(N_local, D)`` node coordinates, a ShardTensor sharded along dim 0 (plain tensor:
            single process). Node ids are positions in ``points.full_tensor()``.
        edge_index:
            ``(2, E)`` global ids (row 0 sources, row 1 targets), identical on every rank or any
            list that holds every edge into this rank's nodes (this rank keeps exactly those).
            Multi-edges are kept; their order is the list's.
        hops:
            Halo depth: ``k`` layers per exchange. For ``k > 1`` the incoming edges of the ghosts
            closer than ``k`` hops are asked from their owners (see Communication).
        partition:
            A :class:`~meshshard.partition.Partition` (or ``MeshPartition``: its points) when
            ``edge_index`` holds the *original* point ids and ``points`` were scattered with it
            (``ms.scatter(points, partition, mesh)``): ids are relabelled to partition order.

        **Communication:** one ``all_to_all`` round per extra hop to fetch the ghosts' incoming
        edges from their owners (four ``all_to_all``: counts, ids, edge counts, edges), then
        :meth:`HaloPlan.from_ghost_ids` (three ``all_to_all``) and one ``all_to_all`` of the
        owned in-degrees. Nothing on a plain tensor.
        """
        check_coordinates(points, "points")
        local = local_of(points)
        edge_index = _check_edge_index(edge_index, local.device)
        if partition is not None:
            edge_index = _relabel(edge_index, partition)
        lo, hi = _owned_range(points)
        n_global = _num_global(points)
        if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= n_global):
            raise ValueError(
                f"edge_index must hold node ids in [0, {n_global}) "
                f"(got [{int(edge_index.min())}, {int(edge_index.max())}])"
            )
        mine = (edge_index[1] >= lo) & (edge_index[1] < hi)
        eid = mine.nonzero().flatten()
        return cls._build(points, edge_index[0, eid], edge_index[1, eid], eid, hops)

    @classmethod
    @faults.entry
    def from_cells(
        cls,
        points: ShardTensor | torch.Tensor,
        cells: torch.Tensor,
        *,
        mode: str = "cycle",
        hops: int = 1,
        partition: Partition | MeshPartition | None = None,
    ) -> ShardedGraph:
        """Build the mesh graph (both directions of every cell edge, see :func:`cells_to_edges`).

        ``cells`` ``(C, F)`` are global point ids (the points' order after partitioning), the same
        on every rank or any subset holding every cell that touches this rank's points; with
        ``partition``, original point ids (see :meth:`from_edges`).

        **Communication:** as :meth:`from_edges`.
        """
        edges = cells_to_edges(cells, mode).to(local_of(points).device)
        return cls.from_edges(points, edges, hops=hops, partition=partition)

    @classmethod
    @faults.entry
    def from_neighbors(
        cls, points: ShardTensor | torch.Tensor, nbr: Neighbors, *, hops: int = 1, self_loops: bool = False
    ) -> ShardedGraph:
        """Build the radius / kNN graph of :func:`ball_query` / :func:`knn` with queries = points.

        Edge ``j -> i`` for every neighbour ``j`` of query ``i`` (the PyG convention of
        ``Neighbors.to_edge_index``), in row order; ``self_loops=False`` drops ``i -> i``. The
        halo is rebuilt from the sources actually used (a kNN plan holds extra candidates).

        **Communication:** as :meth:`from_edges` (the neighbour search's own plan is not reused).
        """
        if not isinstance(nbr, Neighbors):
            raise TypeError(f"nbr must be a meshshard.ops.Neighbors (got {type(nbr).__name__})")
        local = local_of(points)
        if nbr.num_queries != local.shape[0]:
            raise ValueError(
                f"nbr must have one row per owned point (queries = points): expected {local.shape[0]}, "
                f"got {nbr.num_queries}"
            )
        lo, _ = _owned_range(points)
        k = nbr.max_neighbors
        valid = nbr.index >= 0
        src = nbr.global_index()[valid]
        rows = torch.arange(nbr.num_queries, device=src.device)[:, None].expand_as(nbr.index)
        slots = torch.arange(k, device=src.device)[None].expand_as(nbr.index)
        dst = rows[valid] + lo
        eid = dst * k + slots[valid]  # the single-process edge order
        if not self_loops:
            keep = src != dst
            src, dst, eid = src[keep], dst[keep], eid[keep]
        return cls._build(points, src, dst, eid, hops)

    @classmethod
    def _build(
        cls, points: ShardTensor | torch.Tensor, src: torch.Tensor, dst: torch.Tensor, eid: torch.Tensor, hops: int
    ) -> ShardedGraph:
        """Finish from this rank's owned edges in global ids (``dst`` owned)."""
        hops = check_positive_int(hops, "hops")
        local = local_of(points).detach()
        lo, hi = _owned_range(points)
        spec = points.spec if isinstance(points, ShardTensor) else None
        owned_src, owned_dst, owned_eid = src, dst, eid
        known = torch.zeros(0, dtype=torch.long, device=local.device)
        frontier = torch.unique(src[(src < lo) | (src >= hi)])
        for _ in range(hops - 1):
            known = torch.unique(torch.cat([known, frontier]))
            s, d, e = _fetch_in_edges(spec, frontier, owned_src, owned_dst, owned_eid, lo)
            src, dst, eid = torch.cat([src, s]), torch.cat([dst, d]), torch.cat([eid, e])
            new = torch.unique(s[(s < lo) | (s >= hi)])
            frontier = new[~torch.isin(new, known)]
        ghosts = torch.unique(torch.cat([known, frontier]))
        plan = HaloPlan.from_ghost_ids(points, ghosts)
        # edges in the single-process order (by target, then position in the list)
        order = torch.argsort(dst * (int(eid.max()) + 1 if eid.numel() else 1) + eid)
        src, dst, eid = src[order], dst[order], eid[order]
        rows = torch.stack([_to_rows(src, lo, hi, ghosts), _to_rows(dst, lo, hi, ghosts)])
        owned_deg = torch.stack(
            [
                torch.bincount(owned_dst - lo, minlength=hi - lo),
                torch.bincount(owned_dst[owned_src == owned_dst] - lo, minlength=hi - lo),
            ],
            1,
        )
        degrees = plan.exchange(owned_deg)
        pos = torch.cat([local, plan.ghost_points.to(local.device, local.dtype)])
        return cls(
            plan=plan,
            edge_index=rows,
            edge_id=eid,
            in_degree=degrees[:, 0],
            self_loops=degrees[:, 1],
            pos=pos,
            hops=hops,
            spec=spec,
        )

    def __repr__(self) -> str:
        return (
            f"ShardedGraph(rank={self.plan.rank}, num_owned={self.num_owned}, num_ghosts={self.num_ghosts}, "
            f"num_edges={self.num_edges}, hops={self.hops})"
        )


class ShardedEdges(NamedTuple):
    """A global edge list split by targets for the direct path (see :func:`shard_edges`)."""

    edge_index: ShardTensor
    edge_id: ShardTensor


@faults.entry
def shard_edges(
    edge_index: torch.Tensor,
    nodes: ShardTensor,
    *,
    self_loops: bool = False,
    partition: Partition | MeshPartition | None = None,
) -> ShardedEdges:
    """The edges into this rank's nodes, as ShardTensors that unchanged message-passing code runs on.

    The **direct path**: a PyG layer (or a hand-written ``x[src]`` ... ``index_add(0, dst, msg)``
    network) fed ShardTensor nodes and these edges gathers each edge's source rows from their owners
    (``x[src]`` moves every distinct remote row once: the halo) and scatters the messages into
    nodes sharded like ``nodes``, locally (every target is owned). The output is sharded like the
    nodes; no rank holds more than its owned and ghost rows.

    How the scatter's output knows its sharding: ``edge_index`` carries the nodes' sharding sizes
    in its spec (``spec.node_sizes``), and so does every tensor made row by row from it (``src``,
    ``dst``, ``x[src]``, the messages); ``msg.new_zeros((N_nodes, C))``, which PyG's aggregation
    scatters into, is therefore sharded like the nodes (decided from the spec, alike on every rank).

    Parameters
    ----------
    edge_index:
        ``(2, E)`` global node ids (row 0 sources, row 1 targets), identical on every rank (or any
        list holding every edge into this rank's nodes: this rank keeps exactly those, in list order).
    nodes:
        A per-node ShardTensor sharded along dim 0 (features or positions): node ids are its global rows.
    self_loops:
        Drop the list's self loops and add one ``i -> i`` per node after this rank's edges: what
        ``GCNConv``/``GATConv``'s ``add_self_loops=True`` does to an unweighted graph; run those
        layers with ``add_self_loops=False`` on these edges (their own loop step concatenates a plain
        ``arange(N)``, which has no sharding).
    partition:
        As in :meth:`ShardedGraph.from_edges`: the list holds original point ids.

    Returns
    -------
    ShardedEdges
        ``edge_index``: ``(2, E)`` global ids, a ShardTensor sharded along dim 1 (this rank: the
        ``E_local`` edges into its nodes); ``edge_id``: ``(E,)`` sharded alike, each edge's position in
        the list (added loop ``i -> i``: ``E + i``), so ``edge_attr[edge_id]`` (a plain ``(E, F)``
        tensor, the same on every rank) is the edge features sharded like the edges, no communication.

    **Communication:** one ``all_gather`` of one int64 (the per-rank edge counts).
    """
    if not isinstance(nodes, ShardTensor) or nodes.shard_dim != 0:
        raise TypeError(f"nodes must be a ShardTensor sharded along dim 0 (got {type(nodes).__name__})")
    local = local_of(nodes)
    edge_index = _check_edge_index(edge_index, local.device)
    if partition is not None:
        edge_index = _relabel(edge_index, partition)
    n = _num_global(nodes)
    num_edges = int(edge_index.shape[1])
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= n):
        raise ValueError(f"edge_index must hold node ids in [0, {n}) "
                         f"(got [{int(edge_index.min())}, {int(edge_index.max())}])")
    lo, hi = _owned_range(nodes)
    mine = (edge_index[1] >= lo) & (edge_index[1] < hi)
    if self_loops:
        mine &= edge_index[0] != edge_index[1]
    eid = mine.nonzero().flatten()
    kept = edge_index[:, eid]
    if self_loops:
        loops = torch.arange(lo, hi, device=kept.device)
        kept = torch.cat([kept, loops.expand(2, -1)], 1)
        eid = torch.cat([eid, loops + num_edges])
    spec = nodes.spec
    ei = ShardTensor.from_local(kept.contiguous(), spec.mesh, dim=1, mesh_dim=spec.mesh_dim)
    ei._spec = ei._spec.with_node_sizes(spec.sizes)
    ids = ShardTensor.from_local(eid, spec.mesh, sizes=ei.sharding_sizes, mesh_dim=spec.mesh_dim, validate=False)
    ids._spec = ids._spec.with_node_sizes(spec.sizes)
    return ShardedEdges(ei, ids)


# -- helpers -------------------------------------------------------------------------------------------

def _owned_range(points: ShardTensor | torch.Tensor) -> tuple[int, int]:
    if isinstance(points, ShardTensor):
        off, r = points.offsets, points.spec.rank
        return off[r], off[r + 1]
    return 0, int(points.shape[0])


def _num_global(points: ShardTensor | torch.Tensor) -> int:
    return points.offsets[-1] if isinstance(points, ShardTensor) else int(points.shape[0])


def _check_edge_index(edge_index: torch.Tensor, device: torch.device) -> torch.Tensor:
    if (
        not isinstance(edge_index, torch.Tensor)
        or edge_index.is_floating_point()
        or edge_index.dim() != 2
        or edge_index.shape[0] != 2
    ):
        raise ValueError(
            f"edge_index must be an integer tensor of shape (2, E) (got {getattr(edge_index, 'shape', edge_index)!r})"
        )
    return edge_index.to(device=device, dtype=torch.long)


def _relabel(edge_index: torch.Tensor, partition: Partition | MeshPartition) -> torch.Tensor:
    """Original point ids -> positions in partition order."""
    part = partition.points if isinstance(partition, MeshPartition) else partition
    if not isinstance(part, Partition):
        raise TypeError(f"partition must be a meshshard Partition or MeshPartition (got {type(partition).__name__})")
    perm = part.perm
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= perm.numel()):
        raise ValueError(
            f"edge_index must hold original point ids in [0, {perm.numel()}) "
            f"(got [{int(edge_index.min())}, {int(edge_index.max())}])"
        )
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device=perm.device)
    return inverse.to(edge_index.device)[edge_index]


def _to_rows(ids: torch.Tensor, lo: int, hi: int, ghosts: torch.Tensor) -> torch.Tensor:
    """Global ids -> extended rows (owned ``id - lo``, ghosts ``num_owned + position``)."""
    owned = (ids >= lo) & (ids < hi)
    ghost_rows = (hi - lo) + torch.searchsorted(ghosts, ids)
    return torch.where(owned, ids - lo, ghost_rows)


def _fetch_in_edges(
    spec: ShardSpec | None,
    wanted: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    eid: torch.Tensor,
    lo: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The incoming edges of the other ranks' nodes ``wanted`` (sorted), asked from their owners.

    **Communication:** four ``all_to_all`` (request counts, ids, reply counts, edges).
    """
    empty = wanted.new_zeros(0)
    if spec is None:
        return empty, empty.clone(), empty.clone()
    group, world = spec.group, spec.num_ranks
    owner = owner_of(wanted, spec.offsets)
    ask = torch.bincount(owner, minlength=world)
    asked = comm.all_to_all(ask.reshape(world, 1), [1] * world, [1] * world, group).reshape(-1)
    ids = comm.all_to_all(wanted, ask.tolist(), asked.tolist(), group)
    # my owned edges grouped by target (CSR), then the edges of every requested id, requester by requester
    order = torch.argsort(dst - lo, stable=True)
    s_sorted, d_sorted, e_sorted = src[order], dst[order], eid[order]
    n_local = spec.offsets[spec.rank + 1] - spec.offsets[spec.rank]
    deg = torch.bincount(d_sorted - lo, minlength=n_local)
    start = torch.cumsum(deg, 0) - deg
    per_id = deg[ids - lo]
    take = torch.repeat_interleave(start[ids - lo], per_id) + (
        torch.arange(int(per_id.sum()), device=ids.device)
        - torch.repeat_interleave(torch.cumsum(per_id, 0) - per_id, per_id)
    )
    requester = torch.repeat_interleave(torch.arange(world, device=ids.device), asked)
    reply_counts = torch.zeros(world, dtype=torch.long, device=ids.device).index_add_(0, requester, per_id)
    payload = torch.stack([s_sorted[take], d_sorted[take], e_sorted[take]], 1)
    got_counts = comm.all_to_all(reply_counts.reshape(world, 1), [1] * world, [1] * world, group).reshape(-1)
    got = comm.all_to_all(payload, reply_counts.tolist(), got_counts.tolist(), group)
    return got[:, 0], got[:, 1], got[:, 2]


@dataclass(frozen=True)
class GraphHaloReport(Record):
    """What :func:`simulate_graph_halo` reports (per-rank lists over ranks); reads like a dict too."""

    num_ranks: int
    #: Bytes of one exchanged row.
    row_bytes: int
    hops: int
    num_owned: list[int]
    num_ghosts: list[int]
    #: Per rank, bytes received per exchange.
    ghost_bytes: list[int]
    #: Per rank, bytes a ring that moves every point to every other rank would send.
    ring_bytes: list[int]
    total_ghost_bytes: int
    total_ring_bytes: int


def _khop_ghosts(src: torch.Tensor, dst: torch.Tensor, lo: int, hi: int, hops: int) -> torch.Tensor:
    """The sorted ghost ids of the part owning ``[lo, hi)``: the sources of its incoming edges outside it,
    then, ``hops - 1`` times, the outside sources of the newest ghosts' incoming edges (serial: every
    edge is at hand, where :meth:`ShardedGraph.from_edges` asks the owners)."""
    frontier = torch.unique(src[(dst >= lo) & (dst < hi) & ((src < lo) | (src >= hi))])
    known = frontier
    for _ in range(hops - 1):
        new = torch.unique(src[torch.isin(dst, frontier)])
        frontier = new[((new < lo) | (new >= hi)) & ~torch.isin(new, known)]
        known = torch.unique(torch.cat([known, frontier]))
    return known


def simulate_graph_halo(
    edge_index: torch.Tensor, sizes: list[int], *, row_bytes: int, hops: int = 1
) -> GraphHaloReport:
    """Halo sizes of a graph split by targets into contiguous parts of ``sizes`` nodes (one process).

    The same ghost sets :meth:`ShardedGraph.from_edges` builds, for capacity planning at any ``P``.
    Reports per-rank ``num_ghosts``, ``ghost_bytes`` (received per exchange), ``ring_bytes`` (a ring
    that moves every point to every rank: ``(P - 1) * N_r * row_bytes`` sent by rank ``r``) and totals.
    """
    edge_index = _check_edge_index(edge_index, edge_index.device)
    hops = check_positive_int(hops, "hops")
    offsets = offsets_of(sizes)
    src, dst = edge_index
    ghosts = [int(_khop_ghosts(src, dst, offsets[r], offsets[r + 1], hops).numel()) for r in range(len(sizes))]
    ghost_bytes = [g * int(row_bytes) for g in ghosts]
    ring = ring_bytes(sizes, row_bytes)
    return GraphHaloReport(
        num_ranks=len(sizes),
        row_bytes=int(row_bytes),
        hops=hops,
        num_owned=[int(n) for n in sizes],
        num_ghosts=ghosts,
        ghost_bytes=ghost_bytes,
        ring_bytes=ring,
        total_ghost_bytes=sum(ghost_bytes),
        total_ring_bytes=sum(ring),
    )
