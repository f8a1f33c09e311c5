"""Attention over sharded points: exact ring attention for ``scaled_dot_product_attention`` and multi-head attention.

Layouts (the sequence dim is the points dim: ``-2`` of ``(..., L, E)`` for SDPA, ``0`` of ``(L, N, E)``
for ``F.multi_head_attention_forward``, which ``nn.MultiheadAttention`` calls, after its own
``batch_first`` transpose):

==============================  ==========================================================  =========================
queries / keys+values           what runs                                                   result
==============================  ==========================================================  =========================
sharded / replicated (plain)    torch's own op on the local queries (cross-attention to     sharded like the queries
                                latent or anchor tokens); masks' rows sliced to the shard
sharded / sharded               **ring attention**: key/value blocks travel around the      sharded like the queries
                                ranks; per-block online softmax (running max and sum)
replicated / sharded            partial softmax statistics per rank, then one max and one   replicated
                                sum all-reduce
sharded along a batch dim       local (every operand sharded alike, or size 1 there)        sharded like the queries
==============================  ==========================================================  =========================

Keys and values must be sharded alike (same sizes); queries may have other sizes (attention between two
point sets on the same mesh axis). Sizes may be uneven and include empty shards.

Ring attention. Rank ``r`` starts with its own key/value block; at step ``t`` it holds the block of rank
``r - t`` and, while it computes ``softmax`` statistics against it, already sends it to ``r + 1`` and
receives the next one (``isend``/``irecv``, :func:`meshshard.comm.ring_shift`). The scores of one block
(``L_local x S_block``) are the largest transient, so score memory is ``O(N / P)`` per rank and the
forward keeps only queries, its own keys/values, the output and the per-row log-sum-exp. The backward
(a custom ``autograd.Function``, FlashAttention-style recomputation from the log-sum-exp) passes the
key/value blocks around the ring again together with their gradient accumulators; after ``P`` hops
every block's accumulated gradient is back at its owner. The arithmetic is plain matmuls in the input
dtype (the math backend's), so float64 agrees with the single-process op to rounding.

Masks and ``is_causal`` on unordered points:

* ``attn_mask``: a plain (replicated) tensor broadcastable to ``(..., L, S)``, boolean (``True`` = attend,
  for SDPA; ``True`` = masked for ``nn.MultiheadAttention``, as torch defines them) or float (added);
  each rank slices its query rows and, per ring step, the block's key columns. A ShardTensor mask
  sharded on its row dim like the queries is used locally; one sharded on its key dim with one row
  (key padding) is gathered (one ``all_to_all``). A float mask that requires grad is refused in ring
  mode (its gradient would be the full ``L x S`` matrix); in the local and replicated-query modes its
  gradient flows (partial per rank, like every replicated input's).
* ``key_padding_mask`` (``nn.MultiheadAttention``): plain, or a ShardTensor sharded along keys (gathered,
  ``N x S`` booleans, one ``all_to_all``).
* ``is_causal``: query ``i`` attends to key ``j <= i`` in **global index order**, exactly torch's
  top-left convention. On a partitioned point cloud that order is the partition's order (e.g. RCB or a
  space-filling curve), which is rarely meaningful; it is supported because it is well defined.
* Fully masked rows give zeros (torch's safe softmax).

Dropout inside attention draws torch's own random mask, which a sharded run cannot reproduce:
``dropout_p > 0`` raises (for ``nn.MultiheadAttention`` only in training mode); apply ``nn.Dropout`` to
the output instead. ``need_weights=True`` with sharded keys raises (it would materialise the ``L x S``
attention matrix); pass ``need_weights=False``. ``bias_k``/``bias_v``/``add_zero_attn``/``static_k``/
``static_v`` raise with sharded keys.

Written by hand because no library does it for uneven shards over torch.distributed: torch's SDPA
kernels have no cross-process online softmax, and torch's experimental context parallel works on evenly
sharded DTensors with its own kernels.

**Communication** (``P`` ranks; ``B`` = bytes of the local key block plus value block, ``G`` = bytes of
the replicated output plus one float per row; nothing with one rank):

==================================  ===============================================  ===========================
mode                                forward                                          backward
==================================  ===============================================  ===========================
queries sharded, keys replicated    none                                             none
ring (both sharded)                 ``P - 1`` ``ring_shift`` (blocks of ``~B``)      ``2P - 1`` ``ring_shift``
                                                                                     (blocks, then gradients)
queries replicated, keys sharded    one max ``all_reduce`` (rows) + one sum          one ``all_reduce`` (``G``)
                                    ``all_reduce`` (``G``)
batch dim sharded                   none                                             none
==================================  ===============================================  ===========================

plus one ``all_to_all`` per gathered key-padding mask. Compiled, each ``ring_shift`` is one
``all_to_all_single`` and the ring backward issues ``P`` of them (blocks and gradients travel together;
see :class:`_RingAttention`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ... import comm
from ..._sizes import offsets_of
from ...errors import ShardingError
from .._dispatch import bind, no_subclass, op_name
from .._dispatch import register_rule as register
from .._spec import ShardSpec
from .._tensor import ReplicatedTensor, ShardTensor
from ._common import plain_along_shard, refuse, replicated, wrap

_NEG_INF = float("-inf")
# Start each ring step's transfer before computing on the current block (True), or finish it first
# (False: the benchmark's no-overlap baseline).
OVERLAP = True


def _gshape(t: torch.Tensor) -> torch.Size:
    return t._spec.global_shape if isinstance(t, ShardTensor) else t.shape


def _plain(t):
    """The local plain tensor of a ShardTensor / ReplicatedTensor operand (autograd stays connected)."""
    if isinstance(t, ShardTensor):
        return t.to_local()
    if isinstance(t, ReplicatedTensor):
        return t.to_plain()
    return t


@dataclass
class _Plan:
    """Everything a rank needs to attend its local queries to (blocks of) the keys; the same on every rank."""

    group: object
    rank: int
    world: int
    q_sharded: bool
    q_off: int  # global index of the first local query row (0 when queries are replicated)
    q_len: int  # local query rows
    kv_sizes: tuple[int, ...] | None  # None: keys/values replicated
    num_keys: int
    masks: list  # (tensor, rows_local) pairs, each broadcastable to (..., L, S)
    causal: bool
    scale: float

    def bias(self, c0: int, c1: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        """The additive mask (0 / -inf / float) of the local query rows against global key columns [c0, c1)."""
        out = None
        for m, rows_local in self.masks:
            if m.dim() >= 2 and m.shape[-2] != 1 and self.q_sharded and not rows_local:
                m = m.narrow(-2, self.q_off, self.q_len)
            if m.dim() >= 1 and m.shape[-1] != 1:
                m = m.narrow(-1, c0, c1 - c0)
            if m.dtype == torch.bool:
                m = torch.zeros(m.shape, dtype=dtype, device=device).masked_fill(~m, _NEG_INF)
            out = m if out is None else out + m
        if self.causal:
            rows = torch.arange(self.q_off, self.q_off + self.q_len, device=device)[:, None]
            cols = torch.arange(c0, c1, device=device)[None, :]
            c = torch.zeros((self.q_len, c1 - c0), dtype=dtype, device=device).masked_fill(rows < cols, _NEG_INF)
            out = c if out is None else out + c
        return out


def _scores(q: torch.Tensor, kb: torch.Tensor, plan: _Plan, c0: int, c1: int) -> torch.Tensor:
    s = torch.matmul(q, kb.transpose(-2, -1)).mul_(plan.scale)  # in place: one score block alive, not several
    bias = plan.bias(c0, c1, s.dtype, s.device)
    return s if bias is None else s.add_(bias)


def _batch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, ...]:
    return tuple(torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]))


class _RingAttention(torch.autograd.Function):
    """Exact attention of sharded queries to sharded keys/values, blocks passed around the ring.

    **Compiled** (``torch.compile``, ``fullgraph=True``): dynamo traces this Function, forward and
    backward, into the graphs; each ring step is an ``all_to_all_single`` (a functional collective,
    :func:`meshshard.comm.ring_shift`) instead of ``isend``/``irecv``, with the same arithmetic, so the
    result equals eager's. Two differences, both about keeping every rank's collectives in step:

    * AOTAutograd's partitioner moves a collective that does not depend on the output gradient into the
      forward graph (it never recomputes collectives). On a rank with no query rows, or whose block is
      empty, the backward's ring steps would depend only on forward values, so its backward collectives
      would run during the forward while its peers' run in the backward: a hang. The backward therefore
      starts from the key/value blocks plus ``sum`` of an empty slice of ``dout`` (exactly ``+ 0.0``).
    * The backward's two chains (the blocks, and their gradient accumulators) would be independent in
      the graph, and a compiler may order independent collectives differently on ranks whose graphs
      differ (an empty rank skips the block arithmetic). Compiled, each step sends the block and its
      accumulated gradients together in one ``all_to_all_single`` (the same bytes), one chain: the
      backward issues ``P`` collectives where eager issues ``2P - 1`` ``ring_shift``s; the forward's
      ``P - 1`` are the same.

    Memory is eager's (the Function saves the same tensors); the traced shifts do not overlap the block
    arithmetic the way eager's non-blocking ``isend``/``irecv`` do unless the backend schedules them so.
    """

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: _Plan) -> torch.Tensor:
        batch, e = _batch(q, k, v), k.shape[-1]
        world, rank, sizes = plan.world, plan.rank, plan.kv_sizes
        offs = offsets_of(sizes)
        cur = torch.cat([k.expand(*batch, -1, -1), v.expand(*batch, -1, -1)], -1).contiguous()
        width = cur.shape[-1]
        lq = q.shape[-2]
        acc = q.new_zeros((*batch, lq, v.shape[-1]))
        total = q.new_zeros((*batch, lq))
        run_max = q.new_full((*batch, lq), _NEG_INF)
        for t in range(world):
            src = (rank - t) % world
            pending = None
            if t < world - 1:  # the next block travels while this one is used
                pending = comm.ring_shift(cur, (*batch, sizes[(rank - t - 1) % world], width), plan.group)
                if not OVERLAP:
                    pending.wait()
            if sizes[src] and lq:
                kb, vb = cur[..., :e], cur[..., e:]
                s = _scores(q, kb, plan, offs[src], offs[src + 1])
                new_max = torch.maximum(run_max, s.amax(-1))
                shift = new_max.masked_fill(new_max == _NEG_INF, 0.0)
                alpha = torch.exp(run_max - shift)
                p = s.sub_(shift[..., None]).exp_()
                total = total * alpha + p.sum(-1)
                acc = acc * alpha[..., None] + torch.matmul(p, vb)
                run_max = new_max
            if pending is not None:
                cur = pending.wait()
        seen = total > 0
        out = acc / torch.where(seen, total, torch.ones_like(total))[..., None]
        shift = run_max.masked_fill(run_max == _NEG_INF, 0.0)
        # Rows that attend to nothing get +inf, so that exp(s - lse) is 0 in the backward.
        lse = torch.where(seen, shift + torch.log(torch.where(seen, total, torch.ones_like(total))),
                          torch.full_like(total, float("inf")))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan = plan
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        plan = ctx.plan
        batch, e = _batch(q, k, v), k.shape[-1]
        world, rank, sizes = plan.world, plan.rank, plan.kv_sizes
        offs = offsets_of(sizes)
        cur = torch.cat([k.expand(*batch, -1, -1), v.expand(*batch, -1, -1)], -1).contiguous()
        width = cur.shape[-1]
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)
        dq = q.new_zeros((*batch, q.shape[-2], q.shape[-1]))
        grads_in = None  # the accumulated gradients of the block this rank works on, arriving from r - 1
        dkv = cur.new_zeros(cur.shape)
        traced = torch.compiler.is_dynamo_compiling()
        if traced:  # ties every ring step to ``dout`` (exactly + 0.0): see the docstring
            cur = cur + dout.reshape(-1)[:0].sum()
        for t in range(world):
            src, nxt = (rank - t) % world, (*batch, sizes[(rank - t - 1) % world], width)
            fused = traced and t < world - 1  # traced: the block and its gradients travel together (docstring)
            pending = None
            if t < world - 1 and not fused:
                pending = comm.ring_shift(cur, nxt, plan.group)
                if not OVERLAP:
                    pending.wait()
            dkv = cur.new_zeros((*batch, sizes[src], width))
            if sizes[src] and q.shape[-2]:
                kb, vb = cur[..., :e], cur[..., e:]
                p = _scores(q, kb, plan, offs[src], offs[src + 1]).sub_(lse[..., None]).exp_()
                dv = torch.matmul(p.transpose(-2, -1), dout)
                ds = torch.matmul(dout, vb.transpose(-2, -1)).sub_(delta[..., None]).mul_(p)
                del p
                dq.add_(torch.matmul(ds, kb), alpha=plan.scale)
                dk = torch.matmul(ds.transpose(-2, -1), q).mul_(plan.scale)
                dkv = torch.cat([dk, dv], -1)
            if grads_in is not None:
                dkv = dkv + grads_in.wait()
            if fused:
                both = comm.ring_shift(torch.cat([cur, dkv], -1), (*nxt[:-1], 2 * width), plan.group).wait()
                cur, grads_in = both[..., :width], comm.RingShift([], both[..., width:], plan.group)
            elif world > 1:  # the block's gradients follow it; after the last step they reach the owner
                grads_in = comm.ring_shift(dkv, nxt, plan.group, tag=1)
                if not OVERLAP:
                    grads_in.wait()
            if pending is not None:
                cur = pending.wait()
        own = grads_in.wait() if grads_in is not None else dkv
        dk = own[..., :e].sum_to_size(k.shape)
        dv = own[..., e:].sum_to_size(v.shape)
        return dq.sum_to_size(q.shape), dk, dv, None


def _replicated_queries(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: _Plan) -> torch.Tensor:
    """Replicated queries against sharded keys: partial softmax statistics, all-reduced (differentiable)."""
    rank, offs = plan.rank, offsets_of(plan.kv_sizes)
    s = _scores(q, k, plan, offs[rank], offs[rank + 1])
    if s.shape[-1]:
        row_max = s.detach().amax(-1)
    else:
        row_max = s.new_full(s.shape[:-1], _NEG_INF)
    top = comm.all_reduce_max(row_max, plan.group)
    p = torch.exp(s - top.masked_fill(top == _NEG_INF, 0.0)[..., None])
    both = comm.all_reduce(torch.cat([torch.matmul(p, v), p.sum(-1, keepdim=True)], -1), plan.group)
    num, den = both[..., :-1], both[..., -1:]
    seen = den > 0
    return torch.where(seen, num / torch.where(seen, den, torch.ones_like(den)), torch.zeros_like(num))


def _empty(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention whose result has no elements (an empty shard): torch's CPU fused kernels return
    uninitialised gradients for empty queries, so the (empty) result comes from plain matmuls, whose
    gradients are exact zeros."""
    return torch.matmul(torch.matmul(q, k.transpose(-2, -1)), v)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: _Plan) -> torch.Tensor:
    """Local plain q (..., Lq, E), k (..., Sk, E), v (..., Sk, Ev) -> local output, with keys sharded."""
    if plan.q_sharded:
        if torch.is_grad_enabled() and any(m.requires_grad for m, _ in plan.masks):
            raise refuse(F.scaled_dot_product_attention, "a float attn_mask that requires grad with queries and "
                         "keys both sharded (its gradient would be the full L x S matrix)", "detach the mask")
        return _RingAttention.apply(q, k, v, plan)
    return _replicated_queries(q, k, v, plan)


