"""Pure-torch cell list (uniform grid hash): candidate pairs on any device, fully vectorised.

Points are binned into cubic cells of side ``>= radius``; a query's candidates are the points of
the ``3^D`` cells around its own. Cells are found by sorting linear cell keys and binary search
(``searchsorted``), so memory is ``O(N + M 3^D)`` plus the candidates of one chunk of queries.
"""

from __future__ import annotations

import itertools
import math

import torch

from ._common import INFLATE

__all__ = ["grid_radius_candidates"]

_MAX_KEY = 2**62
#: Candidate pairs materialised at once (bounds peak memory to a few hundred MB).
CHUNK_PAIRS = 1 << 24


def grid_radius_candidates(
    points: torch.Tensor, queries: torch.Tensor, r2: float | torch.Tensor, chunk_pairs: int = CHUNK_PAIRS
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Candidate ``(query_row, point_row)`` pairs, in chunks of about ``chunk_pairs``.

    Per-query radii use a cell of their maximum. Returns a list of chunks so the caller can filter
    each chunk before the next one is built.
    """
    device = points.device
    dim = points.shape[1]
    r2max = float(r2.max()) if isinstance(r2, torch.Tensor) else float(r2)
    p = points.detach().to(torch.float64)
    q = queries.detach().to(torch.float64)
    lo = torch.minimum(p.min(0).values, q.min(0).values)
    hi = torch.maximum(p.max(0).values, q.max(0).values)
    extent = float((hi - lo).max())
    cell = max(math.sqrt(r2max) * (1 + INFLATE), extent * 1e-12, 1e-300)
    # Keep the linear key in int64: widen cells (still correct, more candidates) if the grid is huge.
    while math.prod(int(e / cell) + 3 for e in (hi - lo).tolist()) > _MAX_KEY:
        cell *= 2.0
    pc = torch.floor((p - lo) / cell).long() + 1
    qc = torch.floor((q - lo) / cell).long() + 1
    dims = [int(v) + 2 for v in torch.maximum(pc.max(0).values, qc.max(0).values).tolist()]
    strides = [1] * dim
    for c in range(dim - 2, -1, -1):
        strides[c] = strides[c + 1] * dims[c + 1]
    strides_t = torch.tensor(strides, dtype=torch.long, device=device)
    pkey = (pc * strides_t).sum(1)
    sorted_keys, order = torch.sort(pkey)
    cell_keys, cell_counts = torch.unique_consecutive(sorted_keys, return_counts=True)
    cell_starts = torch.cumsum(cell_counts, 0) - cell_counts
    offsets = torch.tensor(list(itertools.product((-1, 0, 1), repeat=dim)), dtype=torch.long, device=device)
    nkey = (qc * strides_t).sum(1)[:, None] + (offsets * strides_t).sum(1)[None, :]  # (M, 3^D)
    slot = torch.searchsorted(cell_keys, nkey).clamp(max=cell_keys.numel() - 1)
    found = cell_keys[slot] == nkey
    counts = torch.where(found, cell_counts[slot], 0)
    starts = cell_starts[slot]
    per_query = counts.sum(1)
    # Chunk boundaries over queries so that each chunk holds about chunk_pairs candidates.
    cum = torch.cumsum(per_query, 0)
    total = int(cum[-1]) if cum.numel() else 0
    num_chunks = max(1, -(-total // chunk_pairs))
    targets = torch.arange(1, num_chunks, device=device) * chunk_pairs
    bounds = [0, *torch.searchsorted(cum, targets).add(1).tolist(), queries.shape[0]]
    chunks = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        if b <= a:
            continue
        cnt = counts[a:b].reshape(-1)
        st = starts[a:b].reshape(-1)
        n = int(cnt.sum())
        if n == 0:
            continue
        slot_q = torch.arange(a, b, device=device).repeat_interleave(offsets.shape[0])
        qi = slot_q.repeat_interleave(cnt, output_size=n)
        first = torch.cumsum(cnt, 0) - cnt
        within = torch.arange(n, device=device) - first.repeat_interleave(cnt, output_size=n)
        pj = order[st.repeat_interleave(cnt, output_size=n) + within]
        chunks.append((qi, pj))
    return chunks
