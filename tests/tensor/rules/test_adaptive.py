"""Adaptive pooling with an output size along the sharded axis (meshshard/tensor/_rules/_grid.py) vs single
process, world sizes 1-4 (uneven, one-row and empty ranks)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from meshshard.testing import run_distributed

from .._serial import check, run_cases

H, W = 11, 6


def _x(*shape, seed=4):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


CASES = {
    "avg2d_h": lambda S, P: F.adaptive_avg_pool2d(S(_x(2, 3, H, W), 2), (4, 3)),
    "avg2d_w_upsampling": lambda S, P: F.adaptive_avg_pool2d(S(_x(2, 3, W, H), 3), (5, 13)),
    "avg3d_d": lambda S, P: F.adaptive_avg_pool3d(S(_x(1, 2, 3, 4, H), 4), (2, None, 5)),
    "max2d_h": lambda S, P: F.adaptive_max_pool2d(S(_x(2, 3, H, W), 2), (4, 3)),
    "max2d_h_indices": lambda S, P: F.adaptive_max_pool2d(S(_x(2, 3, H, W), 2), (7, 2), return_indices=True),
    "max3d_unbatched": lambda S, P: F.adaptive_max_pool3d(S(_x(2, H, 3, 4), 1), 3, return_indices=True),
    "avg2d_channels_local": lambda S, P: F.adaptive_avg_pool2d(S(_x(2, H, 4, 4), 1), 2),
    "max2d_batch_local": lambda S, P: F.adaptive_max_pool2d(S(_x(H, 2, 4, 4)), (3, 1)),
}


def _run(names):
    return run_cases(CASES, names)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_adaptive_pools_match_single_process(world_size):
    res = check(run_distributed(_run, world_size, sorted(CASES), timeout=600))
    if world_size > 1:
        assert res["avg2d_channels_local"][2] == {}
        assert set(res["avg2d_h"][2]) <= {"all_to_all"}
