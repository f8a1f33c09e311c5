"""Attention over sharded points (ring attention, cross-attention, nn.MultiheadAttention) vs single process."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import meshshard as ms
from meshshard.testing import DistributedError, run_distributed

# uneven, with empty shards from 2 ranks on
Q_SIZES = {1: [9], 2: [7, 0], 3: [5, 0, 8], 4: [4, 0, 6, 3]}
KV_SIZES = {1: [6], 2: [0, 6], 3: [3, 5, 0], 4: [2, 5, 0, 4]}
TOL = {torch.float64: dict(rtol=1e-8, atol=1e-10), torch.float32: dict(rtol=1e-5, atol=1e-6)}


def _rand(shape, seed, dtype):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _rows(sizes, rank):
    off = sum(sizes[:rank])
    return slice(off, off + sizes[rank])


def _shard(g, sizes, dim, mesh):
    """A ShardTensor over a fresh leaf holding this rank's rows of ``g`` along ``dim`` (and the leaf)."""
    rank = dist.get_rank()
    leaf = g.narrow(dim, sum(sizes[:rank]), sizes[rank]).clone().requires_grad_(True)
    return ms.ShardTensor.from_local(leaf, mesh, sizes=sizes, dim=dim), leaf


def _sdpa_case(mode, dtype, mask_kind, causal, self_attention):
    """mode: 'ring' (q, k, v sharded), 'q' (q sharded, k/v replicated), 'kv' (k/v sharded, q replicated)."""
    mesh = ms.init_mesh()
    world, rank = dist.get_world_size(), dist.get_rank()
    qsz = Q_SIZES[world]
    ksz = qsz if self_attention else KV_SIZES[world]
    nq, nk = sum(qsz), sum(ksz)
    q_g, k_g, v_g = _rand((2, 3, nq, 4), 1, dtype), _rand((2, 3, nk, 4), 2, dtype), _rand((2, 3, nk, 5), 3, dtype)
    gout = _rand((2, 3, nq, 5), 4, dtype)
    mask = None
    if mask_kind == "bool":
        mask = _rand((nq, nk), 5, torch.float64) > -0.8
        mask[0] = False  # a fully masked row: zeros, as torch's safe softmax
    elif mask_kind == "float":
        mask = _rand((3, nq, nk), 6, dtype)
    elif mask_kind == "keys":
        mask = _rand((1, nk), 7, torch.float64) > -0.5
    leaves_ref = [t.clone().requires_grad_(True) for t in (q_g, k_g, v_g)]
    ref = F.scaled_dot_product_attention(*leaves_ref, attn_mask=mask, is_causal=causal)
    ref_grads = torch.autograd.grad(ref, leaves_ref, gout)

    if mode in ("ring", "q"):
        q, q_leaf = _shard(q_g, qsz, 2, mesh)
    else:
        q = q_leaf = q_g.clone().requires_grad_(True)
    if mode in ("ring", "kv"):
        k, k_leaf = _shard(k_g, ksz, 2, mesh)
        v, v_leaf = _shard(v_g, ksz, 2, mesh)
    else:
        k = k_leaf = k_g.clone().requires_grad_(True)
        v = v_leaf = v_g.clone().requires_grad_(True)
    with ms.CommCounter() as fwd:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    if mode == "kv":
        assert isinstance(out, ms.tensor.ReplicatedTensor) and out.shape == ref.shape
        local_out, seed, want = out.to_plain(), gout / world, ref
    else:
        assert isinstance(out, ms.ShardTensor) and out.shape == ref.shape and out.shard_dim == 2
        local_out, seed, want = out.to_local(), gout[:, :, _rows(qsz, rank)], ref[:, :, _rows(qsz, rank)]
    with ms.CommCounter() as bwd:
        grads = list(torch.autograd.grad(local_out, [q_leaf, k_leaf, v_leaf], seed))
    errors = []
    if not torch.allclose(local_out, want, **TOL[dtype]):
        errors.append(f"forward: max abs diff {(local_out - want).abs().max().item():.3e}")
    for i, (name, sharded, sizes) in enumerate(
        (("q", mode != "kv", qsz), ("k", mode != "q", ksz), ("v", mode != "q", ksz))
    ):
        g = grads[i]
        if not sharded:  # replicated input: partial gradient on each rank
            dist.all_reduce(g)
            target = ref_grads[i]
        else:
            target = ref_grads[i][:, :, _rows(sizes, rank)]
        if not torch.allclose(g, target, **TOL[dtype]):
            errors.append(f"grad {name}: max abs diff {(g - target).abs().max().item():.3e}")
    return {"errors": errors, "fwd": dict(fwd.counts), "bwd": dict(bwd.counts)}


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("mode", ["ring", "q", "kv"])
def test_sdpa_matches_single_process(world_size, mode):
    p = world_size
    cases = [(torch.float64, None, False, True), (torch.float32, None, False, False),
             (torch.float64, "bool", False, False), (torch.float64, "float", False, True),
             (torch.float64, None, True, False), (torch.float64, "keys", False, False)]
    for dtype, mask_kind, causal, self_attention in cases:
        res = run_distributed(_sdpa_case, p, mode, dtype, mask_kind, causal, self_attention, timeout=300)
        for rank, r in enumerate(res):
            assert not r["errors"], f"rank {rank} {dtype} mask={mask_kind} causal={causal}: {r['errors']}"
            if p == 1 or mode == "q":
                assert sum(r["fwd"].values()) == 0 and sum(r["bwd"].values()) == 0
            elif mode == "ring":
                assert r["fwd"] == {"ring_shift": p - 1} and r["bwd"] == {"ring_shift": 2 * p - 1}
            else:
                assert r["fwd"] == {"all_reduce": 2} and r["bwd"] == {"all_reduce": 1}, r


