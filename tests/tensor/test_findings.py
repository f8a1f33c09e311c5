"""Regression tests for every silent wrong answer and rank divergence found in the ShardTensor core (issue 13).

Each check runs on 3 gloo ranks with uneven shards that include an empty rank and a one-point rank, and
compares with single-process torch on the gathered tensor; errors must be raised on every rank.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import meshshard as ms
from meshshard.testing import run_distributed


def _shard(g: torch.Tensor, sizes, mesh, dim=0, grad=False):
    rank = dist.get_rank()
    off = sum(sizes[:rank])
    local = g.narrow(dim, off, sizes[rank]).clone().requires_grad_(grad)
    return ms.ShardTensor.from_local(local, mesh, sizes=sizes, dim=dim), local


def _rows(sizes):
    rank = dist.get_rank()
    off = sum(sizes[:rank])
    return slice(off, off + sizes[rank])


def _backward_entry_points(sizes):
    mesh = ms.init_mesh()
    g = torch.randn(sum(sizes), 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    lin = torch.nn.Linear(3, 2).double()
    torch.nn.init.constant_(lin.weight, 0.3)
    torch.nn.init.constant_(lin.bias, 0.1)
    ref_lin = torch.nn.Linear(3, 2).double()
    ref_lin.load_state_dict(lin.state_dict())
    (ref_lin(g) ** 2).mean().backward()
    ref = ref_lin.weight.grad.clone()
    x, _ = _shard(g, sizes, mesh)
    out = {}
    for how in ("backward", "backward_g", "autograd_backward", "autograd_grad"):
        lin.zero_grad()
        loss = (lin(x) ** 2).mean()
        if how == "backward":
            loss.backward()
        elif how == "backward_g":
            loss.backward(torch.ones(()))
        elif how == "autograd_backward":
            torch.autograd.backward(loss)
        else:
            (gw,) = torch.autograd.grad(loss, lin.weight)
            out[how] = torch.allclose(gw, ref)
            continue
        ms.nn.sync_gradients(lin, mesh)
        out[how] = torch.allclose(lin.weight.grad, ref)
    # with respect to sharded coordinates, and second derivatives (create_graph)
    gx = g.clone().requires_grad_()
    (ref_gx,) = torch.autograd.grad((gx**3).sum(), gx, create_graph=True)
    (ref_gxx,) = torch.autograd.grad(ref_gx.sum(), gx)
    xs, _ = _shard(g, sizes, mesh, grad=True)
    (sx,) = torch.autograd.grad((xs**3).sum(), xs, create_graph=True)
    (sxx,) = torch.autograd.grad(sx.sum(), xs)
    out["coords"] = isinstance(sx, ms.ShardTensor) and torch.allclose(sx.full_tensor(), ref_gx)
    out["coords_second"] = torch.allclose(sxx.full_tensor(), ref_gxx)
    return out


@pytest.mark.parametrize("sizes", [[5, 0, 9], [1, 7, 3]])
def test_gradients_equal_however_backward_is_entered(sizes):
    for out in run_distributed(_backward_entry_points, 3, sizes):
        assert all(out.values()), out


def _aliases_and_values(sizes):
    mesh = ms.init_mesh()
    g = torch.randn(sum(sizes), 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x, _ = _shard(g, sizes, mesh)
    y, _ = _shard(g.flip(1), sizes, mesh)
    w = torch.arange(4.0, dtype=torch.float64)
    checks = {
        "to_keeps_plain": type(w.to(x)) is torch.Tensor and float(w.to(x).sum()) == 6.0,
        "type_as_keeps_plain": type(w.type_as(x)) is torch.Tensor,
        "mean_axis": torch.allclose(x.mean(axis=0), g.mean(axis=0)),
        "keepdims": x.sum(0, keepdims=True).shape == (1, 4),
        "max_other": torch.allclose(torch.max(x, other=y).full_tensor(), torch.max(g, g.flip(1))),
        "shape_global": tuple(x.shape) == tuple(g.shape) and len(x) == g.shape[0] and x.numel() == g.numel(),
        "shape_arithmetic": torch.allclose(((x - y) ** 2).sum() / x.shape[0], ((g - g.flip(1)) ** 2).sum() / len(g)),
        "squeeze0": tuple(x.unsqueeze(0).squeeze(0).shape) == tuple(g.shape) and x.squeeze(0).shape == g.shape,
        "view_heads": torch.equal(x.view(1, g.shape[0], 2, 2).full_tensor(), g.view(1, -1, 2, 2)),
        "view_n1c": torch.equal(x.view(g.shape[0], 1, 4).full_tensor(), g.view(-1, 1, 4)),
        "reshape_btc": torch.equal(x.reshape(1, g.shape[0], -1).full_tensor(), g.reshape(1, g.shape[0], -1)),
        "flatten_merge": torch.equal(x.reshape(-1).full_tensor(), g.reshape(-1)),
        "roll": torch.equal(x.roll(2, 0).full_tensor(), g.roll(2, 0)),
        "flip": torch.equal(x.flip(0).full_tensor(), g.flip(0)),
        "slice_step": torch.equal(x[1::3].full_tensor(), g[1::3]),
        "int_row": torch.equal(x[2], g[2]) and torch.equal(x[-1], g[-1]),
        "split": all(torch.equal(a.full_tensor(), b) for a, b in zip(x.split(4), g.split(4))),
        "chunk": len(x.chunk(3)) == len(g.chunk(3)),
    }
    idx = torch.tensor([3, 0, 0, len(g) - 1, 1])
    sidx, _ = _shard(idx, [2, 3, 0], mesh)
    checks["getitem_sharded_idx"] = torch.equal(x[sidx].full_tensor(), g[idx])
    checks["index_select_sharded"] = torch.equal(x.index_select(0, sidx).full_tensor(), g.index_select(0, idx))
    checks["index_select_plain"] = torch.equal(x.index_select(0, idx), g.index_select(0, idx))
    gidx = torch.randint(0, len(g), (len(g), 4), generator=torch.Generator().manual_seed(2))
    sg, _ = _shard(gidx, sizes, mesh)
    checks["gather_global"] = torch.equal(torch.gather(x, 0, sg).full_tensor(), torch.gather(g, 0, gidx))
    mask = g[:, 0] > 0
    sm, _ = _shard(mask, sizes, mesh)
    where = torch.where(sm)
    checks["where_one_arg"] = torch.equal(where[0].full_tensor(), torch.where(mask)[0])
    checks["mask_select"] = torch.equal(x[sm].full_tensor(), g[mask])
    # NaN on each rank in turn, and the index of the first NaN
    for r in range(len(sizes)):
        if sizes[r] == 0:
            continue
        gn = g.clone()
        gn[sum(sizes[:r]), 1] = float("nan")
        xn, _ = _shard(gn, sizes, mesh)
        checks[f"nan_max_{r}"] = torch.equal(xn.amax(0), gn.amax(0), ) if False else torch.allclose(
            xn.amax(0), gn.amax(0), equal_nan=True)
        checks[f"nan_argmax_{r}"] = torch.equal(xn.argmax(0), gn.argmax(0)) and int(xn.argmax()) == int(gn.argmax())
        checks[f"nan_maxdim_{r}"] = torch.equal(xn.max(0).indices, gn.max(0).indices)
    # the gradient of a norm at an all-zero column is 0, as torch
    gz = g.clone()
    gz[:, 2] = 0
    xz, lz = _shard(gz, sizes, mesh, grad=True)
    ref_z = gz.clone().requires_grad_()
    ref_z.norm(dim=0).sum().backward()
    xz.norm(dim=0).sum().backward()
    checks["norm_grad_zero"] = torch.allclose(lz.grad, ref_z.grad[_rows(sizes)]) and not lz.grad.isnan().any()
    return checks


@pytest.mark.parametrize("sizes", [[5, 0, 9], [1, 7, 3]])
def test_findings_are_exact(sizes):
    for out in run_distributed(_aliases_and_values, 3, sizes):
        bad = [k for k, v in out.items() if not v]
        assert not bad, bad


def _big_slices():
    mesh = ms.init_mesh()
    sizes = [500_000, 0, 1_000_000]
    rank = dist.get_rank()
    x = ms.ShardTensor.from_local(torch.arange(sum(sizes[:rank]), sum(sizes[: rank + 1]), dtype=torch.float64),
                                  mesh, sizes=sizes)
    a = x[:1_200_000]
    pieces = x.split(1_100_000, 0)
    return (tuple(a.shape), a.sharding_sizes, [tuple(p.shape) for p in pieces],
            float(a.sum()), x.narrow(0, 1_400_000, 3).full_tensor().tolist())


def test_global_lengths_beyond_any_sentinel():
    for shape, sizes, pieces, total, tail in run_distributed(_big_slices, 3):
        assert shape == (1_200_000,) and sizes == (500_000, 0, 700_000)
        assert pieces == [(1_100_000,), (400_000,)]
        assert total == float(sum(range(1_200_000)))
        assert tail == [1_400_000.0, 1_400_001.0, 1_400_002.0]


def _errors(kind):
    mesh = ms.init_mesh()
    sizes = [1, 0, 4]
    x, _ = _shard(torch.randn(5, 4), sizes, mesh)
    if kind == "plain_global":  # (x.new_zeros(x.shape) is sharded like x: it names x's global shape)
        return x + torch.zeros(x.shape)
    if kind == "index_out_of_range":
        idx, _ = _shard(torch.tensor([0, 9, 1]), [1, 1, 1], mesh)
        return x[idx]
    if kind == "unbind_points":
        return list(x)


@pytest.mark.parametrize("kind, match", [
    ("plain_global", r"a plain tensor of shape \(5, 4\) spans the sharded dimension"),
    ("index_out_of_range", r"index out of range for dimension 0 with size 5 \(indices from rank\(s\) \[1\]\)"),
    ("unbind_points", "would broadcast every point"),
])
def test_errors_are_raised_on_every_rank(kind, match):
    with pytest.raises(ms.testing.DistributedError, match=match) as info:
        run_distributed(_errors, 3, kind, timeout=30)
    assert sorted(f.rank for f in info.value.failures) == [0, 1, 2]
    assert all(f.kind == "exception" for f in info.value.failures)


def _dtype_views(sizes):
    """Every (source, target) dtype pair that changes the item size, along dim 0 and along a sharded last dim."""
    mesh = ms.init_mesh()
    out = {}
    for src, dst in ((torch.int64, torch.float32), (torch.float32, torch.int64), (torch.int32, torch.float16),
                     (torch.float64, torch.int16), (torch.int16, torch.float64), (torch.float32, torch.float32)):
        for dim in (0, 1):
            shape = (sum(sizes), 4) if dim == 0 else (4, sum(sizes))
            g = (torch.arange(4 * sum(sizes), dtype=torch.int64).reshape(shape) * 1234567).to(src)
            x, _ = _shard(g, sizes, mesh, dim=dim)
            try:
                ref = g.view(dst)
            except RuntimeError:
                ref = None
            try:
                y = x.view(dst)
                full = y.full_tensor().to_plain().contiguous()
                out[(str(src), str(dst), dim)] = (ref is not None and full.shape == ref.shape
                                                  and torch.equal(full.view(torch.uint8), ref.view(torch.uint8)))
            except (RuntimeError, NotImplementedError) as exc:
                out[(str(src), str(dst), dim)] = f"{type(exc).__name__}: {exc}".replace(f"[rank {dist.get_rank()}]", "")
    return out


@pytest.mark.parametrize("sizes", [[3, 0, 1], [2, 0, 4], [1, 1, 1]])
def test_dtype_views_that_change_the_item_size_are_exact_or_refused_alike(sizes):
    results = run_distributed(_dtype_views, 3, sizes)
    for key, verdict in results[0].items():
        assert all(r[key] == verdict for r in results), (key, [r[key] for r in results])  # agreed on every rank
        if key[2] == 0 or key[0] == key[1]:
            assert verdict is True, (key, verdict)  # the sharded dim keeps its length: always exact
    last = {k: v for k, v in results[0].items() if k[2] == 1}
    shrink = ("torch.float32", "torch.int64", 1)  # 4-byte items into 8-byte ones along the sharded dim
    if all(s % 2 == 0 for s in sizes):
        assert last[shrink] is True
    else:
        assert "needs each rank's bytes there to make whole items of 8 bytes" in last[shrink]
    assert last[("torch.int64", "torch.float32", 1)] is True  # grows: always exact


def _grad_of_a_sharded_leaf(sizes):
    mesh = ms.init_mesh()
    g = torch.randn(sum(sizes), 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    x = ms.ShardTensor.from_local(g[_rows(sizes)].clone(), mesh, sizes=sizes).requires_grad_()  # x itself the leaf
    out = {}
    cases = {"full_tensor": (lambda t: (t**2).full_tensor().sum(), lambda t: (t**2).sum()),
             "sum": (lambda t: (t**2).sum(),) * 2, "mean": (lambda t: (t**3).mean(),) * 2}
    for name, (loss_of, ref_loss_of) in cases.items():
        (gx,) = torch.autograd.grad(loss_of(x), [x])
        ref = g.clone().requires_grad_()
        (gref,) = torch.autograd.grad(ref_loss_of(ref), [ref])
        out[name] = isinstance(gx, ms.ShardTensor) and torch.allclose(gx.full_tensor(), gref)
    (x**2).sum().backward()
    out["backward"] = isinstance(x.grad, ms.ShardTensor) and torch.allclose(x.grad.full_tensor(), 2 * g)
    return out


@pytest.mark.parametrize("sizes", [[3, 0, 1], [0, 5, 0]])
def test_autograd_grad_with_respect_to_a_sharded_leaf(sizes):
    for out in run_distributed(_grad_of_a_sharded_leaf, 3, sizes):
        assert all(out.values()), out
