"""Grid ops along the sharded dim through the row halo: conv, pooling, pad, interpolate, unfold, diff; a U-Net and a
window attention over a Morton-ordered cloud, all equal to single process (forward and backward, float64)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import meshshard as ms
from meshshard.testing import run_distributed

from .._serial import check, run_cases

B, C = 2, 3


def _x(*shape, seed=4):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _w(*shape):
    return _x(*shape, seed=9)


CASES = {
    # convolutions along the sharded spatial dim
    "conv1d_k3": lambda S, P: F.conv1d(S(_x(B, C, 13), 2), P(_w(4, C, 3)), P(_w(4)), padding=1),
    "conv1d_k5_s2": lambda S, P: F.conv1d(S(_x(B, C, 13), 2), P(_w(4, C, 5)), stride=2, padding=2),
    "conv1d_same_even_dil": lambda S, P: F.conv1d(S(_x(B, C, 13), 2), P(_w(4, C, 4)), padding="same", dilation=2),
    "conv1d_valid_s3": lambda S, P: F.conv1d(S(_x(B, C, 14), 2), P(_w(4, C, 3)), stride=3, padding="valid"),
    "conv1d_groups": lambda S, P: F.conv1d(S(_x(B, 4, 13), 2), P(_w(6, 2, 3)), padding=1, groups=2),
    "conv1d_unbatched": lambda S, P: F.conv1d(S(_x(C, 13), 1), P(_w(4, C, 3)), padding=1),
    "conv1d_wide_pad": lambda S, P: F.conv1d(S(_x(B, C, 9), 2), P(_w(2, C, 3)), P(_w(2)), padding=4),
    "conv2d_h": lambda S, P: F.conv2d(S(_x(1, C, 12, 5), 2), P(_w(4, C, 3, 3)), P(_w(4)), padding=1),
    "conv2d_w": lambda S, P: F.conv2d(S(_x(1, C, 5, 12), 3), P(_w(4, C, 3, 5)), stride=(1, 2), padding=(1, 2)),
    "conv2d_dil": lambda S, P: F.conv2d(S(_x(1, C, 12, 5), 2), P(_w(4, C, 3, 3)), padding=2, dilation=2),
    "conv2d_same_even": lambda S, P: F.conv2d(S(_x(1, C, 12, 6), 2), P(_w(2, C, 2, 4)), padding="same"),
    "conv3d_d": lambda S, P: F.conv3d(S(_x(1, 2, 4, 3, 11), 4), P(_w(3, 2, 3, 3, 3)), padding=1),
    "conv3d_h_s2": lambda S, P: F.conv3d(S(_x(1, 2, 11, 3, 4), 2), P(_w(3, 2, 3, 1, 2)), stride=2),
    "conv2d_module_reflect": lambda S, P: torch.nn.Conv2d(C, 2, 3, padding=1, padding_mode="reflect").double()(
        S(_x(1, C, 12, 5), 2)),
    "conv2d_module_circular": lambda S, P: torch.nn.Conv2d(C, 2, 3, padding=1, padding_mode="circular").double()(
        S(_x(1, C, 12, 5), 2)),
    # pooling
    "max_pool1d_dil_ceil": lambda S, P: F.max_pool1d(S(_x(B, C, 13), 2), 3, 2, 1, dilation=2, ceil_mode=True),
    "max_pool1d_idx": lambda S, P: F.max_pool1d(S(_x(B, C, 13), 2), 2, return_indices=True),
    "max_pool2d_2": lambda S, P: F.max_pool2d(S(_x(1, C, 12, 6), 2), 2),
    "max_pool2d_idx": lambda S, P: F.max_pool2d(S(_x(1, C, 13, 6), 2), 3, 2, 1, ceil_mode=True, return_indices=True),
    "max_pool2d_w": lambda S, P: F.max_pool2d(S(_x(1, C, 5, 13), 3), (2, 3), (1, 2), (1, 1), return_indices=True),
    "max_pool3d_idx": lambda S, P: F.max_pool3d(S(_x(1, 2, 3, 4, 11), 4), 2, return_indices=True),
    "max_pool2d_module": lambda S, P: torch.nn.MaxPool2d(3, 2, 1)(S(_x(1, C, 12, 5), 2)),
    "avg_pool1d_ceil": lambda S, P: F.avg_pool1d(S(_x(B, C, 13), 2), 3, 2, 1, ceil_mode=True,
                                                 count_include_pad=False),
    "avg_pool2d_ceil": lambda S, P: F.avg_pool2d(S(_x(1, C, 13, 6), 2), 3, 2, 1, ceil_mode=True),
    "avg_pool2d_excl": lambda S, P: F.avg_pool2d(S(_x(1, C, 13, 6), 2), 3, 2, 1, count_include_pad=False),
    "avg_pool2d_divisor": lambda S, P: F.avg_pool2d(S(_x(1, C, 13, 6), 2), 2, divisor_override=3),
    "avg_pool3d": lambda S, P: F.avg_pool3d(S(_x(1, 2, 11, 3, 4), 2), 3, 2, 1, ceil_mode=True),
    # F.pad along the sharded dim
    "pad_constant": lambda S, P: F.pad(S(_x(1, C, 12, 5), 2), (1, 0, 2, 3), value=1.5),
    "pad_crop": lambda S, P: F.pad(S(_x(1, C, 12, 5), 2), (0, 0, -2, 1)),
    "pad_reflect": lambda S, P: F.pad(S(_x(1, C, 12, 5), 2), (1, 1, 3, 2), mode="reflect"),
    "pad_replicate_wide": lambda S, P: F.pad(S(_x(1, C, 12, 5), 2), (0, 0, 4, 6), mode="replicate"),
    "pad_circular": lambda S, P: F.pad(S(_x(1, C, 12, 5), 2), (2, 1, 3, 2), mode="circular"),
    "pad_reflect_1d": lambda S, P: F.pad(S(_x(B, C, 13), 2), (4, 2), mode="reflect"),
    "constant_pad_nd": lambda S, P: torch.constant_pad_nd(S(_x(13, C), 0), (0, 0, 2, 1), 0.5),
    # F.interpolate along the sharded dim
    "nearest_x2": lambda S, P: F.interpolate(S(_x(1, C, 11, 4), 2), scale_factor=2),
    "nearest_size": lambda S, P: F.interpolate(S(_x(1, C, 11, 4), 2), size=(17, 3)),
    "nearest_exact": lambda S, P: F.interpolate(S(_x(1, C, 11, 4), 2), scale_factor=1.7, mode="nearest-exact"),
    "nearest_w": lambda S, P: F.interpolate(S(_x(1, C, 4, 11), 3), size=(5, 7)),
    "linear_x2_5": lambda S, P: F.interpolate(S(_x(B, C, 13), 2), scale_factor=2.5, mode="linear"),
    "bilinear_x2": lambda S, P: F.interpolate(S(_x(1, C, 11, 4), 2), scale_factor=2, mode="bilinear"),
    "bilinear_ac": lambda S, P: F.interpolate(S(_x(1, C, 11, 4), 2), size=(19, 5), mode="bilinear",
                                              align_corners=True),
    "bilinear_down": lambda S, P: F.interpolate(S(_x(1, C, 13, 4), 2), size=(5, 3), mode="bilinear"),
    "bilinear_recompute": lambda S, P: F.interpolate(S(_x(1, C, 11, 4), 2), scale_factor=1.3, mode="bilinear",
                                                     recompute_scale_factor=True),
    "trilinear_d": lambda S, P: F.interpolate(S(_x(1, 2, 3, 4, 9), 4), scale_factor=(1, 1.5, 2), mode="trilinear"),
    "upsample_module": lambda S, P: torch.nn.Upsample(scale_factor=2, mode="bilinear")(S(_x(1, C, 11, 4), 2)),
    "interpolate_batch": lambda S, P: F.interpolate(S(_x(5, C, 4, 4), 0), scale_factor=2, mode="bilinear"),
    # unfold, diff
    "tensor_unfold": lambda S, P: S(_x(13, C), 0).unfold(0, 4, 3),
    "tensor_unfold_step1": lambda S, P: S(_x(B, 13, C), 1).unfold(1, 5, 1),
    "tensor_unfold_other_dim": lambda S, P: S(_x(13, 6), 0).unfold(1, 2, 2),
    "f_unfold_h": lambda S, P: F.unfold(S(_x(1, C, 11, 6), 2), 3, padding=1, stride=2),
    "f_unfold_dil": lambda S, P: F.unfold(S(_x(1, C, 11, 6), 2), (2, 3), dilation=(2, 1)),
    "diff": lambda S, P: torch.diff(S(_x(13, C), 0), dim=0),
    "diff_n3_ends": lambda S, P: torch.diff(S(_x(13, C), 0), n=3, dim=0, prepend=P(_w(2, C)), append=P(_w(1, C))),
    "diff_other_dim": lambda S, P: S(_x(13, C), 0).diff(dim=1),
}


def _run(names):
    return run_cases(CASES, names)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_grid_ops_match_single_process(world_size):
    res = check(run_distributed(_run, world_size, sorted(CASES), timeout=600))
    for name, (_, _, fwd, _, kind) in res.items():
        assert kind in ("ShardTensor", "tuple"), (name, kind)
        assert set(fwd) <= {"all_to_all"} and fwd.get("all_to_all", 0) <= 2, (name, fwd)  # reflect conv: pad + conv
    if world_size > 1:
        assert res["conv2d_h"][2] == {"all_to_all": 1}
        assert res["diff_other_dim"][2] == {} and res["tensor_unfold_other_dim"][2] == {}


# every size pattern for a few ops (one rank with fewer rows than the reach, empty ranks, all rows on one rank)
PATTERNS = {2: [[0, 13], [1, 12], [12, 1]], 3: [[1, 0, 12], [0, 13, 0], [6, 1, 6]],
            4: [[1, 1, 1, 10], [0, 2, 0, 11], [5, 0, 8, 0]]}
SWEEP = ["conv1d_k5_s2", "conv1d_same_even_dil", "max_pool1d_dil_ceil", "avg_pool1d_ceil", "pad_reflect_1d",
         "linear_x2_5", "tensor_unfold", "diff_n3_ends"]


def _compare(name: str, sizes: list[int], mesh, rank: int) -> list[str]:
    leaves: dict = {"serial": [], "shard": []}

    def s_serial(t, dim=0, grad=True):
        leaves["serial"].append(t.detach().clone().requires_grad_(True))
        return leaves["serial"][-1]

    def s_shard(t, dim=0, grad=True):
        off = sum(sizes[:rank])
        local = t.detach().narrow(dim, off, sizes[rank]).clone().requires_grad_(True)
        leaves["shard"].append((local, dim, off))
        return ms.ShardTensor.from_local(local, mesh, sizes=sizes, dim=dim)

    def plain(t, grad=True):
        return t.detach().clone().requires_grad_(True)

    ref = CASES[name](s_serial, plain)
    (ref * ref).sum().backward()
    out = CASES[name](s_shard, plain)
    (out * out).sum().backward()
    bad = []
    if not torch.allclose(out.full_tensor().to_plain(), ref, rtol=1e-9, atol=1e-11):
        bad.append(f"{name} {sizes}: forward")
    (local, dim, off), serial = leaves["shard"][0], leaves["serial"][0]
    if not torch.allclose(local.grad, serial.grad.narrow(dim, off, sizes[rank]), rtol=1e-9, atol=1e-11):
        bad.append(f"{name} {sizes}: input gradient")
    return bad


def _sweep(world: int) -> list[str]:
    mesh = ms.init_mesh()
    return [b for sizes in PATTERNS[world] for name in SWEEP for b in _compare(name, sizes, mesh, dist.get_rank())]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_grid_ops_on_every_size_pattern(world_size):
    out = run_distributed(_sweep, world_size, world_size, timeout=300)
    assert out == [[]] * world_size, out[0][:5]


# -- a 3-level 2-D U-Net on (1, C, 96, 80) sharded along H -----------------------------------------------------
class UNet(torch.nn.Module):
    """conv 3x3 blocks, 2x max-pool, bilinear 2x upsampling and skip concatenation over the channels."""

    def __init__(self, c_in: int = 2, width: int = 4, levels: int = 3):
        super().__init__()

        def block(a, b):
            return torch.nn.Sequential(torch.nn.Conv2d(a, b, 3, padding=1), torch.nn.ReLU(),
                                       torch.nn.Conv2d(b, b, 3, padding=1), torch.nn.ReLU())

        chans = [width * 2**i for i in range(levels + 1)]
        self.down = torch.nn.ModuleList([block(c_in, chans[0])] + [block(chans[i], chans[i + 1])
                                                                    for i in range(levels)])
        self.up = torch.nn.ModuleList([block(chans[i + 1] + chans[i], chans[i]) for i in reversed(range(levels))])
        self.pool = torch.nn.MaxPool2d(2)
        self.upsample = torch.nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.head = torch.nn.Conv2d(chans[0], 1, 1)

    def forward(self, x):
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else self.pool(x))
            skips.append(x)
        for block, skip in zip(self.up, reversed(skips[:-1])):
            x = block(torch.cat([self.upsample(x), skip], 1))
        return self.head(x)


# offsets multiples of 2^3: the pooled and upsampled grids keep the skip connections' sizes. P=4: rank 0 holds 8
# rows (one at the deepest level, fewer than the 3x3 kernel's extent), rank 2 none.
UNET_SIZES = {1: [96], 2: [40, 56], 3: [8, 0, 88], 4: [8, 48, 0, 40]}


def _unet(world: int, sizes=None):
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    sizes = sizes or UNET_SIZES[world]
    torch.manual_seed(0)
    model = UNet().double()
    x = _x(1, 2, 96, 80, seed=5)
    xr = x.clone().requires_grad_(True)
    ref = model(xr)
    (ref * ref).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    off = sum(sizes[:rank])
    local = x.narrow(2, off, sizes[rank]).clone().requires_grad_(True)
    xs = ms.ShardTensor.from_local(local, mesh, sizes=sizes, dim=2)
    try:
        with ms.CommCounter() as cc:
            out = model(xs)
    except ms.ShardingError as exc:
        return "ShardingError", str(exc).split("]", 1)[1][:60]
    (out * out).sum().backward()
    ms.nn.sync_gradients(model, mesh)
    fwd = torch.allclose(out.full_tensor().to_plain(), ref, rtol=1e-9, atol=1e-10)
    gin = torch.allclose(local.grad, xr.grad.narrow(2, off, sizes[rank]), rtol=1e-9, atol=1e-10)
    gpar = all(torch.allclose(p.grad, ref_grads[n], rtol=1e-8, atol=1e-10) for n, p in model.named_parameters())
    return fwd, gin, gpar, out.sharding_sizes, dict(cc.counts)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_unet_sharded_along_h_equals_single_process(world_size):
    out = run_distributed(_unet, world_size, world_size, timeout=600)
    for fwd, gin, gpar, sizes, counts in out:
        assert (fwd, gin, gpar) == (True, True, True)
        assert sizes == tuple(UNET_SIZES[world_size])
        # 14 convs with a 3x3 kernel, 3 pools, 3 upsamplings: at most one halo exchange each
        assert set(counts) <= {"all_to_all"} and counts.get("all_to_all", 0) <= 20


def test_unet_with_odd_offsets_raises_the_same_error_on_every_rank():
    out = run_distributed(_unet, 2, 2, [37, 59], timeout=600)
    assert out[0][0] == "ShardingError" and out == [out[0]] * 2, out


# -- a window attention over a Morton-ordered cloud -------------------------------------------------------------
def _window_attention(world: int, sizes=None):
    """Windows of 64 points in global (Morton) order: ``F.pad`` to a multiple of 64 along the points, then
    ``unfold(0, 64, 64)`` gathers each window's rows from the ranks holding them (the row halo) onto the rank
    owning the window's centre; attention within a window is local; ``reshape`` back to points keeps the
    windows' sharding (``64 * windows`` rows per rank)."""
    from meshshard.partition import partition

    mesh = ms.init_mesh()
    rank = dist.get_rank()
    n, c, w = 400, 8, 64
    pts = torch.rand(n, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    feats = _x(n, c, seed=2)
    part = partition(pts, world, method="morton")
    ordered = feats[part.perm]
    sizes = list(sizes or part.sizes.tolist())
    torch.manual_seed(0)
    qkv = torch.nn.Linear(c, 3 * c).double()

    def attend(x):
        x = F.pad(x, (0, 0, 0, -x.shape[0] % w))
        win = x.unfold(0, w, w).transpose(1, 2)  # (num_windows, 64, C)
        q, k, v = qkv(win).chunk(3, dim=-1)
        y = F.scaled_dot_product_attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)).squeeze(1)
        return y.reshape(-1, c)

    xr = ordered.clone().requires_grad_(True)
    ref = attend(xr)
    ref.pow(2).sum().backward()
    off = sum(sizes[:rank])
    local = ordered[off : off + sizes[rank]].clone().requires_grad_(True)
    out = attend(ms.ShardTensor.from_local(local, mesh, sizes=sizes))
    out.pow(2).sum().backward()
    fwd = torch.allclose(out.full_tensor().to_plain(), ref, rtol=1e-9, atol=1e-11)
    gin = torch.allclose(local.grad, xr.grad[off : off + sizes[rank]], rtol=1e-9, atol=1e-11)
    return fwd, gin


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_window_attention_over_a_morton_ordered_cloud(world_size):
    assert run_distributed(_window_attention, world_size, world_size, timeout=300) == [(True, True)] * world_size
    if world_size == 4:  # an empty rank and a one-point rank
        out = run_distributed(_window_attention, 4, 4, [1, 0, 250, 149], timeout=300)
        assert out == [(True, True)] * 4


