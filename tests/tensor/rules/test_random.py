"""Random numbers on ShardTensors (meshshard/tensor/_rules/_random.py): keyed by the global index.

A P-rank run draws what the 1-rank ShardTensor run draws (P = 2, 3, uneven, empty and one-point
shards, sharded along dim 0 and along an inner dim), gradients of dropout included; two ranks
seeded alike never draw correlated numbers; distributions without a keyed draw are refused.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import meshshard as ms
from meshshard.errors import UnsupportedOpError
from meshshard.testing import run_distributed

N = 601
SIZES = {1: [N], 2: [200, 401], 3: [0, 1, 600]}


def _draws(x: ms.ShardTensor) -> dict[str, torch.Tensor]:
    """Every keyed random op once, in a fixed order (each draws its own seed from torch's generator)."""
    out = {"rand": torch.rand_like(x), "randn": torch.randn_like(x),
           "rand_f32": torch.rand_like(x, dtype=torch.float32), "randint": torch.randint_like(x, 2, 9),
           "bernoulli": torch.bernoulli(torch.full_like(x, 0.3)),
           "bernoulli_p": torch.bernoulli(x, 0.6), "bernoulli_method": torch.full_like(x, 0.2).bernoulli(),
           "dropout": torch.nn.Dropout(0.4)(torch.ones_like(x)), "alpha": F.alpha_dropout(x + 1, 0.2, True),
           "dropout_fn": torch.dropout(x + 2, 0.5, True), "eval": F.dropout(x, 0.5, training=False)}
    fills = {"uniform_": lambda t: t.uniform_(-1.0, 3.0), "normal_": lambda t: t.normal_(2.0, 0.5),
             "exponential_": lambda t: t.exponential_(2.0), "bernoulli_": lambda t: t.bernoulli_(0.7)}
    for name, fill in fills.items():
        t = torch.zeros_like(x)
        assert fill(t) is t
        out[name] = t
    return out


def _run(sizes, shape, dim, seed_by_rank=False):
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    torch.manual_seed(100 + rank if seed_by_rank else 7)
    full = torch.linspace(-1, 1, int(torch.tensor(shape).prod()), dtype=torch.float64).reshape(shape)
    base = full.narrow(dim, sum(sizes[:rank]), sizes[rank]).clone()
    x = ms.ShardTensor.from_local(base, mesh, sizes=sizes, dim=dim)
    out = {k: v.full_tensor().to_plain() for k, v in _draws(x).items()}
    leaf = base.clone().requires_grad_()
    (F.dropout(ms.ShardTensor.from_local(leaf, mesh, sizes=sizes, dim=dim), 0.3) * 3).sum().backward()
    out["dropout_grad"] = ms.ShardTensor.from_local(leaf.grad, mesh, sizes=sizes, dim=dim).full_tensor().to_plain()
    try:
        torch.zeros_like(x).random_()
        out["random_"] = None
    except UnsupportedOpError as exc:
        out["random_"] = str(exc)
    return out


@pytest.mark.parametrize("shape,dim", [((N, 3), 0), ((2, N, 2), 1)])
def test_p_ranks_draw_what_one_rank_draws(shape, dim):
    ref = run_distributed(_run, 1, SIZES[1], shape, dim)[0]
    for world_size in (2, 3):
        for seed_by_rank in (False, True):  # ranks seeded differently still agree (rank 0's draw)
            results = run_distributed(_run, world_size, SIZES[world_size], shape, dim, seed_by_rank)
            for out in results:
                for name, value in ref.items():
                    if name == "random_":
                        assert out[name] == value and "random_ on a ShardTensor: no keyed random numbers" in value
                    elif not seed_by_rank:  # seed_by_rank: rank 0 seeds with 100, not 7
                        assert value.dtype == out[name].dtype and torch.equal(value, out[name]), (world_size, name)
            if seed_by_rank:
                for out in results[1:]:
                    assert all(torch.equal(out[k], results[0][k]) for k in ref if k != "random_")


def test_distributions_and_dropout_semantics():
    out = run_distributed(_run, 1, [4000], (4000, 2), 0)[0]
    assert 0 < float(out["rand"].min()) and float(out["rand"].max()) < 1
    assert abs(float(out["rand"].mean()) - 0.5) < 0.02
    assert abs(float(out["randn"].mean())) < 0.05 and abs(float(out["randn"].std()) - 1) < 0.05
    assert set(out["randint"].unique().tolist()) == set(range(2, 9))
    assert abs(float(out["bernoulli"].mean()) - 0.3) < 0.03
    assert abs(float(out["uniform_"].mean()) - 1.0) < 0.1 and float(out["uniform_"].min()) >= -1
    assert abs(float(out["normal_"].mean()) - 2.0) < 0.05 and abs(float(out["normal_"].std()) - 0.5) < 0.03
    assert abs(float(out["exponential_"].mean()) - 0.5) < 0.03 and float(out["exponential_"].min()) > 0
    kept = out["dropout"] != 0
    assert abs(float(kept.double().mean()) - 0.6) < 0.03
    assert torch.allclose(out["dropout"][kept], torch.tensor(1 / 0.6, dtype=torch.float64))
    grad = out["dropout_grad"]  # d(3 dropout(x))/dx = 3 mask / (1 - p)
    assert bool(((grad == 0) | torch.isclose(grad, torch.tensor(3 / 0.7, dtype=torch.float64))).all())
    assert abs(float((grad != 0).double().mean()) - 0.7) < 0.03


def _ranks_noise(n):
    mesh = ms.init_mesh()
    torch.manual_seed(0)  # every rank seeded alike, as every script seeds
    x = ms.ShardTensor.from_local(torch.zeros(n, 4), mesh, sizes=[n] * dist.get_world_size())
    return torch.rand_like(x).to_local(), torch.randn_like(x).to_local(), F.dropout(x + 1, 0.5).to_local()


def test_ranks_noise_is_uncorrelated():
    results = run_distributed(_ranks_noise, 2, 2000)
    for a, b in zip(*results):
        assert not torch.equal(a, b)
        corr = torch.corrcoef(torch.stack([a.reshape(-1), b.reshape(-1)]).double())[0, 1]
        assert abs(float(corr)) < 0.06, float(corr)  # 8000 pairs: independent noise gives |corr| ~ 0.01