def gout_pool(dtype):
    return _rand((2, 3, 8), 15, dtype)


def _mha_case(kind, dtype):  # noqa: C901  (one branch per case kind of a flat case table: splitting hides the table)
    """nn.MultiheadAttention (batch_first) on points sharded along dim 1, forward and parameter gradients."""
    mesh = ms.init_mesh()
    world, rank = dist.get_world_size(), dist.get_rank()
    sizes = Q_SIZES[world]
    n = sum(sizes)
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True, dtype=dtype)
    ref_mha = torch.nn.MultiheadAttention(8, 2, batch_first=True, dtype=dtype)
    ref_mha.load_state_dict(mha.state_dict())
    x_g = _rand((2, n, 8), 11, dtype)
    lat_g = _rand((2, 3, 8), 12, dtype)
    kpm = _rand((2, n), 13, torch.float64) > 0.7
    kpm[:, 0] = False
    gout = _rand((2, n, 8), 14, dtype)
    x, x_leaf = _shard(x_g, sizes, 1, mesh)
    xr = x_g.clone().requires_grad_(True)
    kw = {}
    if kind == "self":
        args, ref_args = (x, x, x), (xr, xr, xr)
    elif kind == "padding":
        args, ref_args = (x, x, x), (xr, xr, xr)  # a sharded key padding mask (gathered) vs the plain one
        kw = {"key_padding_mask": ms.ShardTensor.from_local(kpm[:, _rows(sizes, rank)].clone(), mesh, sizes=sizes,
                                                            dim=1)}
    elif kind == "causal":
        mask = torch.nn.Transformer.generate_square_subsequent_mask(n, dtype=dtype)
        args, ref_args = (x, x, x), (xr, xr, xr)
        kw = {"attn_mask": mask, "is_causal": True}
    elif kind == "pool":  # a few replicated latent tokens attend to the sharded points: replicated result
        args, ref_args = (lat_g, x, x), (lat_g, xr, xr)
    elif kind == "unbatched":  # (L, E) inputs, sharded on dim 0
        x, x_leaf = _shard(x_g[0], sizes, 0, mesh)
        xr = x_g[0].clone().requires_grad_(True)
        args, ref_args = (x, x, x), (xr, xr, xr)
        gout = gout[0]
    elif kind == "latents":  # points attend to a few replicated latent tokens: local
        args, ref_args = (x, lat_g, lat_g), (xr, lat_g, lat_g)
        kw = {"need_weights": True}
    else:
        raise ValueError(kind)
    kw.setdefault("need_weights", False)
    ref_kw = dict(kw, key_padding_mask=kpm) if kind == "padding" else kw
    ref, _ = ref_mha(*ref_args, **ref_kw)
    ref_params = [p for p in ref_mha.parameters()]
    ref_grads = torch.autograd.grad(ref, [xr, *ref_params], gout_pool(dtype) if kind == "pool" else gout)
    with ms.CommCounter() as fwd:
        out, weights = mha(*args, **kw)
    dim = 0 if kind == "unbatched" else 1
    rows = (slice(None),) * dim + (_rows(sizes, rank),)
    if kind == "pool":
        local_out, seed, want = out.to_plain(), gout_pool(dtype) / world, ref
    else:
        local_out, seed, want = out.to_local(), gout[rows], ref[rows]
    with ms.CommCounter() as bwd:
        grads = torch.autograd.grad(local_out, [x_leaf, *mha.parameters()], seed)
    errors = []
    tol = TOL[dtype]
    if kind == "pool":
        if not isinstance(out, ms.tensor.ReplicatedTensor) or out.shape != ref.shape:
            errors.append(f"result {type(out).__name__} {tuple(out.shape)}")
    elif not isinstance(out, ms.ShardTensor) or out.shard_dim != dim or out.shape != ref.shape:
        errors.append(f"result {type(out).__name__} {tuple(out.shape)}")
    if not torch.allclose(local_out, want, **tol):
        errors.append("forward")
    if kind == "latents":
        _, ref_w = ref_mha(*ref_args, need_weights=True)
        if not torch.allclose(weights.to_local(), ref_w[:, _rows(sizes, rank)], **tol):
            errors.append("attention weights")
    if not torch.allclose(grads[0], ref_grads[0][rows], **tol):
        errors.append("grad x")
    for i, g in enumerate(grads[1:]):
        dist.all_reduce(g)
        if not torch.allclose(g, ref_grads[1 + i], **tol):
            errors.append(f"grad param {i}")
    return {"errors": errors, "fwd": dict(fwd.counts), "bwd": dict(bwd.counts)}


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", ["self", "padding", "causal", "latents", "pool", "unbatched"])
def test_multihead_attention_matches_single_process(world_size, kind):
    for dtype in (torch.float64, torch.float32):
        res = run_distributed(_mha_case, world_size, kind, dtype, timeout=300)
        for rank, r in enumerate(res):
            assert not r["errors"], f"rank {rank} {kind} {dtype}: {r['errors']}"
            if kind == "latents" or world_size == 1:
                assert sum(r["fwd"].values()) == 0 and sum(r["bwd"].values()) == 0, r
            elif kind == "pool":
                assert r["fwd"] == {"all_reduce": 2} and r["bwd"] == {"all_reduce": 1}, r
            else:
                gathered = {"all_to_all": 1} if kind == "padding" else {}
                assert r["fwd"] == {"ring_shift": world_size - 1, **gathered}, r
                assert r["bwd"] == {"ring_shift": 2 * world_size - 1}, r