# -- argument checks (global metadata only: every rank raises alike) --------------------------------
def _seq_sharded(t, seq_dim: int) -> bool:
    return isinstance(t, ShardTensor) and t._spec.dim == seq_dim % len(t._spec.global_shape)


def _same_axis(a: ShardSpec, b: ShardSpec, func, what: str) -> None:
    if a.mesh_id != b.mesh_id or a.mesh_dim != b.mesh_dim:
        raise ShardingError(f"[rank {a.rank}] {op_name(func)}: {what} are sharded over different mesh axes")


def _check_kv(func, k, v, seq_dim_k: int, seq_dim_v: int) -> bool:
    ks, vs = _seq_sharded(k, seq_dim_k), _seq_sharded(v, seq_dim_v)
    if ks != vs:
        raise ShardingError(f"{op_name(func)}: key and value must both be sharded along the sequence (points) dim, "
                            f"or both replicated (got key {'sharded' if ks else 'replicated'}, value "
                            f"{'sharded' if vs else 'replicated'})")
    if ks and k._spec.sizes != v._spec.sizes:
        raise ShardingError(f"[rank {k._spec.rank}] {op_name(func)}: key and value are sharded differently: sizes "
                            f"{k._spec.sizes} vs {v._spec.sizes}")
    if ks:
        _same_axis(k._spec, v._spec, func, "key and value")
    return ks


