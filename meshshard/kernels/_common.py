"""Exact pair distances and the normalised neighbour order shared by every kernel backend.

Every backend only proposes *candidate* pairs (with a slightly inflated radius); the decision
``d2 <= r2`` and the order of neighbours are made here, with the library's one distance formula
(:func:`meshshard.partition._distance.sq_dist`, also used by the exact ghost sets), so all
backends, devices and partitions agree bit for bit.
"""

from __future__ import annotations

import torch

from ..partition import sq_dist

__all__ = ["INFLATE", "pair_d2", "select_rows", "sq_dist"]

#: Relative radius inflation for candidate generation: a backend's own rounding can then never
#: drop a pair that :func:`pair_d2` accepts.
INFLATE = 1e-6


def pair_d2(points: torch.Tensor, queries: torch.Tensor, qi: torch.Tensor, pj: torch.Tensor) -> torch.Tensor:
    """``sq_dist(queries[qi], points[pj])`` (float64, ``(E,)``); rows are gathered in float64."""
    q64 = queries.detach().to(torch.float64)
    p64 = q64 if queries is points else points.detach().to(torch.float64)
    return sq_dist(q64.index_select(0, qi.contiguous()), p64.index_select(0, pj.contiguous()))


def _lexsort_pairs(qi: torch.Tensor, d2: torch.Tensor, gj: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Permutation that sorts pairs by query, then distance, then global point index.

    One ``int64`` sort of a composite key (query in the high bits, the distance quantised
    monotonically in the low bits), then an exact three-key sort of only the pairs whose keys
    collide (equal or nearly equal distances: duplicates, lattice ties). Same result as three
    stable sorts, at the cost of one.
    """
    num = qi.numel()
    if num == 0:
        return torch.zeros(0, dtype=torch.long, device=qi.device), qi
    q_bits = max(1, int(qi.max()).bit_length())
    d_bits = min(52, 62 - q_bits)
    if d_bits < 8:  # astronomically many queries: fall back to three stable sorts
        order = _lexsort3(qi, d2, gj)
        return order, qi.index_select(0, order)
    top = float(d2.max())
    scale = (2.0**d_bits - 1) / top if top > 0 else 0.0
    quant = torch.floor(d2 * scale).long().clamp_(0, 2**d_bits - 1)  # monotone in d2
    key = (qi << d_bits) | quant
    sorted_key, order = torch.sort(key)
    same = sorted_key[1:] == sorted_key[:-1]
    if bool(same.any()):
        in_run = torch.zeros(num, dtype=torch.bool, device=qi.device)
        in_run[1:] |= same
        in_run[:-1] |= same
        pos = in_run.nonzero().flatten()
        sub = order.index_select(0, pos)
        fixed = _lexsort3(sorted_key.index_select(0, pos), d2.index_select(0, sub), gj.index_select(0, sub))
        order.index_copy_(0, pos, sub.index_select(0, fixed))
    return order, sorted_key >> d_bits


def _lexsort3(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    order = torch.argsort(c, stable=True)
    order = order[torch.argsort(b[order], stable=True)]
    return order[torch.argsort(a[order], stable=True)]


def select_rows(
    qi: torch.Tensor,
    pj: torch.Tensor,
    d2: torch.Tensor,
    point_gidx: torch.Tensor | None,
    num_queries: int,
    max_neighbors: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keep, per query, the ``max_neighbors`` nearest pairs (ties: smaller global index).

    Parameters
    ----------
    qi, pj, d2:
        ``(E,)`` accepted pairs: query row, point row, exact squared distance.
    point_gidx:
        ``(N,)`` global index of every point row (``None``: the row itself).
    num_queries, max_neighbors:
        ``M`` and ``K``.

    Returns
    -------
    index, count, dist2:
        ``(M, K)`` point rows, ``-1`` padded; ``(M,)`` number of valid entries; ``(M, K)`` float64
        squared distances, ``inf`` padded.
    """
    device = qi.device
    gj = pj if point_gidx is None else point_gidx.index_select(0, pj)
    order, qi = _lexsort_pairs(qi, d2, gj)
    pj = pj.index_select(0, order)
    per_query = torch.bincount(qi, minlength=num_queries)
    starts = torch.cumsum(per_query, 0) - per_query
    rank = torch.arange(qi.numel(), device=device) - starts.index_select(0, qi)
    keep = (rank < max_neighbors).nonzero().flatten()
    slot = qi.index_select(0, keep) * max_neighbors + rank.index_select(0, keep)
    index = torch.full((num_queries * max_neighbors,), -1, dtype=torch.long, device=device)
    dist2 = torch.full((num_queries * max_neighbors,), torch.inf, dtype=torch.float64, device=device)
    index.index_copy_(0, slot, pj.index_select(0, keep))
    dist2.index_copy_(0, slot, d2.index_select(0, order.index_select(0, keep)))
    return (
        index.view(num_queries, max_neighbors),
        per_query.clamp(max=max_neighbors),
        dist2.view(num_queries, max_neighbors),
    )
