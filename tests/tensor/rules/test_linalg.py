"""Gather -> compute -> reshard (meshshard/tensor/_rules/_linalg.py) vs single process, world sizes 1-4."""

from __future__ import annotations

import pytest
import torch

import meshshard as ms
from meshshard.testing import run_distributed

from .._serial import check, run_cases

N = 7


def _x(*shape, seed=4):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _spd(n, seed=4):
    a = _x(n, n, seed=seed)
    return a @ a.T + n * torch.eye(n, dtype=torch.float64)


CASES = {
    "inv_rows": lambda S, P: torch.linalg.inv(S(_spd(N))),
    "inv_cols": lambda S, P: torch.linalg.inv(S(_spd(N), 1)),
    "inv_batch_local": lambda S, P: torch.linalg.inv(S(torch.stack([_spd(3, s) for s in range(N)]))),
    "det_rows": lambda S, P: torch.linalg.det(S(_spd(N))),
    "slogdet_batch": lambda S, P: torch.linalg.slogdet(S(torch.stack([_spd(3, s) for s in range(N)]))),
    "cholesky_rows": lambda S, P: torch.linalg.cholesky(S(_spd(N))),
    "eigh_rows": lambda S, P: torch.linalg.eigh(S(_spd(N))).eigenvalues,
    "svdvals_cols": lambda S, P: torch.linalg.svdvals(S(_x(4, N), 1)),
    "qr_rows": lambda S, P: torch.linalg.qr(S(_x(N, 3))),
    "solve_both_sharded": lambda S, P: torch.linalg.solve(S(_spd(N)), S(_x(N, 2))),
    "solve_plain_rhs": lambda S, P: torch.linalg.solve(S(_spd(N)), P(_x(N, 2))),
    "lstsq": lambda S, P: torch.linalg.lstsq(S(_x(N, 3)), S(_x(N, 2, seed=1))).solution,
    "matrix_exp": lambda S, P: torch.linalg.matrix_exp(S(_x(N, N) * 0.1)),
    "pinv": lambda S, P: torch.linalg.pinv(S(_x(N, 3))),
    "multi_dot": lambda S, P: torch.linalg.multi_dot([S(_x(N, 3)), P(_x(3, 4)), P(_x(4, 2))]),
    "fft_points": lambda S, P: torch.fft.rfft(S(_x(N, 3)), dim=0).abs(),
    "fft_other_dim": lambda S, P: torch.fft.fft(S(_x(N, 6)), dim=1).real,
    "fft2": lambda S, P: torch.fft.fft2(S(_x(2, N, 5), 1)).imag,
    "ifft_real_input": lambda S, P: torch.fft.ifft(S(_x(N, 4)), norm="ortho").real,
    "fftshift": lambda S, P: torch.fft.fftshift(S(_x(N, 4))),
    "cov": lambda S, P: torch.cov(S(_x(3, N), 1)),
    "pdist": lambda S, P: torch.nn.functional.pdist(S(_x(N, 3))),
    "cross_points": lambda S, P: torch.linalg.cross(S(_x(N, 3)), S(_x(N, 3, seed=2))),
    "cross_legacy_dim": lambda S, P: torch.cross(S(_x(N, 3)), S(_x(N, 3, seed=2)), dim=1),
}


def _run(names):
    return run_cases(CASES, names, rtol=1e-8, atol=1e-10)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_gathered_and_local_paths_match_single_process(world_size):
    res = check(run_distributed(_run, world_size, sorted(CASES), timeout=600))
    assert res["inv_rows"][4] == "ShardTensor"  # shaped like the input: sharded like it
    assert res["det_rows"][4] == "ReplicatedTensor"
    if world_size > 1:
        assert res["inv_rows"][2] == {"all_to_all": 1}
        assert res["inv_batch_local"][2] == {}
        assert res["fft_other_dim"][2] == {}
        assert res["cross_points"][2] == {}


def _empty_rank_fft(_):
    """An empty shard on the local path: torch's MKL FFT raises on empty inputs; the rule must not call it."""
    mesh = ms.init_mesh()
    rank = torch.distributed.get_rank()
    sizes = [3, 0]
    local = _x(3, 5)[: sizes[rank]].clone().requires_grad_()
    x = ms.ShardTensor.from_local(local, mesh, sizes=sizes)
    y = torch.fft.ifft(x, dim=1).real
    (g,) = torch.autograd.grad((y * y).sum(), [x])
    return tuple(g.local_shape)


def test_empty_rank_local_path_keeps_the_backward():
    assert run_distributed(_empty_rank_fft, 2, None) == [(3, 5), (0, 5)]