class _PointTransformer(torch.nn.Module):
    def __init__(self, width: int = 16, heads: int = 4):
        super().__init__()
        self.embed = torch.nn.Linear(3, width)
        self.norm1 = torch.nn.LayerNorm(width)
        self.attn = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.GELU(),
                                       torch.nn.Linear(2 * width, width))
        self.head = torch.nn.Linear(width, 1)

    def forward(self, pts: torch.Tensor) -> torch.Tensor:
        h = self.embed(pts)
        a = self.norm1(h)
        h = h + self.attn(a, a, a, need_weights=False)[0]
        h = h + self.mlp(self.norm2(h))
        return self.head(h)


def _train(sizes, steps):
    """5 Adam steps of a point transformer: returns the losses (sharded if sizes is not None)."""
    torch.manual_seed(0)
    model = _PointTransformer().double()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    n = sum(sizes) if sizes else 23
    pts = _rand((1, n, 3), 21, torch.float64)
    target = (pts[..., :1] * pts[..., 1:2]).sin() + pts[..., 2:].cos()
    mesh = None
    if sizes:
        mesh = ms.init_mesh()
        pts, _ = _shard(pts, sizes, 1, mesh)
        target, _ = _shard(target, sizes, 1, mesh)
        pts, target = pts.detach(), target.detach()
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(pts) - target) ** 2).mean()
        loss.backward()
        if mesh is not None:
            ms.nn.sync_gradients(model, mesh)
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def _train_worker(steps):
    world = dist.get_world_size()
    sizes = {2: [15, 8], 3: [9, 0, 14]}[world]
    return _train(sizes, steps)


