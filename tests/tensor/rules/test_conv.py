"""Point convolutions, global pooling and the broadcast of a global feature to the points (PointNet layout)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import meshshard as ms
from meshshard.testing import run_distributed

from .._serial import check, run_cases

B, C, N = 2, 3, 13


def _x(*shape, seed=4):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _w(*shape):
    return _x(*shape, seed=9)


CASES = {
    "conv1d_k1": lambda S, P: F.conv1d(S(_x(B, C, N), 2), P(_w(5, C, 1)), P(_w(5))),
    "conv1d_k1_unbatched": lambda S, P: F.conv1d(S(_x(C, N), 1), P(_w(5, C, 1))),
    "conv1d_k1_groups": lambda S, P: F.conv1d(S(_x(B, 4, N), 2), P(_w(6, 2, 1)), groups=2),
    "conv1d_batch_sharded_k3": lambda S, P: F.conv1d(S(_x(N, C, 6), 0), P(_w(4, C, 3)), padding=1),
    "conv2d_k1": lambda S, P: F.conv2d(S(_x(B, C, N, 2), 2), P(_w(4, C, 1, 1))),
    "conv_module": lambda S, P: torch.nn.Conv1d(C, 4, 1).double()(S(_x(B, C, N), 2)),
    "adaptive_max": lambda S, P: F.adaptive_max_pool1d(S(_x(B, C, N), 2), 1),
    "adaptive_max_indices": lambda S, P: F.adaptive_max_pool1d(S(_x(B, C, N), 2), 1, return_indices=True),
    "adaptive_avg": lambda S, P: F.adaptive_avg_pool1d(S(_x(B, C, N), 2), 1),
    "adaptive_module": lambda S, P: torch.nn.AdaptiveMaxPool1d(1)(S(_x(B, C, N), 2)),
    "max_pool_global": lambda S, P: F.max_pool1d(S(_x(B, C, N), 2), N),
    "avg_pool_global": lambda S, P: F.avg_pool1d(S(_x(B, C, N), 2), N),
    "max_over_points": lambda S, P: torch.max(S(_x(B, C, N), 2), 2, keepdim=True)[0],
    # the global feature appended to every point: (B, C, 1) -> repeat/expand -> cat along channels
    "cat_repeat_bcn": lambda S, P: (lambda h: torch.cat([h, h.amax(2, keepdim=True).repeat(1, 1, N)], 1))(
        S(_x(B, C, N), 2)),
    "cat_expand_bcn": lambda S, P: (lambda h: torch.cat([h, h.mean(2, keepdim=True).expand(-1, -1, N)], 1))(
        S(_x(B, C, N), 2)),
    "cat_expand_nc": lambda S, P: (lambda h: torch.cat([h, h.max(0).values.expand(N, -1)], 1))(S(_x(N, C), 0)),
    "cat_repeat_bnc": lambda S, P: (lambda h: torch.cat([h, h.amax(1, keepdim=True).repeat(1, N, 1)], -1))(
        S(_x(B, N, C), 1)),
    "cat_param_expand": lambda S, P: torch.cat([S(_x(N, C), 0), P(_w(1, 2)).expand(N, -1)], 1),
    "pad_channels": lambda S, P: F.pad(S(_x(B, C, N), 2).transpose(1, 2), (1, 2)),
    "pad_reflect_batch": lambda S, P: F.pad(S(_x(N, C, 5), 0), (2, 1), mode="reflect"),
    "pad_replicate_2d": lambda S, P: F.pad(S(_x(B, C, N, 4), 2), (1, 2, 0, 0), mode="replicate"),
    "add_repeated": lambda S, P: (lambda h: h + h.sum(0, keepdim=True).repeat(N, 1))(S(_x(N, C), 0)),
}


def _run(names):
    return run_cases(CASES, names)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_point_convs_pooling_broadcast_match_single_process(world_size):
    res = check(run_distributed(_run, world_size, sorted(CASES), timeout=600))
    for name in ("conv1d_k1", "conv1d_k1_unbatched", "conv1d_batch_sharded_k3", "conv2d_k1", "conv_module",
                 "cat_param_expand"):
        assert res[name][2] == {} and res[name][4] == "ShardTensor", (name, res[name])
    if world_size > 1:
        assert res["adaptive_avg"][2] == {"all_reduce": 1} and res["adaptive_avg"][4] == "ReplicatedTensor"
        assert res["adaptive_max"][2] == {"all_reduce": 2}  # max values + (tie count, differentiable value)
        assert res["cat_repeat_bcn"][2] == {"all_reduce": 2}  # the pooling only; the cat is local


def _bad(kind):
    mesh = ms.init_mesh()
    x = ms.ShardTensor.from_local(torch.randn(2, 3, 4), mesh, sizes=[4, 4], dim=2)
    try:
        if kind == "plain_repeat":
            torch.cat([x, torch.randn(2, 1, 1).repeat(1, 1, 8)], 1)
        elif kind == "channels":
            F.conv1d(ms.ShardTensor.from_local(torch.randn(2, 3, 4), mesh, sizes=[3, 3], dim=1), torch.randn(5, 6, 1))
    except (ms.UnsupportedOpError, ms.ShardingError) as exc:
        return type(exc).__name__
    return None


@pytest.mark.parametrize("kind", ["plain_repeat", "channels"])
def test_unsupported_forms_raise_on_every_rank(kind):
    """Wider kernels, windows and padding along the points run through the row halo (see rules/test_grid.py)."""
    out = run_distributed(_bad, 2, kind)
    assert out[0] is not None and out == [out[0]] * 2


if __name__ == "__main__":
    import sys

    for r, res in enumerate(run_distributed(_run, int(sys.argv[1]), sorted(CASES))):
        print(r, {k: v for k, v in res.items() if not (v[0] and v[1])})
    print(res)