def _mask_entry(func, mask, q_spec: ShardSpec | None, kv_spec: ShardSpec | None, num_q: int, num_k: int):
    """A mask as a ``(plain tensor, rows_local)`` pair, checked against the global (L, S)."""
    shape = _gshape(mask)
    if len(shape) < 2:
        raise RuntimeError(f"{op_name(func)}: attn_mask must have at least 2 dims (got shape {tuple(shape)})")
    if shape[-1] not in (1, num_k) or shape[-2] not in (1, num_q):
        raise RuntimeError(f"{op_name(func)}: attn_mask of shape {tuple(shape)} does not broadcast to "
                           f"(..., {num_q}, {num_k}) (queries x keys)")
    if not isinstance(mask, ShardTensor):
        return _plain(mask), False
    nd, d = len(shape), mask._spec.dim
    if q_spec is not None and nd >= 2 and d == nd - 2 and mask._spec.sizes == q_spec.sizes:
        _same_axis(mask._spec, q_spec, func, "attn_mask and query")
        return mask.to_local(), True
    if kv_spec is not None and d == nd - 1 and shape[-2] == 1 and mask._spec.sizes == kv_spec.sizes:
        _same_axis(mask._spec, kv_spec, func, "attn_mask and key")
        return mask.full_tensor().to_plain(), False  # key padding: one row of booleans/floats per key
    raise ShardingError(f"{op_name(func)}: a sharded attn_mask must be sharded along its query dim (-2) like the "
                        "queries, or along its key dim (-1) like the keys with a single query row (key padding); "
                        f"got one sharded on dim {d} with sizes {mask._spec.sizes}")


