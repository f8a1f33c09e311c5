"""``DomainParallel``: run an unchanged PyG model on a graph split over ranks, exactly or not at all.

Between the layers it wraps, node tensors stay :class:`~meshshard.ShardTensor` s sharded like the
graph's nodes, so whatever the model does with them there (``BatchNorm1d``, PyG ``LayerNorm``,
``global_mean_pool``, ``h - h.mean(0)``, a residual, an MLP) goes through the sharding rules:
exact, or the same clear error on every rank. Only inside a top-level
``torch_geometric.nn.MessagePassing`` layer does the layer see plain local rows: a forward pre-hook
replaces its node inputs by ``[owned; ghosts]`` from the graph's halo, and a forward hook turns the
owned rows of its node output back into a ShardTensor. Since every incoming edge of an owned node
is local (:class:`~meshshard.ops.ShardedGraph`), each owned output equals the single-process one;
gradients flow back through the exchanges into the owners, and the parameters' gradients are
partial per rank (sum them with :func:`meshshard.nn.sync_gradients`).

Tensors that are local to a rank but are no sharding of the nodes (``graph.edge_index``, per-edge
tensors such as ``edge_attr`` or a layer's edge output, and in ``hops > 1`` mode the node rows with
their ghosts) travel between layers as a guard type that allows only row-wise ops (element-wise
math and activations, ``linear``, ``layer_norm`` over channels, ``cat``/``stack``/indexing along
the channels, dtype moves); any other op on them raises, on every rank alike.

Why hooks: PyG layers take ``(x, edge_index, ...)`` and size their output by ``x``; feeding them
the extended rows and the local ``edge_index`` is all they need, so no layer is re-implemented.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch_geometric.nn import GCNConv, MessagePassing

from .. import comm, faults
from .._op_names import op_name
from ..errors import ShardingError, UnsupportedOpError
from ..ops.graph import ShardedGraph
from ..tensor import ReplicatedTensor, ShardTensor, inspected_by_compiler, local_of, plain_alias, tracing

__all__ = ["DomainParallel"]

#: Arguments never exchanged: edge-level inputs and sizes (by name).
_NOT_NODE = ("edge_index", "size", "batch", "ptr", "dim_size", "return_attention_weights")

_no_subclass = torch._C.DisableTorchFunctionSubclass


class DomainParallel(torch.nn.Module):
    """Make a PyG model domain-parallel on a :class:`~meshshard.ops.ShardedGraph`: exact or refused.

    Call it like the model, with this rank's node tensors (``N_local`` rows, plain or ShardTensor),
    ``graph.edge_index`` and per-local-edge tensors (e.g. from ``graph.edge_vectors()``). Returns
    what the model returns: a node output as a ShardTensor sharded like the nodes (so a ``.mean()``
    loss is the global mean), a pooled readout as computed by the sharding rules (replicated),
    an edge output as this rank's plain edge rows (in ``graph.edge_index`` order).

    **What is exact, what is refused** (decided from types, names and global metadata, or agreed
    in one collective, so every rank takes the same branch):

    * Node tensors between wrapped layers are ShardTensors: every op on them is exact or raises
      the sharding rules' error on every rank (``BatchNorm1d``, PyG ``LayerNorm`` in ``"graph"``
      and ``"node"`` mode, ``global_mean_pool`` with or without ``batch``, ``h - h.mean(0)``).
    * ``graph.edge_index`` may only be handed to the wrapped layers; edge tensors may only take
      row-wise ops between layers. Anything else on them raises (e.g. ``x[edge_index[0]]`` outside
      a layer: write it inside a ``MessagePassing`` layer, or use ShardTensor nodes directly).
    * A layer whose ``forward`` takes no ``edge_index`` builds its own neighbourhoods (PyG
      ``DynamicEdgeConv``: a kNN in feature space): it runs on **all** nodes, gathered on every
      rank, and keeps the owned rows: exact, at ``O(N_global)`` memory and traffic per rank.
    * Refused: a model with no ``MessagePassing`` layer (a GNN written with ``index_select`` /
      ``index_add`` runs on ShardTensor nodes directly, without this wrapper), a forward that
      runs none of its layers, a layer given a plain tensor or a node ShardTensor sharded unlike
      the graph, an ``edge_index`` other than ``graph.edge_index``.

    Input classification: ShardTensor arguments are node tensors (they must be sharded like the
    graph's nodes); ``graph.edge_index`` is the local edge list; a plain tensor is a node tensor
    when it has ``N_local`` rows on every rank, an edge tensor when it has ``E_local`` rows on
    every rank (both on every rank: by name, ``edge_*`` is an edge tensor), else it is passed on
    unchanged (and refused if it reaches a layer).

    Parameters
    ----------
    model:
        The module; not copied (its parameters are shared with the wrapper).
    graph:
        The sharded graph. ``graph.hops == 1``: one exchange per layer. ``hops = k > 1``: the
        model's node inputs are exchanged **once** and up to ``k`` layers run on the k-hop halo
        (more raises); between layers the node rows then include ghosts, so only row-wise ops are
        allowed on them (``BatchNorm``, pooling, ... raise: use ``hops=1`` for such models).
    global_degree:
        Layer types whose normalisation uses the source nodes' in-degree (``gcn_norm``). Their
        ghost sources get padding edges (into the ghosts, whose outputs are dropped) so the local
        degree is the global one: exact without changing the layer. Default ``(GCNConv,)``.

    **Communication:** per forward with plain tensor inputs, one ``all_reduce`` of 3 int64 per
    plain input (which of them are node / edge tensors, agreed). Per-layer mode: one
    ``all_to_all`` per message-passing call forward (node inputs fused) and one backward; k-hop
    mode: one per forward and one backward. A ``global_degree`` layer given an ``edge_weight``
    adds one ``all_to_all`` of the owned weighted degrees. A layer without ``edge_index``: one
    ``all_to_all`` gather per node input forward and one backward (reduce-scatter). Whatever
    the model does on ShardTensors between layers communicates as its rules say.
    """

    def __init__(
        self, model: torch.nn.Module, graph: ShardedGraph, *, global_degree: Iterable[type] = (GCNConv,)
    ) -> None:
        super().__init__()
        if not isinstance(graph, ShardedGraph):
            raise TypeError(f"graph must be a meshshard.ops.ShardedGraph (got {type(graph).__name__})")
        layers = _top_message_passing(model)
        if not layers:
            raise TypeError(
                f"DomainParallel wraps torch_geometric MessagePassing layers, and {type(model).__name__} has none; "
                "a GNN written with index_select / index_add runs on ShardTensor node features directly, "
                "without DomainParallel"
            )
        if any(getattr(layer, "_meshshard_wrapped", False) for layer in layers):
            raise RuntimeError(
                "DomainParallel: this model is already wrapped (its layers would exchange twice); "
                "call .remove() on the other wrapper or use .set_graph()"
            )
        self.model = model
        self.graph = graph
        self._trace_key = len(_TRACE_GROUPS)
        self._set_flag_device(graph)
        self.global_degree = tuple(global_degree)
        self._calls = 0
        self._handles = []
        for layer in layers:
            layer._meshshard_wrapped = True
            self._handles.append(layer.register_forward_pre_hook(self._pre_hook, with_kwargs=True))
            self._handles.append(layer.register_forward_hook(self._post_hook))

    def set_graph(self, graph: ShardedGraph) -> None:
        """Use another graph (e.g. the next sample's) with the same model."""
        if not isinstance(graph, ShardedGraph):
            raise TypeError(f"graph must be a meshshard.ops.ShardedGraph (got {type(graph).__name__})")
        self.graph = graph
        self._set_flag_device(graph)

    def _set_flag_device(self, graph: ShardedGraph) -> None:
        self._flag_device = _flag_device(graph)
        _TRACE_GROUPS[self._trace_key] = (graph.spec.group if graph.spec is not None else None, self._flag_device)

    def remove(self) -> None:
        """Detach the hooks: the model runs single-process again."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for layer in _top_message_passing(self.model):
            layer._meshshard_wrapped = False
            layer.__dict__.pop("_meshshard_gather", None)

    @property
    def _sharded(self) -> bool:
        return self.graph.spec is not None

    # -- forward --------------------------------------------------------------------------------
    @faults.layer
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._calls = 0
        if self._sharded:
            args, kwargs = self._model_inputs(args, kwargs)
        else:  # a single-process graph: the whole graph (no ghosts), plain tensors, nothing to guard
            args = tuple(local_of(a) for a in args)
            kwargs = {k: local_of(v) for k, v in kwargs.items()}
        out = self.model(*args, **kwargs)
        if self._calls == 0:
            raise RuntimeError(
                f"DomainParallel: the forward of {type(self.model).__name__} ran none of its MessagePassing "
                "layers, so nothing was made domain-parallel; call the wrapped layers in forward"
            )
        return _map_tensors(out, self._model_output) if self._sharded else out

    def _model_output(self, t: torch.Tensor) -> Any:
        """What the model returns: node guards (k-hop rows) -> owned ShardTensor, edge guards -> plain."""
        if isinstance(t, _RowLocal):
            kind = t._kind
            plain = _plain(t)
            if kind == "node":
                return self.graph.wrap(plain[: self.graph.num_owned])
            return plain
        return t

    def _model_inputs(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Classify the model's arguments (agreed across ranks) and wrap them (see the class doc)."""
        try:
            bound = inspect.signature(self.model.forward).bind(*args, **kwargs)
            items = list(bound.arguments.items())
        except TypeError:  # the model itself will say what is wrong with the call
            bound, items = None, [("", (args, kwargs))]
        kinds = self._input_kinds(self._plain_inputs(items))
        convert = self._converter(items, kinds)
        if bound is None:
            return _map_tensors(args, convert), _map_tensors(kwargs, convert)
        for name, value in items:
            bound.arguments[name] = _map_tensors(value, convert)
        return bound.args, bound.kwargs

    def _plain_inputs(self, items: list[tuple[str, Any]]) -> list[tuple[str, torch.Tensor]]:
        """The plain tensor arguments to classify, by name (ShardTensor arguments are checked here)."""
        plain: list[tuple[str, torch.Tensor]] = []

        def collect(name: str):
            def visit(t: torch.Tensor) -> torch.Tensor:
                if isinstance(t, ShardTensor):
                    self._check_node_spec(t, f"the model's argument {name!r}")
                elif not isinstance(t, (_RowLocal, ReplicatedTensor)) and t.dim() >= 1:
                    plain.append((name, t))
                return t

            return visit

        for name, value in items:
            _map_tensors(value, collect(name))
        return plain

    def _input_kinds(self, plain: list[tuple[str, torch.Tensor]]) -> dict[int, str]:
        """``{id(t): "node" | "edge" | "index"}`` for the plain inputs, from the verdict agreed by all ranks."""
        if tracing():
            return self._traced_kinds(plain)
        kinds = {}
        for (name, t), (node, edge, is_edges) in zip(plain, self._agree_kinds([t for _, t in plain])):
            if is_edges:
                kinds[id(t)] = "index"
            elif node and (not edge or not name.startswith("edge")):
                kinds[id(t)] = "node"
            elif edge:
                kinds[id(t)] = "edge"
        return kinds

    def _traced_kinds(self, plain: list[tuple[str, torch.Tensor]]) -> dict[int, str]:
        """Traced (``torch.compile``): the kinds decided on this rank, checked in the graph to be every rank's.

        The graph cannot branch on a collective's result, so each rank decides from its own rows:
        ``graph.edge_index`` itself is the index; ``N_local`` rows a node tensor, ``E_local`` rows an
        edge tensor, both (an empty rank, or equal counts) by the name (``edge_*``: edge tensor). One
        ``all_reduce`` in the graph (the one eager runs) compares the ranks' kinds; where they differ,
        every rank raises the same error at run time. The same agreement also runs once, eagerly, while
        tracing (one more ``all_reduce`` per compilation), so every rank raises then, also when one rank's
        trace would otherwise fail later while its peers wait in their graphs. Where they agree they are
        eager's verdict.
        """
        if not plain:
            return {}
        g = self.graph
        codes = []
        for name, t in plain:
            node, edge = t.shape[0] == g.num_owned, t.shape[0] == g.num_edges
            if t is g.edge_index:
                codes.append(3)
            elif node and edge:
                codes.append(2 if name.startswith("edge") else 1)
            else:
                codes.append(1 if node else 2 if edge else 0)
        _check_agreed(codes, [name for name, _ in plain], g.spec.as_traced().group, self._flag_device,
                      self._trace_key)
        return {id(t): _KIND_CODES[c] for (_, t), c in zip(plain, codes) if c}

    def _agree_kinds(self, tensors: list[torch.Tensor]) -> list[tuple[bool, bool, bool]]:
        """Per plain tensor: (node rows on every rank, edge rows on every rank, graph.edge_index on every rank)."""
        if not tensors:
            return []
        g = self.graph
        ei = g.edge_index
        flags = torch.tensor(
            [
                [
                    int(t.shape[0] == g.num_owned),
                    int(t.shape[0] == g.num_edges),
                    int(t.dim() == 2 and t.shape == ei.shape and t.data_ptr() == ei.data_ptr() and t.dtype == ei.dtype),
                ]
                for t in tensors
            ],
            dtype=torch.long,
            device=self._flag_device,
        )
        agreed = comm.all_reduce_min(flags, g.spec.group).cpu()
        return [tuple(bool(v) for v in row) for row in agreed.tolist()]

    def _converter(self, items: list[tuple[str, Any]], kinds: dict[int, str]) -> Callable[[torch.Tensor], Any]:
        """What each input becomes: node ShardTensors (k-hop: exchanged node guards, one fused exchange),
        edge and index guards."""
        g = self.graph
        k_hop = g.hops > 1
        node_inputs: list[torch.Tensor] = []

        def kind_of(t: torch.Tensor) -> str | None:
            return "node" if isinstance(t, ShardTensor) else kinds.get(id(t))

        if k_hop:
            for _, value in items:
                _map_tensors(value, lambda t: node_inputs.append(local_of(t)) if kind_of(t) == "node" else None)
        extended = iter(_fused_exchange(g, node_inputs)) if node_inputs else iter(())

        def convert(t: torch.Tensor) -> torch.Tensor:
            kind = kind_of(t)
            if kind == "node" and k_hop:
                return _RowLocal.make(next(extended), "node")
            if kind == "node":
                return t if isinstance(t, ShardTensor) else g.wrap(t)
            if kind in ("edge", "index"):
                return _RowLocal.make(t, kind)
            return t

        return convert

    def _check_node_spec(self, t: ShardTensor, where: str) -> None:
        spec = self.graph.spec.as_traced()
        if t.spec.dim != 0 or not t.spec.same_sharding(spec):
            raise ShardingError(
                f"DomainParallel: {where} is a ShardTensor sharded along dim {t.spec.dim} with sizes "
                f"{list(t.spec.sizes)}, but the graph's nodes are sharded along dim 0 with sizes {list(spec.sizes)}"
            )

    # -- layers ---------------------------------------------------------------------------------
    def _pre_hook(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        g = self.graph
        self._calls += 1
        if g.hops > 1 and self._calls > g.hops:
            raise RuntimeError(
                f"DomainParallel: the graph's halo covers {g.hops} message-passing layers per exchange, "
                f"but the model ran a layer number {self._calls}; build the graph with hops >= the depth"
            )
        name = type(module).__name__
        try:
            params = inspect.signature(module.forward).parameters
            bound = inspect.signature(module.forward).bind(*args, **kwargs)
        except TypeError:  # the layer's own call raises the same TypeError
            return args, kwargs
        gather = "edge_index" not in params
        module._meshshard_gather = gather
        if self._sharded:
            if gather and g.hops > 1:
                raise UnsupportedOpError(
                    f"DomainParallel: {name} takes no edge_index (it searches its own neighbours, e.g. a kNN in "
                    "feature space), which runs on all nodes and needs a graph with hops=1 (got hops="
                    f"{g.hops})"
                )
            self._layer_inputs(name, bound, gather)
        args, kwargs = bound.args, bound.kwargs
        if isinstance(module, self.global_degree) and not gather:
            args, kwargs = self._pad_degree(module, args, kwargs)
        return args, kwargs

    def _layer_inputs(self, name: str, bound: inspect.BoundArguments, gather: bool) -> None:
        """Replace a wrapped layer's ShardTensor / guard arguments by the plain rows it needs (in place)."""
        g = self.graph
        edges = bound.arguments.get("edge_index")
        if not gather and not (isinstance(edges, _RowLocal) and edges._kind == "index"):
            raise UnsupportedOpError(
                f"DomainParallel: {name}'s edge_index is not graph.edge_index (got {type(edges).__name__}); "
                "hand the graph's edge_index to the wrapper and on to the layers unchanged"
            )
        exchange: list[torch.Tensor] = []
        slots: list[tuple[str, int | None]] = []
        for arg, value in bound.arguments.items():
            where = f"{name}'s argument {arg!r}"
            pair = isinstance(value, (tuple, list)) and len(value) > 0
            for pos, v in enumerate(value) if pair else [(None, value)]:
                if isinstance(v, ShardTensor):
                    self._check_node_spec(v, where)
                    if gather:
                        new = v.full_tensor().to_plain()
                    elif g.hops > 1:
                        raise UnsupportedOpError(
                            f"DomainParallel: {where} is a ShardTensor, but with hops={g.hops} the node tensors "
                            "between layers hold ghost rows; pass the model's inputs through the wrapper"
                        )
                    elif arg in _NOT_NODE or arg.startswith("edge") or (pair and pos and pos > 0):
                        new = v.to_local()  # targets of a (source, target) pair, batch: the owned rows
                    else:
                        exchange.append(v.to_local())
                        slots.append((arg, pos))
                        continue
                elif isinstance(v, _RowLocal):
                    if gather:
                        raise UnsupportedOpError(
                            f"DomainParallel: {where} is a per-rank {_KIND_WORDS[v._kind]}, but {name} takes no "
                            "edge_index and runs on all nodes gathered on every rank; pass it node ShardTensors only"
                        )
                    new = _plain(v)
                elif isinstance(v, torch.Tensor) and v.dim() >= 1 and not isinstance(v, ReplicatedTensor):
                    raise UnsupportedOpError(
                        f"DomainParallel: {where} is a plain {v.dim()}-d tensor; DomainParallel cannot tell "
                        "whose rows it holds. Pass node tensors (ShardTensors, or N_local rows) and "
                        "per-edge tensors (E_local rows) through the wrapper's inputs, or compute them inside "
                        "the layer"
                    )
                else:
                    continue
                _put(bound, arg, pos, new)
        if exchange:
            for (arg, pos), ext in zip(slots, _fused_exchange(g, exchange)):
                _put(bound, arg, pos, ext)

    def _post_hook(self, module: torch.nn.Module, args: tuple, output: Any) -> Any:
        g = self.graph
        gather = getattr(module, "_meshshard_gather", False)
        if not self._sharded:
            return output
        name = type(module).__name__
        first, rest = (output[0], output[1:]) if isinstance(output, tuple) and output else (output, None)
        if not isinstance(first, torch.Tensor):
            raise UnsupportedOpError(
                f"DomainParallel: {name} returned {type(first).__name__}; a MessagePassing layer's output (or "
                "its first element) must be a node tensor"
            )
        if gather:
            spec = g.spec.as_traced()
            lo, hi = spec.offsets[spec.rank], spec.offsets[spec.rank + 1]
            rows = (spec.num_global, lo, hi)
        elif g.hops > 1:
            rows = (g.num_nodes, 0, g.num_nodes)
        else:
            rows = (g.num_nodes, 0, g.num_owned) if first.shape[0] == g.num_nodes else (g.num_owned, 0, g.num_owned)
        if first.dim() == 0 or first.shape[0] != rows[0]:
            raise ShardingError(
                f"[rank {g.plan.rank}] DomainParallel: {name} returned {tuple(first.shape[:1])} rows; expected "
                f"one per node of its input ({rows[0]})"
            )
        node = first[rows[1] : rows[2]]
        node = _RowLocal.make(node, "node") if g.hops > 1 else g.wrap(node)
        if rest is None:
            return node
        return (node, *_map_tensors(rest, lambda t: _RowLocal.make(t, "edge") if t.dim() >= 1 else t))


    def _pad_degree(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Add edges into the nodes whose local in-degree is short of the global one (ghost targets)."""
        g = self.graph
        bound = inspect.signature(module.forward).bind(*args, **kwargs)
        edge_index = bound.arguments.get("edge_index")
        if not isinstance(edge_index, torch.Tensor) or edge_index.shape[1] != g.num_edges:
            return args, kwargs  # not this graph's edges (e.g. a SparseTensor): left alone
        weight = bound.arguments.get("edge_weight")
        src, dst = edge_index
        loop = src == dst
        n = g.num_nodes
        incomplete = torch.bincount(dst, minlength=n) < g.in_degree.to(dst.device)
        target = incomplete.nonzero().flatten()
        if weight is None:
            if target.numel() == 0:
                return args, kwargs
            # counts: edges from row 0 for the missing other-node edges, self loops for the missing loops
            need_other = (g.in_degree - g.self_loops).to(dst.device)[target]
            have_other = torch.bincount(dst[~loop], minlength=n)[target]
            need_loop = g.self_loops.to(dst.device)[target]
            have_loop = torch.bincount(dst[loop], minlength=n)[target]
            other = torch.repeat_interleave(target, (need_other - have_other).clamp(min=0))
            loops = torch.repeat_interleave(target, (need_loop - have_loop).clamp(min=0))
            pad = torch.cat([torch.stack([torch.zeros_like(other), other]), torch.stack([loops, loops])], 1)
            bound.arguments["edge_index"] = torch.cat([edge_index, pad], 1)
            return bound.args, bound.kwargs
        # weighted: the owners' weighted in-degrees (other nodes, self loops) come with the halo;
        # every rank exchanges (a collective), even one with nothing to pad
        owned = dst < g.num_owned
        sums = torch.zeros(g.num_owned, 2, dtype=weight.dtype, device=weight.device)
        sums = sums.index_add(0, dst[owned], torch.stack([weight * ~loop, weight * loop], 1)[owned])
        need = g.exchange(sums)[target]
        have = torch.zeros(n, 2, dtype=weight.dtype, device=weight.device)
        have = have.index_add(0, dst, torch.stack([weight * ~loop, weight * loop], 1))[target]
        has_loop = g.self_loops.to(dst.device)[target] > 0
        loops = target[has_loop]
        pad = torch.cat([torch.stack([torch.zeros_like(target), target]), torch.stack([loops, loops])], 1)
        pad_w = torch.cat([need[:, 0] - have[:, 0], (need[:, 1] - have[:, 1])[has_loop]])
        bound.arguments["edge_index"] = torch.cat([edge_index, pad], 1)
        bound.arguments["edge_weight"] = torch.cat([weight, pad_w])
        return bound.args, bound.kwargs


def _flag_device(graph: ShardedGraph) -> torch.device:
    """Where the input-kind flags are agreed (looked up outside traced code: dynamo cannot query a group)."""
    return comm.group_device(graph.spec.group) if graph.spec is not None else torch.device("cpu")


_KIND_CODES = {1: "node", 2: "edge", 3: "index"}


def _kinds_message(names: list[str]) -> str:
    return (f"DomainParallel (compiled): the plain inputs {names} are not of one kind (node rows, edge rows, "
            "graph.edge_index) on every rank; compiled, each rank decides from its own rows and the name: a tensor "
            "with as many rows as nodes and edges on a rank (an empty rank) is an edge tensor only when its name "
            "starts with 'edge'. Pass node tensors as ShardTensors, name edge tensors edge_*, pass "
            "graph.edge_index itself")


def _kinds_agree(codes: list[int], group, device: torch.device) -> torch.Tensor:
    """Whether every rank decided the same input kinds ``codes`` (one ``all_reduce`` of ``(min, -max)``)."""
    mine = torch.tensor(codes, dtype=torch.long, device=device)
    both = comm.all_reduce_min(torch.stack([mine, -mine], 1), group)
    return (both[:, 0] == -both[:, 1]).all()


# (group, flag device) of each DomainParallel, by its ``_trace_key``: what _agreed_while_tracing needs,
# looked up outside traced code (a constant function's arguments must be constants)
_TRACE_GROUPS: dict[int, tuple[Any, torch.device]] = {}


@torch._dynamo.assume_constant_result
def _agreed_while_tracing(codes: tuple[int, ...], key: int) -> bool:
    """The kinds agreement run once, eagerly, while dynamo traces (every rank traces on the same call: the
    guards are decided from data identical on every rank). A rank whose own trace would fail later (e.g. a
    plain tensor reaching a layer) would otherwise leave its peers waiting in the in-graph check."""
    group, device = _TRACE_GROUPS[key]
    return bool(_kinds_agree(list(codes), group, device))


def _check_agreed(codes: list[int], names: list[str], group, device: torch.device, key: int) -> None:
    """Traced: every rank decided the same input kinds ``codes``. Checked once while tracing (every rank raises
    the same error then), and in the graph (one ``all_reduce``, the one eager runs; where they differ, every
    rank raises at run time, as all see the same agreed values)."""
    if not _agreed_while_tracing(tuple(codes), key):
        raise ShardingError(_kinds_message(names))
    torch._assert_async(_kinds_agree(codes, group, device), _kinds_message(names))


def _top_message_passing(model: torch.nn.Module) -> list[MessagePassing]:
    """``MessagePassing`` submodules not inside another one (the model itself included)."""
    found: list[MessagePassing] = []

    def visit(m: torch.nn.Module) -> None:
        if isinstance(m, MessagePassing):
            found.append(m)
            return
        for child in m.children():
            visit(child)

    visit(model)
    return found


def _fused_exchange(graph: ShardedGraph, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Exchange several node tensors with one ``all_to_all`` when they share a dtype."""
    if len(tensors) == 1 or len({t.dtype for t in tensors}) > 1:
        return [graph.exchange(t) for t in tensors]
    flat = [t.reshape(t.shape[0], math.prod(t.shape[1:])) for t in tensors]  # -1 fails on 0 rows
    ext = graph.exchange(torch.cat(flat, 1))
    out, col = [], 0
    for t, f in zip(tensors, flat):
        out.append(ext[:, col : col + f.shape[1]].reshape(ext.shape[0], *t.shape[1:]))
        col += f.shape[1]
    return out


def _map_tensors(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``fn`` applied to every tensor in nested tuples / lists / dicts (the structure kept)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    return value


def _put(bound: inspect.BoundArguments, arg: str, pos: int | None, new: torch.Tensor) -> None:
    if pos is None:
        bound.arguments[arg] = new
    else:
        old = bound.arguments[arg]
        bound.arguments[arg] = type(old)((*old[:pos], new, *old[pos + 1 :]))


def _plain(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a plain tensor alias (traced: ``view_as``, since dynamo cannot trace ``as_subclass(Tensor)``)."""
    return plain_alias(t)


# -- the guard on per-rank rows that are no sharding ------------------------------------------------

_KIND_WORDS = {
    "edge": "per-edge tensor",
    "index": "graph.edge_index",
    "node": "node tensor with ghost rows (hops > 1)",
}
_KIND_ADVICE = {
    "edge": "only row-wise ops are allowed on it between layers; reduce over edges inside a MessagePassing layer",
    "index": "hand it to the wrapped MessagePassing layers unchanged (edges computed outside a layer are not "
    "supported; for x[edge_index[0]] ... index_add GNNs use ShardTensor nodes without DomainParallel)",
    "node": "only row-wise ops are allowed between layers in k-hop mode; build the graph with hops=1 (node "
    "tensors between layers are then ShardTensors, and every op is exact or refused)",
}


class _RowLocal(torch.Tensor):
    """This rank's rows of a tensor that is no sharding of the nodes; only row-wise ops run on it.

    Row-wise ops (each output row a function of the same input row) are exact on any set of rows,
    so they may run on per-edge rows or on ``[owned; ghosts]``; anything else (a reduction over
    rows, a gather by row index, a random op) would see this rank's rows only and is refused. The
    decision reads only the op, argument types and dims, never the row counts: the same on
    every rank.
    """

    _kind: str = "edge"

    @staticmethod
    def make(t: torch.Tensor, kind: str) -> _RowLocal:
        with _no_subclass():
            out = t.as_subclass(_RowLocal)
        out._kind = kind
        return out

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _META or inspected_by_compiler():  # (the compiler fakeifying an input: its local metadata)
            with _no_subclass():
                return func(*args, **kwargs)
        kind = _row_kind(func, args, kwargs)
        with _no_subclass():
            out = func(*args, **kwargs)
        return _map_tensors(out, lambda t: cls.make(t, kind) if t.dim() >= 1 else t)


def _flat(value: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    _map_tensors(value, found.append)
    return found


def _ndim(t: torch.Tensor) -> int:
    with _no_subclass():
        return t.dim()


def _row_kind(func: Callable, args: tuple, kwargs: dict) -> str:
    """The kind of the guards among the operands, if ``func`` is row-wise on them; else raise."""
    flat = _flat((args, kwargs))
    guards = [t for t in flat if isinstance(t, _RowLocal)]
    kinds = sorted({t._kind for t in guards})
    name = op_name(func)
    if any(isinstance(t, ShardTensor) for t in flat):
        raise UnsupportedOpError(
            f"DomainParallel: {name} mixes a node ShardTensor with a {_KIND_WORDS[kinds[0]]}; their rows are "
            "not the same nodes"
        )
    if len(kinds) > 1:
        raise UnsupportedOpError(
            f"DomainParallel: {name} mixes a {_KIND_WORDS[kinds[0]]} with a {_KIND_WORDS[kinds[1]]}"
        )
    kind = kinds[0]
    check = _ROWWISE.get(func)
    if kind == "index" or check is None or not check(args, kwargs, flat, guards):
        raise UnsupportedOpError(
            f"DomainParallel: {name} on a {_KIND_WORDS[kind]} is not a row-wise op (this rank holds only its "
            f"own rows of it): {_KIND_ADVICE[kind]}"
        )
    return kind


def _elementwise(args, kwargs, flat, guards) -> bool:
    """Operands: guards of one ndim, plain tensors broadcast over the rows (fewer dims, or 1 row)."""
    nd = {_ndim(g) for g in guards}
    if len(nd) > 1:
        return False
    (ref,) = nd
    with _no_subclass():
        return all(
            isinstance(t, _RowLocal) or t.dim() < ref or (t.dim() == ref and t.shape[0] == 1) for t in flat
        )


def _arg(args: tuple, kwargs: dict, pos: int, name: str, default: Any = None) -> Any:
    if len(args) > pos:
        return args[pos]
    return kwargs.get(name, default)


def _first_is_input(args, kwargs, flat, guards) -> bool:
    """``linear(input, weight, bias)``-like: only the input is a guard (parameters are plain)."""
    return len(guards) == 1 and guards[0] is _arg(args, kwargs, 0, "input")


def _layer_norm(args, kwargs, flat, guards) -> bool:
    shape = _arg(args, kwargs, 1, "normalized_shape")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return _first_is_input(args, kwargs, flat, guards) and len(shape) < _ndim(guards[0])


def _along(pos: int, name: str, default: Any, *, new_dim: bool = False, many: bool = False):
    """Ops along a ``dim`` argument: row-wise when ``dim`` is given and is not the rows' dim 0."""

    def check(args, kwargs, flat, guards) -> bool:
        dim = _arg(args, kwargs, pos, name, default)
        if dim is None:
            return False
        nd = {_ndim(g) for g in guards}
        if len(nd) > 1:
            return False
        if many and len(guards) != len(flat):  # cat / stack of guards only
            return False
        if not many and not _elementwise(args, kwargs, flat, guards):
            return False
        width = nd.pop() + (1 if new_dim else 0)
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        return bool(dims) and all(isinstance(d, int) and d % width != 0 for d in dims)

    return check


def _getitem(args, kwargs, flat, guards) -> bool:
    """``x[:, ...]``: the rows kept whole (first index a full slice, or ``...`` before fewer indices)."""
    self, idx = args[0], args[1]
    if len(guards) != 1 or guards[0] is not self:
        return False
    idx = idx if isinstance(idx, tuple) else (idx,)
    if not idx:
        return False
    full = slice(None)
    if isinstance(idx[0], slice) and idx[0] == full:
        return True
    if idx[0] is Ellipsis:
        return sum(1 for i in idx[1:] if i is not None and i is not Ellipsis) < _ndim(self)
    return False


def _dropout(args, kwargs, flat, guards) -> bool:
    p = _arg(args, kwargs, 1, "p", 0.5)
    training = _arg(args, kwargs, 2, "training", True)
    return (not training or p == 0) and _elementwise(args, kwargs, flat, guards)


def _rowwise_table() -> dict[Callable, Callable]:
    T = torch.Tensor
    table: dict[Callable, Callable] = {}
    elementwise = [
        getattr(mod, n, None)
        for mod in (torch, T)
        for n in (
            "add sub subtract mul multiply div true_divide pow maximum minimum where clamp clamp_min clamp_max "
            "tanh sigmoid relu exp expm1 log log1p sin cos abs neg sqrt rsqrt square sign erf reciprocal "
            "add_ sub_ mul_ div_ relu_ tanh_ sigmoid_ clamp_ "
            "to float double half bfloat16 type_as contiguous clone detach "
            "__add__ __radd__ __iadd__ __sub__ __rsub__ __isub__ __mul__ __rmul__ __imul__ __truediv__ "
            "__rtruediv__ __itruediv__ __pow__ __rpow__ __neg__ __abs__"
        ).split()
    ]
    elementwise += [
        getattr(F, n)
        for n in (
            "relu relu6 silu gelu elu selu celu leaky_relu softplus mish hardswish hardtanh logsigmoid tanh sigmoid"
        ).split()
    ]
    for f in elementwise:
        if f is not None:
            table[f] = _elementwise
    table[F.linear] = _first_is_input
    table[F.layer_norm] = _layer_norm
    table[F.dropout] = _dropout
    table[T.__getitem__] = _getitem
    for f in (F.softmax, F.log_softmax, torch.softmax, torch.log_softmax, T.softmax, T.log_softmax):
        table[f] = _along(1, "dim", None)
    table[F.normalize] = _along(2, "dim", 1)
    for f in (torch.sum, T.sum, torch.mean, T.mean, torch.amax, T.amax, torch.amin, T.amin, torch.norm, T.norm):
        table[f] = _along(1, "dim", None)
    for f in (torch.chunk, T.chunk, torch.split, T.split):
        table[f] = _along(2, "dim", 0)
    for f in (torch.unsqueeze, T.unsqueeze):
        table[f] = _along(1, "dim", None, new_dim=True)
    table[torch.cat] = table[torch.concat] = _along(1, "dim", 0, many=True)
    table[torch.stack] = _along(1, "dim", 0, new_dim=True, many=True)
    return table


def _meta_set() -> frozenset:
    T = torch.Tensor
    out = []
    for name in (
        "shape dtype device requires_grad is_leaf grad_fn grad layout is_cuda ndim names _version output_nr "
        "retains_grad is_sparse is_quantized is_meta is_nested _backward_hooks"
    ).split():
        attr = getattr(torch._C.TensorBase, name, None)
        if hasattr(attr, "__get__"):
            out.append(attr.__get__)
    for name in (
        "size dim ndimension numel nelement __len__ element_size is_floating_point is_complex is_contiguous "
        "stride storage_offset data_ptr get_device __hash__ register_hook retain_grad requires_grad_ "
        "__repr__ __format__ __reduce_ex__ untyped_storage is_signed is_pinned has_names is_inference __dir__"
    ).split():
        if hasattr(T, name):
            out.append(getattr(T, name))
    out += [torch.is_tensor, torch.is_floating_point, torch.is_complex, torch.numel]
    return frozenset(out)


_ROWWISE = _rowwise_table()
_META = _meta_set()
