"""torch_cluster's neighbour ops on ShardTensor points: ``radius``, ``knn``, ``fps`` (and what calls them).

``torch_cluster.radius / knn / radius_graph / knn_graph / fps`` and ``torch_geometric.nn``'s functions of
the same names end in the custom ops ``torch.ops.torch_cluster.radius / knn / fps``, which reach
``ShardTensor.__torch_function__`` (with the ``OpOverloadPacket`` as ``func``). The rules here answer
them with meshshard's exact halo search (:mod:`meshshard.ops.neighbors`), so the result equals the
single-process call on the gathered cloud, under this **tie rule**:

* ``radius(x, y, r, max_num_neighbors)``: open ball, ``|p - q|^2 < r^2`` in float64 from the given
  coordinates (torch_cluster's test is ``<`` too). Edges ``[query; point]`` in global indices, sorted by
  query then point index (torch_cluster's CUDA order; its CPU order is its k-d tree's, the same set).
  torch_cluster truncates a query with more than ``max_num_neighbors`` neighbours in traversal order
  (which it calls random): such a call raises :class:`UnsupportedOpError` on every rank instead.
* ``knn(x, y, k)``: the ``k`` nearest (fewer when there are fewer points), ordered by distance, ties by
  index. When the ``k``-th and ``(k+1)``-th distances are equal the set itself is ambiguous
  (torch_cluster picks one by traversal): it raises on every rank. ``cosine=True`` raises.
* ``fps(src, ratio, random_start=False)``: the same points in the same order as torch_cluster: start at
  point 0, then the farthest point (squared distance in ``src``'s dtype, as torch_cluster computes it),
  ties by the smaller index (``argmax``). ``random_start=True`` raises (its draw happens inside
  torch_cluster). ``ceil(N * ratio)`` points.
* Batch vectors with more than one example (``ptr`` given) raise on every rank; a batch of one example
  (all zeros) is the unbatched call. Distances near the radius or a tie are float64 here; torch_cluster
  on float32 points computes them in float32, so a pair within float32 rounding of the boundary may differ.

Results are ``ShardTensor``\\ s: ``radius``/``knn`` give ``(2, E)`` sharded along dim 1 like the queries
(each rank holds its queries' edges; ``spec.node_sizes`` are the queries' sizes, so the direct path's
scatter lands on nodes sharded like the queries); ``fps`` gives ``(M,)`` selected indices in selection
order, split evenly over the ranks (``x[idx]`` then fetches the rows from their owners).

**Communication:**

===============  ===========================================================================
``radius``       the halo plan of :func:`~meshshard.ops.ball_query` (one small ``all_gather``,
                 three ``all_to_all``), one ``all_gather`` of the verdicts (:func:`comm.agree`),
                 one ``all_gather`` of the edge counts
``knn``          :func:`~meshshard.ops.knn`'s plan, then as ``radius``
``fps``          one ``all_gather`` of ``2 + D`` float64 per selected point after the first, plus
                 one of the result sizes
===============  ===========================================================================
Plain tensors (single process) send nothing. The results are integer: no backward.
"""

from __future__ import annotations

import importlib.util
import math

import torch

from ... import comm
from ..._checks import check_positive_int, check_radius
from ..._sizes import offsets_of
from ...errors import UnsupportedOpError
from .._dispatch import bind, no_subclass
from .._dispatch import register_rule as register
from .._tensor import ShardTensor
from ._common import local_of, refuse

__all__ = ["radius_edges", "knn_edges", "fps_index"]

_BIG = torch.iinfo(torch.long).max


def _agree(x: torch.Tensor, local_error: str | None, what: str) -> None:
    """Raise ``UnsupportedOpError`` on every rank when any rank found ``local_error``: the ranks' verdicts
    meet in :func:`comm.agree`; plain tensors are one process's call, decided by it alone."""
    if isinstance(x, ShardTensor):
        comm.agree(local_error, x.spec.group, error_type=UnsupportedOpError, what=what)
    elif local_error is not None:
        raise UnsupportedOpError(f"{what}: {local_error}")


def _query_rows(queries: torch.Tensor) -> torch.Tensor:
    n = local_of(queries).shape[0]
    lo = queries.offsets[queries.spec.rank] if isinstance(queries, ShardTensor) else 0
    return torch.arange(lo, lo + n, device=local_of(queries).device)