def _plan(spec_src: ShardSpec, q_spec: ShardSpec | None, kv_spec: ShardSpec | None, num_q: int, num_k: int,
          masks, causal, scale) -> _Plan:
    rank = spec_src.rank
    q_off = q_spec.offsets[rank] if q_spec is not None else 0
    return _Plan(spec_src.group, rank, spec_src.num_ranks, q_spec is not None, q_off,
                 q_spec.sizes[rank] if q_spec is not None else num_q, kv_spec.sizes if kv_spec is not None else None,
                 num_k, masks, causal, scale)


# -- F.scaled_dot_product_attention -------------------------------------------------------------
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


@register(F.scaled_dot_product_attention)
def _sdpa(func, args, kwargs):
    a = bind(func, args, kwargs, _SDPA_ARGS, {"dropout_p": 0.0, "is_causal": False, "enable_gqa": False})
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    qs, ks, vs = _check_sdpa_operands(func, a)
    _check_sdpa_options(func, a, qs, ks, vs)
    q_seq = _seq_sharded(q, -2)
    kv_seq = _check_kv(func, k, v, -2, -2)
    if not q_seq and not kv_seq:
        return _batch_sharded(func, a)
    _check_seq_dims(func, q, k, v, mask)
    q_spec = q._spec if q_seq else None
    kv_spec = k._spec if kv_seq else None
    if q_spec is not None and kv_spec is not None:
        _same_axis(q_spec, kv_spec, func, "query and key")
    masks = [_mask_entry(func, mask, q_spec, kv_spec, qs[-2], ks[-2])] if mask is not None else []
    scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(qs[-1])
    plan = _plan((q_spec or kv_spec), q_spec, kv_spec, qs[-2], ks[-2], masks, bool(a["is_causal"]), scale)
    with no_subclass():
        lq, lk, lv = _sdpa_locals(a)
        if q_seq and not kv_seq:
            return _sdpa_local_queries(func, lq, lk, lv, plan, q_spec)
        out = _attend(lq, lk, lv, plan)
    if q_seq:
        return wrap(out, q_spec, out.dim() - 2)
    return replicated(out, kv_spec)


