"""cdist, linalg.norm, F.normalize and cosine_similarity with sharded operands vs single-process torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import meshshard as ms
from meshshard.testing import run_distributed

from .._serial import check, run_cases

N, M, D = 13, 5, 3


def _x(*shape, seed=4):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


CASES = {
    "cdist_queries": lambda S, P: torch.cdist(S(_x(N, D)), P(_x(M, D, seed=5))),
    "cdist_keys_min": lambda S, P: torch.cdist(P(_x(M, D, seed=5)), S(_x(N, D))).amin(-1),
    "cdist_keys": lambda S, P: torch.cdist(P(_x(M, D, seed=5)), S(_x(N, D)), p=1.0),
    "cdist_batched": lambda S, P: torch.cdist(S(_x(2, N, D), 1), P(_x(2, M, D, seed=5))),
    "cdist_batch_sharded": lambda S, P: torch.cdist(S(_x(N, 4, D), 0), P(_x(1, M, D, seed=5))),
    "linalg_norm_points": lambda S, P: torch.linalg.norm(S(_x(N, D)), dim=0),
    "linalg_norm_fro": lambda S, P: torch.linalg.norm(S(_x(N, D))),
    "linalg_norm_fro_dims": lambda S, P: torch.linalg.norm(S(_x(2, N, D), 1), "fro", dim=(1, 2)),
    "linalg_norm_inf": lambda S, P: torch.linalg.norm(S(_x(N, D)), float("inf"), dim=0),
    "linalg_norm_local": lambda S, P: torch.linalg.norm(S(_x(N, D)), dim=1),
    "linalg_norm_1d": lambda S, P: torch.linalg.norm(S(_x(N)), 3),
    "vector_norm": lambda S, P: torch.linalg.vector_norm(S(_x(N, D)), 1.5, dim=(0, 1)),
    "normalize_points": lambda S, P: F.normalize(S(_x(N, D)), dim=0),
    "normalize_points_p1": lambda S, P: F.normalize(S(_x(2, N, D), 1), p=1.0, dim=1),
    "normalize_channels": lambda S, P: F.normalize(S(_x(N, D)), dim=1),
    "cosine_points": lambda S, P: F.cosine_similarity(S(_x(N, D)), S(_x(N, D, seed=6)), dim=0),
    "cosine_channels": lambda S, P: F.cosine_similarity(S(_x(N, D)), S(_x(N, D, seed=6)), dim=1),
    "cosine_plain": lambda S, P: F.cosine_similarity(S(_x(N, D)), P(_x(1, D, seed=6)), dim=1),
}


def _run(names):
    return run_cases(CASES, names)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_distances_match_single_process(world_size):
    res = check(run_distributed(_run, world_size, sorted(CASES), timeout=600))
    for name in ("cdist_queries", "cdist_keys", "cdist_batched", "normalize_channels", "cosine_channels"):
        assert res[name][2] == {} and res[name][4] == "ShardTensor", (name, res[name])
    if world_size > 1:
        for name in ("linalg_norm_points", "normalize_points", "cosine_points", "linalg_norm_fro"):
            assert res[name][2] == {"all_reduce": 1}, (name, res[name])


def _both_sharded():
    mesh = ms.init_mesh()
    x = ms.ShardTensor.from_local(torch.randn(3, 2), mesh, sizes=[3, 3])
    try:
        torch.cdist(x, x)
    except ms.UnsupportedOpError:
        return True
    return False


def test_cdist_of_two_sharded_raises_on_every_rank():
    assert run_distributed(_both_sharded, 2) == [True, True]


if __name__ == "__main__":
    import sys

    for r, res in enumerate(run_distributed(_run, int(sys.argv[1]), sorted(CASES))):
        print(r, {k: v for k, v in res.items() if not (v[0] and v[1])})
    print(res)