def _edges(queries: torch.Tensor, nbr: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``(2, E)`` ``[query; neighbour]`` from padded rows, wrapped like the queries when sharded."""
    keep = torch.arange(nbr.shape[1], device=nbr.device)[None, :] < count[:, None]
    out = torch.stack([_query_rows(queries).repeat_interleave(count), nbr[keep]])
    if not isinstance(queries, ShardTensor):
        return out
    spec = queries.spec
    ei = ShardTensor.from_local(out.contiguous(), spec.mesh, dim=1, mesh_dim=spec.mesh_dim)
    ei._spec = ei._spec.with_node_sizes(spec.sizes)
    return ei


def radius_edges(x: torch.Tensor, y: torch.Tensor, r: float, max_num_neighbors: int) -> torch.Tensor:
    """torch_cluster's ``radius(x, y, r, max_num_neighbors=...)`` exactly (module docstring's tie rule)."""
    from ...halo import build_plan
    from ...kernels import check_backend, nearest_neighbors
    from ...ops.neighbors import check_pair, extended_ids

    x, y, self_query = check_pair(x, y)
    r = check_radius(r)
    k = check_positive_int(max_num_neighbors, "max_num_neighbors")
    r2 = math.nextafter(r * r, 0.0)  # the open ball |p - q|^2 < r^2 as the kernels' closed one
    backend = check_backend(None, x.device)
    plan = build_plan(x, None if self_query else y, r2, backend=backend)
    lp, lq = local_of(x).detach(), local_of(y).detach()
    ext = torch.cat([lp, plan.ghost_points.to(lp.device)]) if plan.num_ghosts else lp
    gidx, _ = extended_ids(None, x, plan)
    index, count, _ = nearest_neighbors(ext, lq, k + 1, r2, point_gidx=gidx, backend=backend,
                                        queries_are_prefix=self_query)
    over = int((count > k).sum())
    error = (f"{over} queries have more than max_num_neighbors={k} points within r={r}, and torch_cluster "
             "keeps an arbitrary subset of them; raise max_num_neighbors") if over else None
    _agree(x, error, "torch_cluster.radius on ShardTensors")
    nbr = plan.to_global(index)
    nbr = torch.where(index >= 0, nbr, torch.full_like(nbr, _BIG)).sort(dim=1).values
    return _edges(y, nbr, count)


def knn_edges(x: torch.Tensor, y: torch.Tensor, k: int) -> torch.Tensor:
    """torch_cluster's ``knn(x, y, k)`` exactly (module docstring's tie rule)."""
    from ...ops.neighbors import knn

    k = check_positive_int(k, "k")
    nb = knn(x, None if y is x else y, k + 1, return_distances=True)
    d = nb.distances
    tied = (nb.count > k) & (d[:, k - 1] == d[:, min(k, d.shape[1] - 1)]) if d.shape[1] > k else nb.count < 0
    n_tied = int(tied.sum())
    error = (f"{n_tied} queries have a tie between their {k}-th and {k + 1}-th nearest points, so the "
             "k nearest are not one set (torch_cluster keeps one of them by traversal order)") if n_tied else None
    _agree(x, error, "torch_cluster.knn on ShardTensors")
    return _edges(y, nb.global_index()[:, :k], nb.count.clamp(max=k))


def _fps_step(local: torch.Tensor, dist2: torch.Tensor, lo: int, group) -> tuple[int, torch.Tensor]:
    """The farthest point over all ranks (ties: smaller index): its global index and coordinates."""
    d = local.shape[1]
    mine = torch.full((2 + d,), -math.inf, dtype=torch.float64, device=local.device)
    if local.shape[0]:
        i = int(dist2.argmax())
        mine[0], mine[1], mine[2:] = float(dist2[i]), -float(lo + i), local[i].double()
    table = comm.all_gather(mine, group) if group is not None else mine[None]
    best = max(range(table.shape[0]), key=lambda j: (float(table[j, 0]), float(table[j, 1])))
    return int(-table[best, 1]), table[best, 2:].to(local.dtype)


def fps_index(src: torch.Tensor, ratio: float | torch.Tensor) -> torch.Tensor:
    """torch_cluster's ``fps(src, ratio=ratio, random_start=False)``: the same indices in the same order."""
    sharded = isinstance(src, ShardTensor)
    local = local_of(src).detach()
    n = src.shape[0]
    group = src.spec.group if sharded and src.spec.num_ranks > 1 else None
    lo = src.offsets[src.spec.rank] if sharded else 0
    r = torch.as_tensor(ratio, dtype=src.dtype).reshape(())
    if not 0 < float(r) <= 1:
        raise ValueError(f"fps: ratio must be in (0, 1] (got {float(r)})")
    m = int((torch.tensor(n, dtype=src.dtype) * r).ceil()) if n else 0
    out = torch.empty(m, dtype=torch.long)
    if m:
        out[0], dist2 = 0, (local - _fps_point(local, lo, group, 0)).pow(2).sum(1)
        for step in range(1, m):
            out[step], point = _fps_step(local, dist2, lo, group)
            dist2 = torch.minimum(dist2, (local - point).pow(2).sum(1))
    out = out.to(local.device)
    if not sharded:
        return out
    p, me = src.spec.num_ranks, src.spec.rank
    sizes = [m // p + (i < m % p) for i in range(p)]
    at = offsets_of(sizes)
    mine = out[at[me] : at[me + 1]]
    return ShardTensor.from_local(mine, src.spec.mesh, sizes=sizes, mesh_dim=src.spec.mesh_dim, validate=False)


def _fps_point(local: torch.Tensor, lo: int, group, gid: int) -> torch.Tensor:
    """Coordinates of global point ``gid`` on every rank (one ``all_gather``)."""
    d = local.shape[1]
    mine = torch.full((2 + d,), -math.inf, dtype=torch.float64, device=local.device)
    if lo <= gid < lo + local.shape[0]:
        mine[0], mine[2:] = 0.0, local[gid - lo].double()
    table = comm.all_gather(mine, group) if group is not None else mine[None]
    return table[int(table[:, 0].argmax()), 2:].to(local.dtype)


# -- the custom ops ------------------------------------------------------------------------------------

def _check_sharded_pair(func, x, y, ptr_x, ptr_y) -> None:
    if ptr_x is not None or ptr_y is not None:
        raise refuse(func, "batch vectors with more than one example are not supported; run one example "
                       "per call (a batch of zeros, or none)")
    if not (isinstance(x, ShardTensor) and isinstance(y, ShardTensor)):
        raise refuse(func, "x and y must both be ShardTensors sharded along the point dim (got "
                       f"{type(x).__name__} and {type(y).__name__}); shard the other with ms.scatter")


def _radius_rule(func, args, kwargs):
    a = bind(func, args, kwargs, ("x", "y", "ptr_x", "ptr_y", "r", "max_num_neighbors", "num_workers"))
    _check_sharded_pair(func, a["x"], a["y"], a["ptr_x"], a["ptr_y"])
    return radius_edges(a["x"], a["y"], a["r"], a["max_num_neighbors"])


def _knn_rule(func, args, kwargs):
    a = bind(func, args, kwargs, ("x", "y", "ptr_x", "ptr_y", "k", "cosine", "num_workers"))
    _check_sharded_pair(func, a["x"], a["y"], a["ptr_x"], a["ptr_y"])
    if a["cosine"]:
        raise refuse(func, "cosine=True is not supported (Euclidean distances only)")
    return knn_edges(a["x"], a["y"], a["k"])


def _fps_rule(func, args, kwargs):
    a = bind(func, args, kwargs, ("src", "ptr", "ratio", "random_start"), {"random_start": True})
    src, ptr = a["src"], a["ptr"]
    if not isinstance(src, ShardTensor) or src.shard_dim != 0 or isinstance(ptr, ShardTensor):
        raise refuse(func, "src must be a ShardTensor sharded along dim 0 and ptr a plain tensor")
    if a["random_start"]:
        raise refuse(func, "random_start=True draws the start inside torch_cluster; pass random_start=False")
    with no_subclass():
        ptr_list = [int(v) for v in torch.as_tensor(ptr).flatten().tolist()]
        ratio = torch.as_tensor(a["ratio"]).flatten()
    if ptr_list != [0, src.shape[0]]:
        raise refuse(func, "batch vectors with more than one example are not supported; one example per call")
    if ratio.numel() != 1:
        raise refuse(func, "one ratio per call")
    return fps_index(src, ratio[0])


def _register() -> None:
    if importlib.util.find_spec("torch_cluster") is None:
        return
    try:
        import torch_cluster  # noqa: F401  (loads the custom ops)
    except Exception:  # a broken install: the ops are absent, nothing to hook
        return
    ops = torch.ops.torch_cluster
    for name, rule in (("radius", _radius_rule), ("knn", _knn_rule), ("fps", _fps_rule)):
        packet = getattr(ops, name)
        register(packet, packet.default)(rule)


_register()