def _check_sdpa_operands(func, a: dict) -> tuple[torch.Size, torch.Size, torch.Size]:
    """Types, dropout and the shapes query/key/value must have; returns their global shapes."""
    for name in ("query", "key", "value"):
        if not isinstance(a[name], torch.Tensor):
            raise TypeError(f"{op_name(func)}: {name} must be a tensor (got {type(a[name]).__name__})")
    if a["dropout_p"]:
        raise refuse(func, f"dropout_p={a['dropout_p']} draws torch's own random mask, which a sharded run cannot "
                     "reproduce", "use dropout_p=0 and apply nn.Dropout to the output")
    qs, ks, vs = _gshape(a["query"]), _gshape(a["key"]), _gshape(a["value"])
    if min(len(qs), len(ks), len(vs)) < 2:
        raise RuntimeError(f"{op_name(func)}: query, key and value need at least 2 dims (got {tuple(qs)}, "
                           f"{tuple(ks)}, {tuple(vs)})")
    if qs[-1] != ks[-1] or ks[-2] != vs[-2]:
        raise RuntimeError(f"{op_name(func)}: query {tuple(qs)}, key {tuple(ks)} and value {tuple(vs)} do not fit "
                           "(query and key need the same last dim, key and value the same sequence length)")
    return qs, ks, vs


def _check_sdpa_options(func, a: dict, qs: torch.Size, ks: torch.Size, vs: torch.Size) -> None:
    """Dtypes, the mask against ``is_causal``, and the head counts ``enable_gqa`` needs."""
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    if not (q.dtype == k.dtype == v.dtype) or not q.dtype.is_floating_point:
        raise RuntimeError(f"{op_name(func)}: expected query, key and value of one floating dtype (got {q.dtype}, "
                           f"{k.dtype}, {v.dtype})")
    if mask is not None and mask.dtype != torch.bool and mask.dtype != q.dtype:
        raise RuntimeError(f"{op_name(func)}: expected attn_mask of dtype bool or {q.dtype} (got {mask.dtype})")
    if a["is_causal"] and mask is not None:
        raise RuntimeError(f"{op_name(func)}: an explicit attn_mask must not be given with is_causal=True")
    if a["enable_gqa"] and len(qs) >= 3 and len(ks) >= 3 and qs[-3] != ks[-3]:
        if qs[-3] % ks[-3] or ks[-3] != vs[-3]:
            raise RuntimeError(f"{op_name(func)}: with enable_gqa the query heads ({qs[-3]}) must be a multiple of "
                               f"the key/value heads ({ks[-3]}, {vs[-3]})")


def _check_seq_dims(func, q, k, v, mask) -> None:
    """With the sequence dim sharded, every sharded operand but the mask must be sharded along it."""
    shards = [t for t in (q, k, v, mask) if isinstance(t, ShardTensor)]
    for t in shards:
        nd, d = len(t._spec.global_shape), t._spec.dim
        if t is not mask and d != nd - 2:
            raise ShardingError(f"{op_name(func)}: with the sequence dim sharded, every sharded operand must be "
                                f"sharded along it (got one sharded on dim {d} of {nd})")


