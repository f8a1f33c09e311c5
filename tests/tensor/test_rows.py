"""The row halo along the sharded dim: fetched rows equal the global tensor's, gradients go back to their owners."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

import meshshard as ms
from meshshard._sizes import offsets_of
from meshshard.tensor import ShardSpec
from meshshard.tensor._rows import fetch_intervals, row_halo, sizes_by_anchor, window_rows
from meshshard.testing import run_distributed

# uneven sizes with empty and one-row ranks, shorter than the halo widths
PATTERNS = {
    1: [[9], [0], [1]],
    2: [[3, 6], [0, 9], [1, 8], [9, 0]],
    3: [[4, 0, 5], [1, 1, 7], [0, 9, 0], [2, 6, 1]],
    4: [[1, 4, 0, 4], [0, 0, 1, 8], [3, 3, 3, 0], [1, 1, 1, 6]],
}
WIDTHS = [(0, 0), (1, 1), (2, 0), (0, 3), (4, 2), (9, 9)]


def _global(n: int) -> torch.Tensor:
    return torch.arange(n * 6, dtype=torch.float64).reshape(2, n, 3)  # sharded along dim 1


def _halo_cases(world: int) -> list[str]:
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    bad = []
    for sizes, (before, after) in itertools.product(PATTERNS[world], WIDTHS):
        n = sum(sizes)
        full = _global(n)
        off = sum(sizes[:rank])
        local = full[:, off : off + sizes[rank]].clone().requires_grad_(True)
        x = ms.ShardTensor.from_local(local, mesh, sizes=sizes, dim=1)
        with ms.CommCounter() as cc:
            rows, nb, na = row_halo(local, x.spec, before, after)
        lo, hi = max(off - before, 0), min(off + sizes[rank] + after, n)
        if (nb, na) != (off - lo, hi - off - sizes[rank]) or not torch.equal(rows, full[:, lo:hi]):
            bad.append(f"halo {sizes} {before, after}: got rows {tuple(rows.shape)} nb={nb} na={na}")
        remote = any(max(o - before, 0) < o or min(o + s + after, n) > o + s
                     for o, s in zip(offsets_of(sizes), sizes))
        if cc.counts.get("all_to_all", 0) != int(remote and world > 1):
            bad.append(f"halo {sizes} {before, after}: {dict(cc.counts)}")
        # backward: every rank's loss weights each of its window's rows by (global row + 1)
        weight = torch.arange(lo, hi, dtype=torch.float64)[None, :, None] + 1
        (rows * weight).sum().backward()
        expect = torch.zeros(n, dtype=torch.float64)
        for r in range(world):
            o = sum(sizes[:r])
            a, b = max(o - before, 0), min(o + sizes[r] + after, n)
            expect[a:b] += torch.arange(a, b, dtype=torch.float64) + 1
        want = expect[off : off + sizes[rank]][None, :, None].expand_as(local)
        if not torch.equal(local.grad, want):
            bad.append(f"halo grad {sizes} {before, after}")
    return bad


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_row_halo_equals_the_global_rows_forward_and_backward(world_size):
    out = run_distributed(_halo_cases, world_size, world_size, timeout=300)
    assert out == [[]] * world_size, out[0][:5]


def _intervals_and_windows(world: int) -> list[str]:
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    bad = []
    for sizes in PATTERNS[world]:
        n = sum(sizes)
        full = torch.arange(n, dtype=torch.float64)[:, None] * torch.ones(1, 2, dtype=torch.float64)
        off = sum(sizes[:rank])
        local = full[off : off + sizes[rank]].clone().requires_grad_(True)
        spec = ms.ShardTensor.from_local(local, mesh, sizes=sizes).spec
        # wrap-around and repeated intervals, listed out of order (circular padding asks for such)
        wanted = [[(max(n - 1 - r, 0), n), (0, min(r + 2, n)), (min(r, n), min(r + 1, n))] for r in range(world)]
        got = fetch_intervals(local, spec, wanted)
        ref = torch.cat([full[a:b] for a, b in wanted[rank]])
        if not torch.equal(got, ref):
            bad.append(f"intervals {sizes}: {got[:, 0].tolist()} vs {ref[:, 0].tolist()}")
        got.sum().backward()
        counts = torch.zeros(n, dtype=torch.float64)
        for w in wanted:
            for a, b in w:
                counts[a:b] += 1
        if not torch.equal(local.grad[:, 0], counts[off : off + sizes[rank]]):
            bad.append(f"intervals grad {sizes}")
        # windows reaching past both ends are filled
        lo = [sum(sizes[:r]) - 2 for r in range(world)]
        hi = [sum(sizes[: r + 1]) + 3 for r in range(world)]
        win = window_rows(local.detach(), spec, lo, hi, -1.0)
        idx = torch.arange(lo[rank], hi[rank])
        ref = torch.full((idx.numel(), 2), -1.0, dtype=torch.float64)
        inside = (idx >= 0) & (idx < n)
        ref[inside] = full[idx[inside]]
        if not torch.equal(win, ref):
            bad.append(f"window {sizes}")
    return bad


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_fetch_intervals_and_windows_across_several_ranks(world_size):
    out = run_distributed(_intervals_and_windows, world_size, world_size, timeout=300)
    assert out == [[]] * world_size, out[0][:5]


def test_sizes_by_anchor_gives_each_result_row_to_the_owner_of_its_anchor():
    spec = ShardSpec(None, 0, 0, (3, 0, 1, 4), torch.Size([8]))
    assert sizes_by_anchor(spec, 8, lambda j: j) == (3, 0, 1, 4)
    assert sizes_by_anchor(spec, 4, lambda j: 2 * j) == (2, 0, 0, 2)  # rows 0 2 | - | - | 4 6
    assert sizes_by_anchor(spec, 16, lambda j: j // 2) == (6, 0, 2, 8)
    assert sizes_by_anchor(spec, 10, lambda j: j - 1) == (4, 0, 1, 5)  # clamped: the ends take the extra rows
    assert sizes_by_anchor(spec, 0, lambda j: j) == (0, 0, 0, 0)
    with pytest.raises(ValueError, match="non-decreasing"):
        sizes_by_anchor(spec, 4, lambda j: 3 - j)