@pytest.mark.parametrize("world_size", [2, 3])
def test_point_transformer_trains_with_single_process_losses(world_size):
    steps = 5
    serial = _train(None, steps)
    assert serial[-1] < serial[0]
    for losses in run_distributed(_train_worker, world_size, steps, timeout=300):
        assert losses == pytest.approx(serial, rel=1e-8)


def _refusals():
    mesh = ms.init_mesh()
    sizes = Q_SIZES[dist.get_world_size()]
    q, _ = _shard(_rand((2, sum(sizes), 4), 1, torch.float64), sizes, 1, mesh)
    out = []
    for kw in ({"dropout_p": 0.1},):
        try:
            F.scaled_dot_product_attention(q, q, q, **kw)
        except ms.UnsupportedOpError as exc:
            out.append(str(exc).split(":")[0])
    head = _rand((5, 2, 4), 2, torch.float64)
    h, _ = _shard(head, {1: [4], 3: [1, 3, 0]}[dist.get_world_size()], 2, mesh)  # the channel dim sharded
    try:
        F.scaled_dot_product_attention(h, h, h)
    except (ms.UnsupportedOpError, ms.ShardingError) as exc:
        out.append(type(exc).__name__)
    mha = torch.nn.MultiheadAttention(4, 2, batch_first=True, dtype=torch.float64)
    try:
        mha(q, q, q)  # need_weights defaults to True
    except ms.UnsupportedOpError as exc:
        out.append("need_weights" in str(exc))
    return out


@pytest.mark.parametrize("world_size", [1, 3])
def test_unsupported_forms_raise_on_every_rank(world_size):
    res = run_distributed(_refusals, world_size, timeout=120)
    assert all(r == res[0] for r in res)
    assert res[0] == ["torch.nn.functional.scaled_dot_product_attention on a ShardTensor", "UnsupportedOpError", True]


def test_errors_propagate_as_distributed_error():
    with pytest.raises(DistributedError):
        run_distributed(_bad_mask, 2, timeout=120)


def _bad_mask():
    mesh = ms.init_mesh()
    q, _ = _shard(_rand((1, 7, 4), 1, torch.float64), [7, 0], 1, mesh)
    F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(3, 3, dtype=torch.bool))


@pytest.mark.timeout(1200)
def test_opinfo_sweep_attention_ops():
    """The OpInfo sweep's verdicts for the attention ops: every case exact or raising, on all 3 ranks alike."""
    from tests.tensor.sweep_attention import NAMES
    from tests.tensor.test_opinfo_sweep import OK, RAISES, SKIP, _sweep

    per_rank = run_distributed(_sweep, 3, NAMES, timeout=600)
    assert all(r == per_rank[0] for r in per_rank[1:])
    verdicts = [c for cases in per_rank[0].values() for c in cases]
    assert verdicts and all(code in (OK, RAISES, SKIP) for code, _ in verdicts), verdicts
    assert any(code == OK for code, _ in verdicts)  # the sharded-points cases are computed, not refused
