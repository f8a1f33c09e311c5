"""Losses over sharded points (meshshard/tensor/_rules/_loss.py) vs single-process torch, and their collectives."""

# ruff: noqa: B023  (each case lambda is bound to its loop value by an outer lambda)
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import meshshard as ms
from meshshard.testing import run_distributed

from .._serial import check, run_cases

N, C = 11, 3


def _g():
    return torch.Generator().manual_seed(3)


def _xy(shape=(N, C)):
    g = _g()
    return torch.randn(*shape, generator=g, dtype=torch.float64), torch.randn(*shape, generator=g, dtype=torch.float64)


def _probs(shape=(N, C)):
    g = _g()
    return (torch.rand(*shape, generator=g, dtype=torch.float64) * 0.9 + 0.05,
            torch.rand(*shape, generator=g, dtype=torch.float64))


def _classes(shape=(N,), k=C):
    return torch.randint(0, k, shape, generator=torch.Generator().manual_seed(5))


def _pointwise(fn, dim=0, shape=(N, C), tgrad=True, **kw):
    def case(S, P):
        x, y = _xy(shape)
        return fn(S(x, dim), S(y, dim, tgrad), **kw)
    return case


CASES = {}
for red in ("mean", "sum", "none"):
    CASES[f"mse_{red}"] = _pointwise(F.mse_loss, reduction=red)
    CASES[f"l1_{red}"] = _pointwise(F.l1_loss, reduction=red)
    CASES[f"huber_{red}"] = _pointwise(F.huber_loss, reduction=red, delta=0.7)
    CASES[f"smooth_l1_{red}"] = _pointwise(F.smooth_l1_loss, reduction=red, beta=0.4)
    CASES[f"soft_margin_{red}"] = _pointwise(F.soft_margin_loss, tgrad=False, reduction=red)
    CASES[f"bce_logits_{red}"] = (
        lambda red: lambda S, P: F.binary_cross_entropy_with_logits(
            S(_xy()[0]), S(_probs()[1]), reduction=red,
            weight=P(torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64), False),
            pos_weight=P(torch.tensor([1.5, 0.3, 1.0], dtype=torch.float64), False)))(red)
    CASES[f"bce_{red}"] = (lambda red: lambda S, P: F.binary_cross_entropy(
        S(_probs()[0]), S(_probs()[1], grad=False), reduction=red))(red)
    CASES[f"cross_entropy_{red}"] = (lambda red: lambda S, P: F.cross_entropy(
        S(_xy()[0]), S(_classes()), reduction=red))(red)
    CASES[f"cross_entropy_options_{red}"] = (lambda red: lambda S, P: F.cross_entropy(
        S(_xy()[0]), S(torch.where(torch.arange(N) % 4 == 1, torch.full((N,), -1), _classes())), reduction=red,
        weight=P(torch.tensor([0.2, 1.0, 3.0], dtype=torch.float64), False), ignore_index=-1, label_smoothing=0.1))(red)
    CASES[f"nll_{red}"] = (lambda red: lambda S, P: F.nll_loss(
        S(F.log_softmax(_xy()[0], 1)), S(_classes()), reduction=red,
        weight=P(torch.tensor([0.2, 1.0, 3.0], dtype=torch.float64), False)))(red)
    CASES[f"kl_div_{red}"] = (lambda red: lambda S, P: F.kl_div(
        S(_xy()[0]), S(_xy()[1], grad=False), reduction=red, log_target=True))(red)
    CASES[f"poisson_nll_{red}"] = _pointwise(F.poisson_nll_loss, tgrad=False, reduction=red)
    CASES[f"gaussian_nll_{red}"] = (lambda red: lambda S, P: F.gaussian_nll_loss(
        S(_xy()[0]), S(_xy()[1]), S(_probs((N,))[0]), reduction=red))(red)
    CASES[f"hinge_{red}"] = (lambda red: lambda S, P: F.hinge_embedding_loss(
        S(_xy()[0]), S(torch.where(_xy()[1] > 0, 1.0, -1.0).double(), grad=False), reduction=red))(red)
    CASES[f"margin_ranking_{red}"] = (lambda red: lambda S, P: F.margin_ranking_loss(
        S(_xy((N,))[0]), S(_xy((N,))[1]), S(torch.where(_xy((N,))[1] > 0, 1.0, -1.0).double(), grad=False), margin=0.2,
        reduction=red))(red)
    CASES[f"multilabel_soft_margin_{red}"] = (lambda red: lambda S, P: F.multilabel_soft_margin_loss(
        S(_xy()[0]), S((_xy()[1] > 0).double(), grad=False), reduction=red))(red)
    CASES[f"multi_margin_{red}"] = (lambda red: lambda S, P: F.multi_margin_loss(
        S(_xy()[0]), S(_classes()), reduction=red))(red)
    CASES[f"cosine_embedding_{red}"] = (lambda red: lambda S, P: F.cosine_embedding_loss(
        S(_xy()[0]), S(_xy()[1]), S(torch.where(_classes() > 0, 1, -1)), reduction=red))(red)
    CASES[f"triplet_{red}"] = (lambda red: lambda S, P: F.triplet_margin_loss(
        S(_xy()[0]), S(_xy()[1]), S(_xy()[0].flip(1)), reduction=red))(red)