# -- clear refusals, on every rank ----------------------------------------------------------------------------
def _bad(kind):
    mesh = ms.init_mesh()
    x = ms.ShardTensor.from_local(torch.randn(1, 2, 4, 5), mesh, sizes=[4, 4], dim=2)
    try:
        if kind == "bicubic":
            F.interpolate(x, scale_factor=2, mode="bicubic")
        elif kind == "antialias":
            F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True)
        elif kind == "unfold_w":
            F.unfold(ms.ShardTensor.from_local(torch.randn(1, 2, 5, 4), mesh, sizes=[4, 4], dim=3), 3)
        elif kind == "diff_sharded_prepend":
            y = ms.ShardTensor.from_local(torch.randn(4, 3), mesh, sizes=[4, 4])
            torch.diff(y, dim=0, prepend=y)
        elif kind == "channels":
            F.conv2d(ms.ShardTensor.from_local(torch.randn(1, 2, 4, 5), mesh, sizes=[2, 2], dim=1),
                     torch.randn(3, 4, 3, 3))
    except (ms.UnsupportedOpError, ms.ShardingError) as exc:
        return type(exc).__name__
    return None


@pytest.mark.parametrize("kind", ["bicubic", "antialias", "unfold_w", "diff_sharded_prepend", "channels"])
def test_unsupported_forms_raise_on_every_rank(kind):
    out = run_distributed(_bad, 2, kind)
    assert out[0] is not None and out == [out[0]] * 2


