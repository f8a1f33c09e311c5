"""``torch.compile`` of sharded code: whole graphs (``fullgraph=True``) equal to eager, forward and backward.

Each case runs eagerly and compiled (aot_eager: the graphs AOTAutograd hands to inductor) on the same
shards and compares outputs and gradients (float64, 1e-10); counts the compiled graphs (a second step
with the same sizes compiles nothing) and the collectives in the compiled forward + backward graphs
(equal to what :class:`meshshard.CommCounter` counts eagerly). Recompilation with new sharding sizes is
checked separately: every rank recompiles on the same call and the results stay exact.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._functorch.partitioners import min_cut_rematerialization_partition

import meshshard as ms
from meshshard.testing import DistributedError, run_distributed

SIZES = {1: [7], 2: [6, 0], 3: [5, 0, 1]}
TOL = dict(rtol=1e-10, atol=1e-10)


class _Recorder:
    """An aot_eager backend that records every compiled graph and the collectives in it."""

    def __init__(self) -> None:
        self.graphs: list[tuple[str, int]] = []  # (fw|bw, number of functional collectives)

    def _compiler(self, kind: str):
        def compile_graph(gm, example_inputs):
            n = sum(1 for node in gm.graph.nodes if node.op == "call_function" and _is_collective(node.target))
            self.graphs.append((kind, n))
            return make_boxed_func(gm)

        return compile_graph

    def backend(self):
        # the partitioner of aot_eager and inductor (see the closing note: default_partition desynchronised
        # the ranks' collectives for PointNetSurrogate at P=2)
        return aot_autograd(fw_compiler=self._compiler("fw"), bw_compiler=self._compiler("bw"),
                            partition_fn=min_cut_rematerialization_partition)

    @property
    def collectives(self) -> int:
        return sum(n for _, n in self.graphs)


def _is_collective(target) -> bool:
    name = str(target)
    return "_c10d_functional" in name and "wait_tensor" not in name


def _shard(g: torch.Tensor, sizes, mesh, requires_grad=True, dim=0) -> ms.ShardTensor:
    r = dist.get_rank()
    off = sum(sizes[:r])
    local = g.narrow(dim, off, sizes[r]).clone().requires_grad_(requires_grad)
    return ms.ShardTensor.from_local(local, mesh, sizes=sizes, dim=dim), local


# -- the cases: (build(seed) -> module or None, fn(module, x) -> loss) ------------------------------
def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3))


def _transolver(variant):
    def build():
        # one block: the branches of a deeper model (a block's ShardTensor output feeds the head's LayerNorm/Linear)
        return ms.nn.Transolver(4, 2, n_hidden=8, n_layers=1, n_head=2, slice_num=4, variant=variant).eval()

    return build


def _pointnet():
    return ms.nn.PointNetSurrogate(in_dim=4, out_dim=3, width=8, global_dim=16)


def _ring(m, x):
    """Ring attention (queries and keys both sharded) on (heads, L, E), with a boolean mask (a mask plan)."""
    xh = x.view(-1, 2, 2).transpose(0, 1)  # (2, N, 2), sharded along dim 1
    i = torch.arange(x.shape[0])
    mask = (i[:, None] >= i[None, :]) & (i[None, :] % 3 != 1)  # causal, and every third key hidden
    return F.scaled_dot_product_attention(xh, xh.sin(), xh * 0.5, attn_mask=mask).square().sum()


def _scalar_left(m, x):
    """Python operators with a scalar on the left, and ``**``: traced, their Tensor dunders are Python functions."""
    y, c = x * x + 1, x.detach().abs() + 1  # %, // have no derivative in their second operand
    return (x ** 2 - (1 - x) * (2 / y) + 2 ** x + (3 % c + 2 // c + c // 0.5) * x + y.sum() ** -1).sum()


CASES = {
    "square_sum": (None, lambda m, x: (x * x).sum()),
    "pointwise": (None, lambda m, x: (torch.sin(x) * x.exp() + x.abs().sqrt() - x.pow(2) / 3).mean()),
    "reductions": (None, lambda m, x: x.mean(dim=0).sum() + x.amax(dim=0).sum() + x.amin(0).sum()
                   + x.sum(dim=0, keepdim=True).sum() + x.var(dim=0).sum()),
    "mlp": (_mlp, lambda m, x: m(x).square().mean()),
    "views": (None, lambda m, x: (x.unsqueeze(0).transpose(1, 2).reshape(1, 4, -1).sum(1)
                                  * x.view(-1, 2, 2).sum(-1).flatten(1).sum(1)).sum()),
    "softmax": (None, lambda m, x: (x.softmax(dim=0) * x.log_softmax(dim=-1)).sum()),
    "transolver": (_transolver("plain"), lambda m, x: m(x).square().mean()),
    "transolver_plus": (_transolver("plus"), lambda m, x: m(x).square().mean()),
    "pointnet": (_pointnet, lambda m, x: m(x).square().mean()),
    "ring_attention": (None, _ring),
    "scalar_left": (None, _scalar_left),
}

POINTS_LAST = {"pointnet"}
# World sizes per case (default 1, 2, 3). The 1-rank path (no collective, a 1-rank spec) is proven by the
# function cases; a module case adds its layers' rules, which P = 2 and 3 exercise with an empty and a
# one-point rank. The MLP's Linear/GELU/LayerNorm are also inside the Transolver: one world size.
WORLD_SIZES = {"mlp": [3], "transolver": [2, 3], "transolver_plus": [2, 3], "pointnet": [2, 3]}
PARAMS = [(name, w) for name in sorted(CASES) for w in WORLD_SIZES.get(name, [1, 2, 3])]
# rings per case: a compiled ring backward sends each key/value block together with its gradients, one
# collective per step where eager uses two (P - 1 fewer per ring; _RingAttention's docstring)
RINGS = {"ring_attention": 1}


def _grads(local, module):
    out = [local.grad.clone()]
    if module is not None:
        out += [p.grad.clone() for p in module.parameters() if p.grad is not None]
    return out


def _zero(local, module):
    local.grad = None
    if module is not None:
        module.zero_grad(set_to_none=True)


def _run_case(name: str, sizes):
    torch.set_num_threads(1)
    torch._dynamo.reset()
    mesh = ms.init_mesh()
    build, fn = CASES[name]
    torch.manual_seed(0)
    module = build().double() if build is not None else None
    g = torch.randn(sum(sizes), 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    if name in POINTS_LAST:  # (B, C, N) sharded along the points, dim 2
        x, local = _shard(g.T.unsqueeze(0).contiguous(), sizes, mesh, dim=2)
    else:
        x, local = _shard(g, sizes, mesh)
    with ms.CommCounter() as eager_comm:
        eager = fn(module, x)
        eager.backward()
    eager_grads = _grads(local, module)
    _zero(local, module)
    single = _single_process(fn, module, g, sizes) if module is None else None
    rec = _Recorder()
    compiled = torch.compile(lambda x: fn(module, x), fullgraph=True, backend=rec.backend())
    with ms.CommCounter() as compiled_comm:
        out = compiled(x)
        out.backward()
    first = _grads(local, module)
    graphs_after_first = list(rec.graphs)
    _zero(local, module)
    out2 = compiled(x)  # the same sizes: no new graph
    out2.backward()
    return {
        "out": float((out - eager).abs()) if out.numel() == 1 else float((out - eager).abs().max()),
        "out2": float((out2 - eager).abs()),
        "grads": [float((a - b).abs().max()) if a.numel() else 0.0 for a, b in zip(first, eager_grads)],
        "n_grads": (len(first), len(eager_grads)),
        "graphs_first": graphs_after_first,
        "graphs_total": len(rec.graphs),
        "collectives": sum(n for _, n in graphs_after_first),
        "eager_collectives": eager_comm.total,
        "compiled_recorded": compiled_comm.total,
        "type": type(out).__name__,
        "single": single and _diffs(single, (eager, eager_grads[0])),
    }


def _single_process(fn, module, g, sizes):
    """The plain function on the whole tensor: (output, this rank's rows of the input gradient)."""
    gx = g.clone().requires_grad_(True)
    out = fn(module, gx)
    out.backward()
    r = dist.get_rank()
    return out.detach(), gx.grad[sum(sizes[:r]):sum(sizes[:r + 1])]


def _diffs(a, b):
    return [float((u - v).abs().max()) if u.numel() else 0.0 for u, v in zip(a, b)]


@pytest.mark.parametrize(("name", "world_size"), PARAMS, ids=[f"{n}-{w}" for n, w in PARAMS])
def test_compiled_equals_eager(name, world_size):
    for rank, res in enumerate(run_distributed(_run_case, world_size, name, SIZES[world_size], timeout=60)):
        assert res["out"] <= 1e-10 and res["out2"] <= 1e-10, (rank, res)
        assert res["n_grads"][0] == res["n_grads"][1] and max(res["grads"]) <= 1e-10, (rank, res)
        kinds = [k for k, _ in res["graphs_first"]]
        assert kinds == ["fw", "bw"], (rank, res)  # one forward and one backward graph: no graph break
        assert res["graphs_total"] == 2, (rank, res)  # the second step compiled nothing
        fewer = RINGS.get(name, 0) * (world_size - 1)
        assert res["collectives"] == res["eager_collectives"] - fewer, (rank, res)
        assert res["compiled_recorded"] == 0, (rank, res)  # a compiled step's collectives are graph ops
        assert res["type"] == "ReplicatedTensor", (rank, res)
        assert res["single"] is None or max(res["single"]) <= 1e-10, (rank, res)  # eager == single process


# -- recompilation with new sharding sizes -----------------------------------------------------------
def _recompiles(seq):
    """Compile once, call with each sizes of ``seq``; per call: exact?, and how many graphs exist."""
    torch.set_num_threads(1)
    torch._dynamo.reset()
    mesh = ms.init_mesh()
    rec = _Recorder()
    lin = torch.nn.Linear(2, 3).double()
    compiled = torch.compile(lambda x: (lin(x).mean(dim=0) * x.sum(0).sum()).sum() + x.amax(), fullgraph=True,
                             backend=rec.backend())
    out = []
    for sizes in seq:
        g = torch.randn(sum(sizes), 2, dtype=torch.float64, generator=torch.Generator().manual_seed(sum(sizes)))
        x, local = _shard(g, sizes, mesh)
        y = compiled(x)
        y.backward()
        ref_x = g.clone().requires_grad_(True)
        ref = (lin(ref_x).mean(dim=0) * ref_x.sum(0).sum()).sum() + ref_x.amax()
        (ref_grad,) = torch.autograd.grad(ref, ref_x)
        r = dist.get_rank()
        off = sum(sizes[:r])
        exact = abs(float(y) - float(ref)) <= 1e-10 and bool(
            torch.allclose(local.grad, ref_grad[off:off + sizes[r]], **TOL))
        out.append((exact, len([k for k, _ in rec.graphs if k == "fw"])))
    return out


# 3 ranks (one test: 2 ranks add nothing that this sequence lacks): rank 0's local length stays the same
# while the others change (the old hang), with N_global unchanged ([2, 4, 3]) and changed ([2, 0, 9]), a
# rank that becomes empty, two empty ranks, the same sizes again (no new graph) and the first sizes again
RESIZES = [[2, 3, 4], [2, 4, 3], [2, 4, 3], [2, 0, 9], [9, 0, 0], [2, 3, 4]]


def test_new_sizes_recompile_on_every_rank_alike():
    seq = RESIZES
    results = run_distributed(_recompiles, 3, seq, timeout=60)
    for rank, res in enumerate(results):
        assert all(ok for ok, _ in res), (rank, res)
    counts = [[n for _, n in res] for res in results]
    assert all(c == counts[0] for c in counts), counts  # every rank compiled on the same calls
    distinct = []
    for s in seq:  # a new graph for each sizes not seen before (dynamo keeps the earlier ones)
        if s not in distinct:
            distinct.append(s)
        assert counts[0][seq.index(s)] <= len(distinct)
    assert counts[0][-1] == len(distinct), counts


# -- what cannot compile -------------------------------------------------------------------------------
def _no_rule():
    torch.set_num_threads(1)
    torch._dynamo.reset()
    mesh = ms.init_mesh()
    x, _ = _shard(torch.randn(5, 3, dtype=torch.float64), [5] if dist.get_world_size() == 1 else [3, 2], mesh)
    compiled = torch.compile(lambda x: torch.as_strided(x, (2,), (1,)).sum(), fullgraph=True, backend="aot_eager")
    compiled(x)


def _failures(fn):
    with pytest.raises(DistributedError) as info:
        run_distributed(fn, 2, timeout=60)
    failures = info.value.failures
    assert [f.rank for f in failures] == [0, 1] and all(f.kind == "exception" for f in failures), failures
    for f in failures:
        assert "InternalTorchDynamoError" not in f.message + f.traceback
    return failures


def test_an_op_without_rule_raises_one_clear_error_on_every_rank():
    for f in _failures(_no_rule):
        text = f.message + f.traceback
        assert "has no sharding rule for" in text and "as_strided" in text, text


def _composite():
    torch.set_num_threads(1)
    torch._dynamo.reset()
    mesh = ms.init_mesh()
    x, _ = _shard(torch.randn(5, 3, dtype=torch.float64), [3, 2], mesh)
    torch.compile(lambda x: sum(t.sum() for t in torch.std_mean(x, dim=0)), fullgraph=True, backend="aot_eager")(x)


def test_a_rule_written_as_other_ops_raises_when_traced_instead_of_running_locally():
    # traced (torch 2.13), the ops inside a rule do not dispatch to ShardTensor: std_mean's std and mean would
    # reduce the local shard alone (a wrong answer at P = 2 before the check)
    for f in _failures(_composite):
        text = f.message + f.traceback
        assert "torch.std_mean on a ShardTensor cannot be compiled yet" in text, text
