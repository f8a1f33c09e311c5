"""Serial-equivalence harness for sharding rules: one case function, run sharded and single-process.

A case is ``f(S, P)``: it builds its global tensors from a seeded generator (identical on every
rank), passes the ones to shard through ``S(t, dim, grad=True)`` and replicated parameters through ``P(t, grad=True)``,
and returns the op's result. :func:`run_cases` runs every case twice on every rank: serially
(``S`` returns a leaf copy of the global tensor) and sharded (``S`` returns a ShardTensor of this
rank's rows, split unevenly with empty ranks by :func:`split`), compares the forward result
(gathered), the gradients of every sharded input (its rows) and of every parameter (summed over
ranks), and counts the collectives of the forward and of the backward.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import meshshard as ms


def split(n: int, world: int) -> list[int]:
    """Uneven sizes along a dim of length ``n``; world sizes 3 and 4 include an empty rank."""
    if world == 1:
        return [n]
    if world == 2:
        return [n // 3, n - n // 3]
    if world == 3:
        return [n // 2, 0, n - n // 2]
    return [1, n // 2, 0, n - 1 - n // 2]


def _cmp(got, ref, rtol, atol) -> bool:
    if isinstance(ref, (tuple, list)):
        return len(got) == len(ref) and all(_cmp(g, r, rtol, atol) for g, r in zip(got, ref))
    if isinstance(got, ms.ShardTensor):
        got = got.full_tensor().to_plain()
    elif isinstance(got, ms.ReplicatedTensor):
        got = got.to_plain()
    if not isinstance(ref, torch.Tensor):
        return got == ref
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return False
    return torch.allclose(got, ref, rtol=rtol, atol=atol, equal_nan=True)


def _loss_of(out):
    if isinstance(out, (tuple, list)):
        total = None
        for o in out:
            if isinstance(o, torch.Tensor) and (o.dtype.is_floating_point):
                term = _loss_of(o)
                total = term if total is None else total + term
        return total
    if not out.dtype.is_floating_point:
        return None
    return (out * (out + 0.5)).sum()  # one reduction: one all-reduce for a ShardTensor (counted in backward)


def run_case(f, rtol: float = 1e-9, atol: float = 1e-11):
    """(forward ok, backward ok, forward counts, backward counts, result type) on this rank."""
    mesh = ms.init_mesh()
    world, rank = dist.get_world_size(), dist.get_rank()
    serial_leaves, shard_leaves = [], []

    def s_serial(t, dim=0, grad=True):
        leaf = t.detach().clone().requires_grad_(grad and t.dtype.is_floating_point)
        serial_leaves.append(leaf)
        return leaf

    def p_serial(t, grad=True):
        return s_serial(t, 0, grad)

    torch.manual_seed(0)
    ref = f(s_serial, p_serial)
    ref_loss = _loss_of(ref)
    if ref_loss is not None and ref_loss.requires_grad:
        ref_loss.backward()

    def s_shard(t, dim=0, grad=True):
        sizes = split(t.shape[dim], world)
        off = sum(sizes[:rank])
        local = t.detach().narrow(dim, off, sizes[rank]).clone().requires_grad_(grad and t.dtype.is_floating_point)
        shard_leaves.append(("shard", local, dim, off, sizes[rank]))
        return ms.ShardTensor.from_local(local, mesh, sizes=sizes, dim=dim)

    def p_shard(t, grad=True):
        leaf = t.detach().clone().requires_grad_(grad and t.dtype.is_floating_point)
        shard_leaves.append(("plain", leaf, None, None, None))
        return leaf

    torch.manual_seed(0)
    with ms.CommCounter() as fwd:
        out = f(s_shard, p_shard)
    fwd_ok = _cmp(out, ref, rtol, atol)
    loss = _loss_of(out)
    with ms.CommCounter() as bwd:
        if loss is not None and loss.requires_grad:
            loss.backward()
    bwd_ok = True
    for ref_leaf, (kind, leaf, dim, off, n) in zip(serial_leaves, shard_leaves):
        rg, g = ref_leaf.grad, leaf.grad
        if kind == "plain":
            if g is not None:
                g = g.clone()
                dist.all_reduce(g)
        elif rg is not None:
            rg = rg.narrow(dim, off, n)
        if rg is None or g is None:
            ok = (rg is None or not rg.any()) and (g is None or not g.any())
        else:
            ok = torch.allclose(g, rg, rtol=rtol * 10, atol=atol * 10, equal_nan=True)
        bwd_ok = bwd_ok and ok
    return fwd_ok, bwd_ok, dict(fwd.counts), dict(bwd.counts), type(out).__name__


def run_cases(cases: dict, names: list[str], rtol: float = 1e-9, atol: float = 1e-11) -> dict:
    return {name: run_case(cases[name], rtol, atol) for name in names}


def check(results_per_rank: list[dict]) -> dict:
    """Assert every case is exact on every rank and the ranks agree on types and counts; rank 0's results."""
    first = results_per_rank[0]
    for rank, res in enumerate(results_per_rank):
        bad = {k: v[:2] for k, v in res.items() if not (v[0] and v[1])}
        assert not bad, f"rank {rank}: (forward ok, backward ok) {bad}"
        for k, v in res.items():
            assert v[2:] == first[k][2:] or rank == 0, f"ranks disagree on {k}: {v[2:]} vs {first[k][2:]}"
    return first


def raises_everywhere(fn, *args):
    """The exception type name raised by ``fn(*args)`` on this rank, or ``None``."""
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - the test compares the type on every rank
        return type(exc).__name__
    return None