def _sdpa_locals(a: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The local plain query/key/value; with ``enable_gqa``, key/value heads repeated to the query heads."""
    lq, lk, lv = _plain(a["query"]), _plain(a["key"]), _plain(a["value"])
    if a["enable_gqa"] and lq.dim() >= 3 and lk.dim() >= 3 and lq.shape[-3] != lk.shape[-3]:
        rep = lq.shape[-3] // lk.shape[-3]
        lk, lv = lk.repeat_interleave(rep, dim=-3), lv.repeat_interleave(rep, dim=-3)
    return lq, lk, lv


def _sdpa_local_queries(func, lq: torch.Tensor, lk: torch.Tensor, lv: torch.Tensor, plan: _Plan,
                        q_spec: ShardSpec) -> ShardTensor:
    """Sharded queries, replicated keys/values: torch's own op on the local query rows (no communication)."""
    if plan.q_len == 0:
        out = _empty(lq, lk, lv)
    else:
        out = func(lq, lk, lv, attn_mask=plan.bias(0, plan.num_keys, lq.dtype, lq.device), scale=plan.scale)
    return wrap(out, q_spec, out.dim() - 2)


def _batch_sharded(func, a: dict):
    """No sequence dim is sharded: every ShardTensor must be sharded alike along one batch dim (local op)."""
    ops = {n: a[n] for n in ("query", "key", "value", "attn_mask") if a[n] is not None}
    shards = {n: t for n, t in ops.items() if isinstance(t, ShardTensor)}
    back = {len(t._spec.global_shape) - t._spec.dim for t in shards.values()}
    spec = next(iter(shards.values()))._spec
    if len(back) != 1 or min(back) < 3 or any(not spec.same_sharding(t._spec) for t in shards.values()):
        where = ", ".join(f"{n} on dim {t._spec.dim} of {len(t._spec.global_shape)}" for n, t in shards.items())
        raise refuse(func, f"operands sharded as {where}", "shard the sequence (points) dim -2 of query and "
                     "key/value, or one batch dim of every operand alike; the head dim -1 cannot be sharded")
    b = back.pop()
    if not isinstance(a["query"], ShardTensor):
        raise refuse(func, "key/value sharded along a batch dim with replicated queries",
                     "shard the queries the same way")
    local = {}
    for n, t in ops.items():
        local[n] = t.to_local() if isinstance(t, ShardTensor) else plain_along_shard(func, _plain(t), spec, b)
    with no_subclass():
        if any(t.numel() == 0 for t in (local["query"], local["key"], local["value"])):
            out = _empty(local["query"], local["key"], local["value"])
        else:
            out = func(local["query"], local["key"], local["value"], attn_mask=local.get("attn_mask"),
                       is_causal=a["is_causal"], scale=a["scale"], enable_gqa=a["enable_gqa"])
    return wrap(out, spec, out.dim() - b)


# -- F.multi_head_attention_forward (what nn.MultiheadAttention calls) ---------------------------
_MHA_ARGS = (
    "query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight", "in_proj_bias", "bias_k",
    "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight", "out_proj_bias", "training", "key_padding_mask",
    "need_weights", "attn_mask", "use_separate_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
    "static_k", "static_v", "average_attn_weights", "is_causal",
)
_MHA_DEFAULTS = {"training": True, "need_weights": True, "use_separate_proj_weight": False,
                 "average_attn_weights": True, "is_causal": False}
_MHA_PARAMS = ("in_proj_weight", "in_proj_bias", "bias_k", "bias_v", "out_proj_weight", "out_proj_bias",
               "q_proj_weight", "k_proj_weight", "v_proj_weight", "static_k", "static_v")


def _float_mask(m: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """nn.MultiheadAttention's convention: a boolean ``True`` masks the position out."""
    if m.dtype == torch.bool:
        return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(m, _NEG_INF)
    return m


@register(F.multi_head_attention_forward)
def _mha(func, args, kwargs):
    a = bind(func, args, kwargs, _MHA_ARGS, _MHA_DEFAULTS)
    q, k, v = a["query"], a["key"], a["value"]
    if a["dropout_p"] and a["training"]:
        raise refuse(func, f"dropout_p={a['dropout_p']} in training draws torch's own random mask, which a sharded "
                     "run cannot reproduce", "use dropout=0 in nn.MultiheadAttention (or eval mode) and apply "
                     "nn.Dropout to the output")
    for n in _MHA_PARAMS:
        if isinstance(a[n], ShardTensor):
            raise refuse(func, f"{n} is sharded", "keep the module's parameters replicated")
    qs = _gshape(q)
    batched = len(qs) == 3
    q_seq = _seq_sharded(q, 0)
    kv_seq = _check_kv(func, k, v, 0, 0)
    for name, t in (("query", q), ("key", k), ("value", v)):
        if isinstance(t, ShardTensor) and t._spec.dim != 0:
            raise refuse(func, f"{name} is sharded on dim {t._spec.dim}", "shard the sequence (points) dim: dim 1 "
                         "with batch_first=True, else dim 0")
    if isinstance(a["attn_mask"], ShardTensor) and not q_seq:
        raise refuse(func, "a sharded attn_mask with replicated queries", "pass a replicated mask")
    q_spec = q._spec if q_seq else None
    kv_spec = k._spec if kv_seq else None
    if q_spec is not None and kv_spec is not None:
        _same_axis(q_spec, kv_spec, func, "query and key")
    kpm = a["key_padding_mask"]
    if isinstance(kpm, ShardTensor):
        if kv_spec is None or kpm._spec.dim != len(kpm._spec.global_shape) - 1 or kpm._spec.sizes != kv_spec.sizes:
            raise ShardingError(f"{op_name(func)}: a sharded key_padding_mask must be sharded along its key dim like "
                                f"the keys (got dim {kpm._spec.dim}, sizes {kpm._spec.sizes})")
        kpm = kpm.full_tensor().to_plain()
    mask = a["attn_mask"]
    if not kv_seq:  # queries sharded, keys replicated: torch's own op on the local query rows
        return _mha_local_queries(func, a, q_spec, kpm, mask, batched)
    if a["need_weights"]:
        raise refuse(func, "need_weights=True with sharded keys would materialise the L x S attention matrix",
                     "call the module with need_weights=False")
    for n in ("bias_k", "bias_v", "static_k", "static_v"):
        if a[n] is not None:
            raise refuse(func, f"{n} with sharded keys (it appends a key at the end of the sharded sequence)")
    if a["add_zero_attn"]:
        raise refuse(func, "add_zero_attn with sharded keys (it appends a key at the end of the sharded sequence)")
    return _mha_sharded_keys(func, a, q_spec, kv_spec, kpm, mask, batched)


def _local_rows(func, mask, q_spec: ShardSpec, num_q: int):
    if mask is None:
        return None
    if isinstance(mask, ShardTensor):
        if mask._spec.dim != len(mask._spec.global_shape) - 2 or mask._spec.sizes != q_spec.sizes:
            raise ShardingError(f"{op_name(func)}: a sharded attn_mask must be sharded along its query dim (-2) like "
                                f"the queries (got dim {mask._spec.dim}, sizes {mask._spec.sizes})")
        return mask.to_local()
    mask = _plain(mask)
    if mask.dim() >= 2 and mask.shape[-2] == num_q:
        return mask.narrow(-2, q_spec.offsets[q_spec.rank], q_spec.sizes[q_spec.rank])
    return mask  # torch raises its own shape error on every rank alike


def _mha_local_queries(func, a: dict, q_spec: ShardSpec, kpm, mask, batched: bool):
    num_q, num_k = _gshape(a["query"])[0], _gshape(a["key"])[0]
    if a["is_causal"] and mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the Transformer module "
                           "method `generate_square_subsequent_mask` to create this mask.")
    rank = q_spec.rank
    lq = q_spec.sizes[rank]
    if a["is_causal"] and kpm is None and not a["need_weights"]:
        # torch then attends causally (global index order), whatever the mask holds
        dev = a["query"].device
        rows = torch.arange(q_spec.offsets[rank], q_spec.offsets[rank] + lq, device=dev)[:, None]
        local_mask = rows < torch.arange(num_k, device=dev)[None, :]
    else:
        local_mask = _local_rows(func, mask, q_spec, num_q)
    call = dict(a)
    call.update(query=a["query"].to_local(), key=_plain(a["key"]), value=_plain(a["value"]), key_padding_mask=kpm,
                attn_mask=local_mask, is_causal=False)
    for n in _MHA_PARAMS:
        call[n] = _plain(call[n])
    if lq == 0 and not a["need_weights"]:
        call["need_weights"] = True  # torch's explicit-softmax path: its fused kernel mishandles empty queries
    with no_subclass():
        out, weights = func(**call)
    if not a["need_weights"]:
        weights = None
    out = wrap(out, q_spec, 0)
    if weights is not None:
        weights = wrap(weights, q_spec, weights.dim() - 2)
    return out, weights


def _mha_sharded_keys(func, a: dict, q_spec: ShardSpec | None, kv_spec: ShardSpec, kpm, mask, batched: bool):
    q, k, v = a["query"], a["key"], a["value"]
    qs, ks = _gshape(q), _gshape(k)
    heads, e = _check_mha_shapes(func, a, mask, batched)
    num_q, num_k, bsz, hd = qs[0], ks[0], (qs[1] if batched else 1), e // heads
    causal = bool(a["is_causal"]) and kpm is None
    masks = []
    if not causal and mask is not None:
        masks.append(_mha_attn_mask(func, mask, q_spec, num_q, num_k, bsz, heads, q.dtype))
    if kpm is not None:
        masks.append(_mha_key_padding(func, kpm, num_k, bsz, batched, q.dtype))
    scale = 1.0 / math.sqrt(hd)
    plan = _plan(q_spec or kv_spec, q_spec, kv_spec, num_q, num_k, masks, causal, scale)
    with no_subclass():
        lq, lk, lv = _plain(q), _plain(k), _plain(v)
        if not batched:
            lq, lk, lv = lq.unsqueeze(1), lk.unsqueeze(1), lv.unsqueeze(1)
        pq, pk, pv = _mha_in_proj(a, lq, lk, lv)

        def heads_first(t: torch.Tensor) -> torch.Tensor:  # (L, N, E) -> (N, H, L, hd)
            return t.reshape(t.shape[0], bsz, heads, hd).permute(1, 2, 0, 3)

        out = _attend(heads_first(pq), heads_first(pk), heads_first(pv), plan)
        rows = out.shape[-2]
        out = out.permute(2, 0, 1, 3).reshape(rows * bsz, e)
        out = F.linear(out, _plain(a["out_proj_weight"]), _plain(a["out_proj_bias"])).reshape(rows, bsz, e)
        if not batched:
            out = out.squeeze(1)
    if q_spec is not None:
        return wrap(out, q_spec, 0), None
    return replicated(out, kv_spec), None


def _check_mha_shapes(func, a: dict, mask, batched: bool) -> tuple[int, int]:
    """torch's own checks of embedding dim, heads, operand shapes and ``is_causal``; returns ``(heads, E)``."""
    qs, ks, vs = _gshape(a["query"]), _gshape(a["key"]), _gshape(a["value"])
    heads, e = int(a["num_heads"]), qs[-1]
    if e != a["embed_dim_to_check"]:
        raise AssertionError(f"was expecting embedding dimension of {a['embed_dim_to_check']}, but got {e}")
    if e % heads:
        raise AssertionError(f"embed_dim {e} not divisible by num_heads {heads}")
    if not a["use_separate_proj_weight"] and ks != vs:
        raise AssertionError(f"key shape {tuple(ks)} does not match value shape {tuple(vs)}")
    if len(ks) != len(qs) or len(vs) != len(qs) or len(qs) not in (2, 3) or batched and (qs[1] != ks[1] or
                                                                                       ks[1] != vs[1]):
        raise RuntimeError(f"{op_name(func)}: query {tuple(qs)}, key {tuple(ks)}, value {tuple(vs)} must all be "
                           "(L, N, E) or all (L, E) with one batch size")
    if a["is_causal"] and mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the Transformer module "
                           "method `generate_square_subsequent_mask` to create this mask.")
    return heads, e


