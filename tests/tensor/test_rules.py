"""Sharding rules of ShardTensor vs the same torch ops on the gathered tensor (forward and backward)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import meshshard as ms
from meshshard.testing import DistributedError, run_distributed

SIZES = {1: [9], 2: [7, 0], 3: [5, 0, 8], 4: [7, 0, 13, 2]}

# name -> f(x) applied identically to the ShardTensor and to the gathered tensor; each returns a
# tensor whose sum of cubes is the loss, so backward exercises every rule.
CASES = {
    "sum_all": lambda x: x.sum(),
    "sum_dim0": lambda x: x.sum(0),
    "sum_dim1": lambda x: x.sum(dim=1),
    "sum_keepdim": lambda x: torch.sum(x, dim=(0, 1), keepdim=True),
    "mean_all": lambda x: x.mean(),
    "mean_dim0": lambda x: torch.mean(x, 0, keepdim=True),
    "var_dim0": lambda x: x.var(0),
    "std_all": lambda x: x.std(),
    "var_unbiased_false": lambda x: torch.var(x, 0, unbiased=False),
    "std_correction0": lambda x: x.std(dim=0, correction=0),
    "norm": lambda x: x.norm(),
    "norm_dim0_p1": lambda x: torch.norm(x, p=1, dim=0),
    "vector_norm_inf": lambda x: torch.linalg.vector_norm(x, ord=float("inf"), dim=0),
    "amax": lambda x: x.amax(0),
    "amin_all": lambda x: torch.amin(x),
    "max_all": lambda x: x.max(),
    "max_dim0_values": lambda x: x.max(0).values,
    "min_dim0_values": lambda x: torch.min(x, dim=0, keepdim=True)[0],
    "softmax0": lambda x: x.softmax(0),
    "log_softmax0": lambda x: F.log_softmax(x, dim=0),
    "softmax1": lambda x: torch.softmax(x, dim=-1),
    "logsumexp0": lambda x: x.logsumexp(0),
    "gram": lambda x: x.transpose(0, 1) @ x,
    "einsum_contract": lambda x: torch.einsum("nc,nd->cd", x, x.exp()),
    "einsum_local": lambda x: torch.einsum("nc,cd->nd", x, torch.ones(4, 2, dtype=x.dtype)),
    "pointwise_chain": lambda x: (x * 2 - 1).tanh().clamp(-0.5, 0.7) + x.sigmoid() / (1 + x.abs()),
    "broadcast_plain": lambda x: x * torch.arange(4, dtype=x.dtype) + torch.ones(1, 4, dtype=x.dtype),
    "center": lambda x: x - x.mean(0, keepdim=True),
    "normalize_global": lambda x: (x - x.mean(0)) / x.std(0),
    "layer_norm": lambda x: F.layer_norm(x, (4,)),
    "gelu_linear": lambda x: F.gelu(F.linear(x, torch.eye(4, dtype=x.dtype)[:3] * 2, torch.ones(3, dtype=x.dtype))),
    "view_heads": lambda x: x.view(x.shape[0], 2, 2).transpose(1, 2).reshape(-1, 4),
    "cat_channels": lambda x: torch.cat([x, x**2], dim=1),
    "stack_channels": lambda x: torch.stack([x, -x], dim=-1).sum(-1),
    "unsqueeze_getitem": lambda x: x.unsqueeze(0)[0, :, 1:3],
    "permute_swap": lambda x: torch.permute(x.unsqueeze(-1), (1, 0, 2)).squeeze(-1).permute(1, 0).swapaxes(0, 1).T,
    "unsqueeze_neg": lambda x: torch.unsqueeze(x, -3).transpose(-1, -2).sum(0),
    "cumsum_channels": lambda x: x.cumsum(1),
    "where": lambda x: torch.where(x > 0, x, x * 0.1),
    "group_norm": lambda x: F.group_norm(x, 2),
}


def _check_cases(sizes, names):
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    off = sum(sizes[:rank])
    rows = slice(off, off + sizes[rank])
    out = {}
    for name in names:
        f = CASES[name]
        g = torch.randn(sum(sizes), 4, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
        ref_in = g.clone().requires_grad_()
        ref = f(ref_in)
        (ref**3).sum().backward()
        local = g[rows].clone().requires_grad_()
        x = ms.ShardTensor.from_local(local, mesh, sizes=sizes)
        y = f(x)
        got = y.full_tensor() if isinstance(y, ms.ShardTensor) else y
        (y**3).sum().backward()
        out[name] = (
            torch.allclose(got, ref, rtol=1e-10, atol=1e-12),
            torch.allclose(local.grad, ref_in.grad[rows], rtol=1e-9, atol=1e-12),
            type(y).__name__,
        )
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_rules_match_single_process(world_size):
    results = run_distributed(_check_cases, world_size, SIZES[world_size], list(CASES))
    for rank, res in enumerate(results):
        bad = {k: v for k, v in res.items() if not (v[0] and v[1])}
        assert not bad, f"rank {rank}: (forward ok, backward ok, type) {bad}"
        assert res["sum_all"][2] == "ReplicatedTensor"
        assert res["pointwise_chain"][2] == "ShardTensor"
        assert res["softmax0"][2] == "ShardTensor"


def _indices(sizes):
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    g = torch.tensor([[1.0, 5.0], [3.0, 5.0], [3.0, -2.0], [0.0, 7.0], [3.0, 7.0], [-1.0, 0.0]])
    off = sum(sizes[:rank])
    x = ms.ShardTensor.from_local(g[off : off + sizes[rank]], mesh, sizes=sizes)
    return x.max(0).indices.tolist(), x.argmin(0).tolist(), int(x.argmax()), int(x.argmin())


@pytest.mark.parametrize("sizes", [[6], [2, 0, 4], [1, 2, 0, 3]])
def test_arg_reductions_return_global_indices_first_among_ties(sizes):
    for out in run_distributed(_indices, len(sizes), sizes):
        assert out == ([1, 3], [5, 2], 7, 5)


def _counts(sizes):
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    x = ms.ShardTensor.from_local(torch.randn(sizes[rank], 4), mesh, sizes=sizes)
    lin = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    with ms.CommCounter() as pointwise:
        y = lin(x * 2 + 1)
    with ms.CommCounter() as mean:
        m = y.mean()
    with ms.CommCounter() as backward:
        m.backward()
    return pointwise.total, mean.counts["all_reduce"], mean.total, backward.counts["all_reduce"]


def test_collective_counts():
    for pointwise, mean_ar, mean_total, bwd in run_distributed(_counts, 3, SIZES[3]):
        assert pointwise == 0
        assert mean_ar == 1 and mean_total == 1
        assert bwd == 1


def _error(kind):
    mesh = ms.init_mesh()
    rank = dist.get_rank()
    x = ms.ShardTensor.from_local(torch.ones(2 + rank, 3), mesh, sizes=[2, 3])
    y = ms.ShardTensor.from_local(torch.ones(2, 3), mesh, sizes=[2, 2]) if rank == 0 else None
    if kind == "mismatch":
        # same local length on rank 0, different sharding: must raise, never compute
        if rank == 0:
            return x + y
        return None
    if kind == "unsupported":
        return torch.as_strided(x, (2,), (1,))
    if kind == "plain_along_shard":
        return x + torch.ones(x.shape[0], 1)
    if kind == "cat_shard_dim":  # along the points every operand must be a ShardTensor (a plain one is ambiguous)
        return torch.cat([x, torch.ones(2, 2)], dim=0)
    if kind == "item":
        return x.sum(1).item()
    if kind == "linear_on_shard_dim":
        return F.linear(x.transpose(0, 1), torch.ones(2, 2))
    if kind == "merge_reshape":  # merging the sharded dim with the dim before it crosses ranks
        return x.t().reshape(-1)


@pytest.mark.parametrize(
    "kind, match",
    [
        ("mismatch", r"ShardingError: \[rank 0\] torch.Tensor.add: operands are sharded differently"),
        ("unsupported", r"no sharding rule for torch.as_strided.*to_local\(\)"),
        ("plain_along_shard", r"a plain tensor of shape \(5, 1\) spans the sharded dimension \(global length 5\)"),
        ("cat_shard_dim", "concatenating along the sharded dim needs every operand to be a ShardTensor"),
        ("item", "is ambiguous"),
        ("linear_on_shard_dim", "contracts the last dimension, which is the sharded one"),
        ("merge_reshape", r"would merge the sharded dim with the dims before it"),
    ],
)
def test_unsupported_and_mismatched_ops_raise(kind, match):
    with pytest.raises(DistributedError, match=match):
        run_distributed(_error, 2, kind, timeout=10)