# points on dim 2 (B, C, N) and dim 1 (B, N, C)
CASES["mse_bcn"] = _pointwise(F.mse_loss, dim=2, shape=(2, C, N))
CASES["mse_bnc"] = _pointwise(F.mse_loss, dim=1, shape=(2, N, C))
CASES["cross_entropy_bcn"] = lambda S, P: F.cross_entropy(S(_xy((2, C, N))[0], 2), S(_classes((2, N)), 1))
CASES["cross_entropy_probs"] = lambda S, P: F.cross_entropy(S(_xy()[0]), S(_xy()[1].softmax(1), grad=False),
                                                            label_smoothing=0.2)
CASES["kl_div_batchmean"] = lambda S, P: F.kl_div(S(_xy()[0]), S(_probs()[1], grad=False), reduction="batchmean")
CASES["mse_weight"] = lambda S, P: F.mse_loss(S(_xy()[0]), S(_xy()[1]), weight=S(_probs()[1]))
CASES["l1_weight"] = lambda S, P: F.l1_loss(S(_xy()[0]), S(_xy()[1]), weight=S(_probs()[1]))
CASES["huber_weight"] = lambda S, P: F.huber_loss(S(_xy()[0]), S(_xy()[1]), weight=S(_probs()[1]), delta=0.5)
CASES["mse_broadcast_target"] = lambda S, P: F.mse_loss(S(_xy()[0]), P(_xy((1, C))[1]))
CASES["relative_l2"] = lambda S, P: ms.ops.relative_l2_error(S(_xy((2, N, C))[0], 1), S(_xy((2, N, C))[1], 1), dim=1)
CASES["relative_l2_mean"] = lambda S, P: ms.ops.relative_l2_error(S(_xy()[0]), S(_xy()[1]), reduction="mean")


def _run(names):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's own warnings (broadcast target, kl_div 'mean')
        return run_cases(CASES, names)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_losses_match_single_process(world_size):
    names = sorted(CASES) if world_size in (1, 3) else [n for n in sorted(CASES) if "mean" in n or "bcn" in n]
    res = check(run_distributed(_run, world_size, names, timeout=600))
    if world_size > 1:
        for name, (_, _, fwd, bwd, typ) in res.items():
            if name.endswith("_none"):
                assert fwd == {} and typ == "ShardTensor", (name, fwd, typ)
            elif name.endswith("_mean") or name.endswith("_sum"):
                assert fwd == {"all_reduce": 1} and bwd == {"all_reduce": 1}, (name, fwd, bwd)
                assert typ == "ReplicatedTensor", name
        assert res["relative_l2_mean"][2] == {"all_reduce": 1}


def test_l1_weight_reaches_torch_function():
    """F.l1_loss's ``weight`` arrives in ``__torch_function__``'s kwargs (torch 2.13 drops it; _loss forwards it)."""
    import meshshard.tensor._rules._loss  # noqa: F401  (installs the forwarding when torch needs it)

    class Seen(torch.Tensor):
        kwargs: dict = {}

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func is F.l1_loss:
                cls.kwargs = dict(kwargs or {})
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))

    x, y = (t.as_subclass(Seen) for t in _xy())
    w = torch.rand(N, C, dtype=torch.float64)
    out = F.l1_loss(x, y, weight=w)
    assert Seen.kwargs["weight"] is w
    assert torch.equal(out.as_subclass(torch.Tensor), ((x - y).abs() * w).sum() / w.sum())
    F.l1_loss(x, y)
    assert Seen.kwargs.get("weight") is None


def _bad(kind):
    mesh = ms.init_mesh()
    x = ms.ShardTensor.from_local(torch.randn(4, 3), mesh, sizes=[3, 3], dim=1)
    try:
        if kind == "class_dim":
            F.cross_entropy(x, ms.ShardTensor.from_local(torch.zeros(3, dtype=torch.long), mesh, sizes=[3, 3]))
        elif kind == "plain_target":
            F.mse_loss(x, torch.randn(4, 6))
    except (ms.UnsupportedOpError, ms.ShardingError) as exc:
        return type(exc).__name__
    return None


@pytest.mark.parametrize("kind", ["class_dim", "plain_target"])
def test_bad_losses_raise_on_every_rank(kind):
    out = run_distributed(_bad, 2, kind)
    assert out[0] is not None and out == [out[0]] * 2


if __name__ == "__main__":  # quick look at every case on 3 ranks
    import sys

    for r, res in enumerate(run_distributed(_run, int(sys.argv[1]) if len(sys.argv) > 1 else 3, sorted(CASES))):
        print(r, {k: v for k, v in res.items() if not (v[0] and v[1])})
    print(res)