def _mha_attn_mask(func, mask, q_spec: ShardSpec | None, num_q: int, num_k: int, bsz: int, heads: int,
                   dtype: torch.dtype) -> tuple[torch.Tensor, bool]:
    """The attn_mask as a float ``(mask, rows_local)`` entry; a 3D one as ``(N, H, L, S)``."""
    mshape = _gshape(mask)
    if len(mshape) == 2 and tuple(mshape) != (num_q, num_k):
        raise RuntimeError(f"The shape of the 2D attn_mask is {tuple(mshape)}, but should be {(num_q, num_k)}.")
    if len(mshape) == 3 and tuple(mshape) != (bsz * heads, num_q, num_k):
        raise RuntimeError(f"The shape of the 3D attn_mask is {tuple(mshape)}, but should be "
                           f"{(bsz * heads, num_q, num_k)}.")
    if len(mshape) not in (2, 3):
        raise RuntimeError(f"attn_mask's dimension {len(mshape)} is not supported")
    m, rows_local = _mask_entry(func, mask, q_spec, None, num_q, num_k)
    m = _float_mask(m, dtype)
    m = m.reshape(bsz, heads, *m.shape[-2:]) if m.dim() == 3 else m
    return m, rows_local


def _mha_key_padding(func, kpm: torch.Tensor, num_k: int, bsz: int, batched: bool,
                     dtype: torch.dtype) -> tuple[torch.Tensor, bool]:
    """The (plain, global) key_padding_mask as a float ``(N, 1, 1, S)`` mask entry."""
    want = (bsz, num_k) if batched else (num_k,)
    if tuple(kpm.shape) != want:
        raise RuntimeError(f"{op_name(func)}: expected key_padding_mask of shape {want} (got {tuple(kpm.shape)})")
    return _float_mask(kpm, dtype).reshape(bsz, 1, 1, num_k), False


def _mha_in_proj(a: dict, lq: torch.Tensor, lk: torch.Tensor,
                 lv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The input projections of the local (L, N, E) query/key/value (packed or separate weights)."""
    w, b = _plain(a["in_proj_weight"]), _plain(a["in_proj_bias"])
    if a["use_separate_proj_weight"]:
        wq, wk, wv = _plain(a["q_proj_weight"]), _plain(a["k_proj_weight"]), _plain(a["v_proj_weight"])
    else:
        wq, wk, wv = w.chunk(3)
    bq, bk, bv = b.chunk(3) if b is not None else (None, None, None)
    return F.linear(lq, wq, bq), F.linear(lk, wk, bk), F.linear(lv, wv, bv)
