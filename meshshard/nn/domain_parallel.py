"""``DomainParallel``: run an unchanged PyG model on a graph split over ranks, exactly.

Every top-level ``torch_geometric.nn.MessagePassing`` submodule gets a forward pre-hook that
replaces its node inputs (``N_local`` rows) by ``[owned; ghosts]`` from the graph's halo, and a
forward hook that keeps the owned rows of its node output. Everything between the layers (MLPs,
activations, residuals, ``LayerNorm``) runs on the owned rows as plain local tensors. Since every
incoming edge of an owned node is local (:class:`~meshshard.ops.ShardedGraph`), each owned output
equals the single-process one; gradients flow back through the exchanges into the owners, and the
parameters' gradients are partial per rank (sum them with :func:`meshshard.nn.sync_gradients`).

Why hooks: PyG layers take ``(x, edge_index, ...)`` and size their output by ``x``; feeding them
the extended rows and the local ``edge_index`` is all they need, so no layer is re-implemented.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable
from typing import Any

import torch
from torch_geometric.nn import GCNConv, MessagePassing

from ..ops.graph import ShardedGraph
from ..tensor import local_of

__all__ = ["DomainParallel"]

#: Arguments never exchanged: edge-level inputs and sizes (by name).
_NOT_NODE = ("edge_index", "size", "batch", "ptr", "dim_size", "return_attention_weights")


class DomainParallel(torch.nn.Module):
    """Make a PyG model domain-parallel on a :class:`~meshshard.ops.ShardedGraph`.

    Call it like the model, with this rank's node tensors (``N_local`` rows, plain or ShardTensor),
    ``graph.edge_index`` and per-local-edge tensors (e.g. from ``graph.edge_vectors()``). Returns
    the model's output for the owned nodes (a ShardTensor sharded like the nodes when the graph
    is sharded, so a ``.mean()`` loss is the global mean).

    Rules the model must follow (those of any full-graph GNN): message passing only in
    ``MessagePassing`` layers; between them only row-wise ops (no ``BatchNorm`` over nodes, no
    global pooling: use ShardTensor reductions on the output). A layer's node inputs are its
    tensor arguments with ``N_local`` rows (a ``(x_src, x_dst)`` pair: ``x_src`` is exchanged) and
    not named ``edge_*``; its output (or the first element of a tuple output) is a node tensor.

    Parameters
    ----------
    model:
        The module; not copied (its parameters are shared with the wrapper).
    graph:
        The sharded graph. ``graph.hops == 1``: one exchange per layer. ``hops = k > 1``: the
        model's node inputs are exchanged **once** and up to ``k`` layers run on the k-hop halo
        (more raises).
    global_degree:
        Layer types whose normalisation uses the source nodes' in-degree (``gcn_norm``). Their
        ghost sources get padding edges (into the ghosts, whose outputs are dropped) so the local
        degree is the global one: exact without changing the layer. Default ``(GCNConv,)``.

    **Communication:** per-layer mode: one ``all_to_all`` per message-passing call forward (node
    inputs fused when they share a dtype) and one backward; k-hop mode: one per forward and one
    backward. A ``global_degree`` layer given an ``edge_weight`` adds one ``all_to_all`` of the
    owned weighted degrees (none with ``edge_weight=None``: ``graph.in_degree`` is used).
    """

    def __init__(
        self, model: torch.nn.Module, graph: ShardedGraph, *, global_degree: Iterable[type] = (GCNConv,)
    ) -> None:
        super().__init__()
        if not isinstance(graph, ShardedGraph):
            raise TypeError(f"graph must be a meshshard.ops.ShardedGraph (got {type(graph).__name__})")
        self.model = model
        self.graph = graph
        self.global_degree = tuple(global_degree)
        self._calls = 0
        self._handles = []
        layers = _top_message_passing(model)
        if any(getattr(layer, "_meshshard_wrapped", False) for layer in layers):
            raise RuntimeError(
                "DomainParallel: this model is already wrapped (its layers would exchange twice); "
                "call .remove() on the other wrapper or use .set_graph()"
            )
        for layer in layers:
            layer._meshshard_wrapped = True
            self._handles.append(layer.register_forward_pre_hook(self._pre_hook, with_kwargs=True))
            self._handles.append(layer.register_forward_hook(self._post_hook))

    def set_graph(self, graph: ShardedGraph) -> None:
        """Use another graph (e.g. the next sample's) with the same model."""
        if not isinstance(graph, ShardedGraph):
            raise TypeError(f"graph must be a meshshard.ops.ShardedGraph (got {type(graph).__name__})")
        self.graph = graph

    def remove(self) -> None:
        """Detach the hooks: the model runs single-process again."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for layer in _top_message_passing(self.model):
            layer._meshshard_wrapped = False

    # -- forward --------------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        g = self.graph
        args = tuple(local_of(a) for a in args)
        kwargs = {k: local_of(v) for k, v in kwargs.items()}
        self._calls = 0
        if g.hops > 1:
            args, kwargs = self._exchange_inputs(self.model.forward, args, kwargs)
        out = self.model(*args, **kwargs)
        out = self._owned(out, keep_tuple=True)
        if isinstance(out, torch.Tensor) and out.shape[:1] == (g.num_owned,):
            return g.wrap(out)
        return out

    def _exchange_inputs(self, fn: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Replace the node inputs of a call of ``fn`` by their extended rows (one fused exchange)."""
        g = self.graph
        try:
            bound = inspect.signature(fn).bind(*args, **kwargs)
        except TypeError:
            return args, kwargs
        slots: list[tuple[str, int | None, torch.Tensor]] = []
        for name, value in bound.arguments.items():
            if name in _NOT_NODE or name.startswith("edge"):
                continue
            if _is_node(value, g.num_owned):
                slots.append((name, None, value))
            elif isinstance(value, tuple) and value and _is_node(value[0], g.num_owned):
                slots.append((name, 0, value[0]))
        if not slots:
            return args, kwargs
        extended = _fused_exchange(g, [t for _, _, t in slots])
        for (name, pos, _), ext in zip(slots, extended):
            if pos is None:
                bound.arguments[name] = ext
            else:
                bound.arguments[name] = (ext, *bound.arguments[name][1:])
        return bound.args, bound.kwargs

    def _pre_hook(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        g = self.graph
        self._calls += 1
        if g.hops > 1:
            if self._calls > g.hops:
                raise RuntimeError(
                    f"DomainParallel: the graph's halo covers {g.hops} message-passing layers per exchange, "
                    f"but the model ran a layer number {self._calls}; build the graph with hops >= the depth"
                )
        else:
            args, kwargs = self._exchange_inputs(module.forward, args, kwargs)
        if isinstance(module, self.global_degree):
            args, kwargs = self._pad_degree(module, args, kwargs)
        return args, kwargs

    def _post_hook(self, module: torch.nn.Module, args: tuple, output: Any) -> Any:
        if self.graph.hops > 1:
            return output
        return self._owned(output, keep_tuple=True)

    def _owned(self, out: Any, keep_tuple: bool) -> Any:
        g = self.graph
        if g.num_nodes == g.num_owned:
            return out
        if isinstance(out, torch.Tensor) and out.shape[:1] == (g.num_nodes,):
            return out[: g.num_owned]
        if keep_tuple and isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
            if out[0].shape[:1] == (g.num_nodes,):
                return (out[0][: g.num_owned], *out[1:])
        return out

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



def _is_node(value: Any, n: int) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == n


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