def _bad_args():
    mesh = ms.init_mesh()
    x = ms.ShardTensor.from_local(torch.randn(1, 2, 3, 5), mesh, sizes=[3, 3], dim=2)
    msgs = []
    for f in (lambda: F.conv2d(x, torch.randn(3, 2, 9, 3)), lambda: F.pad(x, (0, 0, 6, 0), mode="reflect"),
              lambda: F.max_pool2d(x, 2, padding=2)):
        try:
            f()
            msgs.append(None)
        except RuntimeError as exc:
            msgs.append(type(exc).__name__)
    return msgs


def test_bad_arguments_raise_torchs_error_on_every_rank_from_the_global_shape():
    out = run_distributed(_bad_args, 2)
    assert out[0] == ["RuntimeError"] * 3 and out[1] == out[0]


# -- PhysicsNeMo's Transolver in structured-grid mode (conv2d 3x3 over the (H, W) grid), unchanged ---------------
# The --no-deps folder of shared/THIRD_PARTY_MODELS.md; MESHSHARD_PHYSICSNEMO_SITE names it.
PHYSICSNEMO_SITE = os.environ.get("MESHSHARD_PHYSICSNEMO_SITE", "")


class _Stub(type):
    def __getattr__(cls, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Stub(attr, (), {})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """torchvision and s3fs are imported at module level by PhysicsNeMo/timm files the Transolver does not use."""

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("torchvision", "s3fs"):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = lambda attr: _Stub.__getattr__(_Stub, attr)
        return module

    def exec_module(self, module):
        pass


def _structured_transolver(world: int, rows: list[int]):
    os.environ["PHYSICSNEMO_FORCE_TE"] = "False"
    if PHYSICSNEMO_SITE not in sys.path:
        sys.path.insert(0, PHYSICSNEMO_SITE)
    sys.meta_path.insert(0, _StubFinder())
    from physicsnemo.models.transolver import Transolver

    h, w = 12, 10
    torch.manual_seed(0)
    model = Transolver(functional_dim=3, out_dim=2, embedding_dim=2, n_layers=2, n_hidden=16, n_head=2, slice_num=4,
                       mlp_ratio=2, structured_shape=(h, w), use_te=False).double()
    fx, emb = _x(1, h * w, 3, seed=3), _x(1, h * w, 2, seed=6)
    fr = fx.clone().requires_grad_(True)
    ref = model(fr, emb)
    ref.pow(2).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    sizes = [r * w for r in rows]  # the tokens (h w) sharded along h
    off = sum(sizes[:rank])
    local = fx[:, off : off + sizes[rank]].clone().requires_grad_(True)
    x = ms.ShardTensor.from_local(local, mesh, sizes=sizes, dim=1)
    e = ms.ShardTensor.from_local(emb[:, off : off + sizes[rank]].clone(), mesh, sizes=sizes, dim=1)
    out = model(x, e)
    out.pow(2).sum().backward()
    ms.nn.sync_gradients(model, mesh)
    fwd = torch.allclose(out.full_tensor().to_plain(), ref, rtol=1e-9, atol=1e-11)
    gin = torch.allclose(local.grad, fr.grad[:, off : off + sizes[rank]], rtol=1e-9, atol=1e-11)
    gpar = all(torch.allclose(p.grad, ref_grads[n], rtol=1e-8, atol=1e-11) for n, p in model.named_parameters())
    return fwd, gin, gpar


@pytest.mark.skipif(not PHYSICSNEMO_SITE or not os.path.isdir(os.path.join(PHYSICSNEMO_SITE, "physicsnemo")),
                    reason="PhysicsNeMo 2.2.2 not installed: set MESHSHARD_PHYSICSNEMO_SITE to the --no-deps folder "
                           "of shared/THIRD_PARTY_MODELS.md")
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_physicsnemo_transolver_structured_grid_sharded_along_h(world_size):
    rows = {1: [12], 2: [5, 7], 3: [4, 0, 8]}[world_size]
    out = run_distributed(_structured_transolver, world_size, world_size, rows, timeout=300)
    assert out == [(True, True, True)] * world_size
