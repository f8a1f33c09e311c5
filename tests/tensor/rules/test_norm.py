"""BatchNorm / InstanceNorm over sharded points (meshshard/tensor/_rules/_norm.py) vs single-process torch."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import meshshard as ms
from meshshard.testing import run_distributed

from .._serial import check, run_cases, split

B, C, N = 2, 3, 13


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 2 + 0.5


def _wb(S, P):
    return P(torch.linspace(0.5, 1.5, C, dtype=torch.float64)), P(torch.linspace(-1, 1, C, dtype=torch.float64))


def _bn(shape, dim, training=True, running=True):
    def case(S, P):
        w, b = _wb(S, P)
        rm = torch.linspace(0, 1, C, dtype=torch.float64) if running else None
        rv = torch.linspace(1, 2, C, dtype=torch.float64) if running else None
        out = F.batch_norm(S(_x(*shape), dim), rm, rv, w, b, training, 0.3, 1e-5)
        return (out, rm, rv) if running else out
    return case


CASES = {
    "bn1d_nc": _bn((N, C), 0),
    "bn1d_bcn": _bn((B, C, N), 2),
    "bn1d_bcn_batch_sharded": _bn((N, C, 4), 0),
    "bn2d": _bn((B, C, N, 2), 2),
    "bn3d": _bn((B, C, 2, N, 2), 3),
    "bn_no_running": _bn((B, C, N), 2, running=False),
    "bn_eval": _bn((B, C, N), 2, training=False),
    "instance_norm": lambda S, P: F.instance_norm(S(_x(B, C, N), 2), weight=_wb(S, P)[0], bias=_wb(S, P)[1]),
    "instance_norm_running": lambda S, P: (lambda rm, rv: (F.instance_norm(
        S(_x(B, C, N), 2), rm, rv, use_input_stats=True, momentum=0.2), rm, rv))(
        torch.zeros(C, dtype=torch.float64), torch.ones(C, dtype=torch.float64)),
}


def _run(names):
    return run_cases(CASES, names)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_norms_match_single_process(world_size):
    res = check(run_distributed(_run, world_size, sorted(CASES), timeout=600))
    if world_size > 1:
        for name in ("bn1d_nc", "bn1d_bcn", "bn2d", "bn3d", "bn_no_running", "instance_norm"):
            assert res[name][2] == {"all_reduce": 1}, (name, res[name][2])
        assert res["bn_eval"][2] == {}
        assert res["bn1d_bcn"][3] == {"all_reduce": 2}  # the norm's backward + the test loss's own reduction


def _module(sizes, steps):
    """nn.BatchNorm1d in train mode for a few steps, then eval: running stats identical on every rank."""
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    torch.manual_seed(0)
    ref = torch.nn.BatchNorm1d(C, momentum=None).double()
    bn = torch.nn.BatchNorm1d(C, momentum=None).double()
    outs = []
    for step in range(steps):
        x = _x(B, C, sum(sizes)) + step
        off = sum(sizes[:rank])
        xs = ms.ShardTensor.from_local(x[..., off : off + sizes[rank]], mesh, sizes=sizes, dim=2)
        y, yr = bn(xs), ref(x)
        outs.append(torch.allclose(y.full_tensor().to_plain(), yr, rtol=1e-10, atol=1e-12))
    bn.eval()
    ref.eval()
    with ms.CommCounter() as cc:
        y = bn(xs)
    outs.append(torch.allclose(y.full_tensor().to_plain(), ref(x), rtol=1e-10, atol=1e-12))
    return (all(outs), cc.total, torch.allclose(bn.running_mean, ref.running_mean, rtol=1e-12),
            torch.allclose(bn.running_var, ref.running_var, rtol=1e-12),
            int(bn.num_batches_tracked) == steps)


@pytest.mark.parametrize("world_size", [2, 3])
def test_batchnorm_module_running_stats(world_size):
    for ok, eval_comm, rm, rv, tracked in run_distributed(_module, world_size, split(N, world_size), 3):
        assert ok and eval_comm == 0 and rm and rv and tracked  # eval: no communication


def _float32(sizes):
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    x = (torch.randn(B, C, sum(sizes), generator=torch.Generator().manual_seed(1)) * 0.1 + 100.0)
    off = sum(sizes[:rank])
    xs = ms.ShardTensor.from_local(x[..., off : off + sizes[rank]], mesh, sizes=sizes, dim=2)
    y = F.batch_norm(xs, None, None, training=True)
    return torch.allclose(y.full_tensor().to_plain(), F.batch_norm(x, None, None, training=True), rtol=1e-4,
                          atol=1e-4)


def test_float32_large_mean_keeps_precision():
    assert all(run_distributed(_float32, 3, [40, 0, 60]))


def _bad(kind):
    mesh = ms.init_mesh()
    try:
        if kind == "channels":
            F.batch_norm(ms.ShardTensor.from_local(torch.randn(2, 3, 4), mesh, sizes=[3, 3], dim=1), None, None,
                         training=True)
        else:
            F.batch_norm(ms.ShardTensor.from_local(torch.randn(1 - dist.get_rank(), 3), mesh, sizes=[1, 0]),
                         None, None, training=True)
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__
    return None


@pytest.mark.parametrize("kind,err", [("channels", "UnsupportedOpError"), ("one_value", "ValueError")])
def test_bad_batchnorm_raises_on_every_rank(kind, err):
    assert run_distributed(_bad, 2, kind) == [err, err]


if __name__ == "__main__":
    import sys

    for r, res in enumerate(run_distributed(_run, int(sys.argv[1]), sorted(CASES))):
        print(r, {k: v for k, v in res.items() if not (v[0] and v[1])})
    print(res)
