"""The pure-torch cell list: chunked candidate generation gives the same pairs as one chunk."""

from __future__ import annotations

import torch

from meshshard.kernels._grid import grid_radius_candidates

from ._helpers import grid_cloud


def test_grid_kernel_chunks_agree():
    pts, q = grid_cloud(200, 3), grid_cloud(50, 4)
    whole = grid_radius_candidates(pts, q, 0.5**2)
    parts = grid_radius_candidates(pts, q, 0.5**2, chunk_pairs=97)
    assert len(whole) == 1 and len(parts) > 3

    def pairs(chunks):
        return sorted(zip(torch.cat([c[0] for c in chunks]).tolist(), torch.cat([c[1] for c in chunks]).tolist()))

    assert pairs(whole) == pairs(parts)
