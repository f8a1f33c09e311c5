"""MeshGraphNet (Pfaff et al., 2021): encode-process-decode on a mesh or point graph.

An ordinary PyG model: it runs on one process as is, and domain-parallel under
:class:`~meshshard.nn.DomainParallel` on a :class:`~meshshard.ops.ShardedGraph` (each processor
block is one ``MessagePassing`` call, so one halo exchange per block).
"""

from __future__ import annotations

import torch
from torch_geometric.nn import MessagePassing

from .._checks import check_positive_int

__all__ = ["MeshGraphNet", "MeshGraphNetBlock", "mlp"]


def mlp(in_dim: int, hidden: int, out_dim: int, layers: int = 2, norm: bool = True) -> torch.nn.Sequential:
    """``layers`` Linear layers with SiLU between them, then ``LayerNorm`` when ``norm``."""
    check_positive_int(layers, "layers")
    widths = [in_dim] + [hidden] * (layers - 1) + [out_dim]
    mods: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        mods.append(torch.nn.Linear(a, b))
        if i < layers - 1:
            mods.append(torch.nn.SiLU())
    if norm:
        mods.append(torch.nn.LayerNorm(out_dim))
    return torch.nn.Sequential(*mods)


class MeshGraphNetBlock(MessagePassing):
    r"""One processor block: edge update, sum aggregation, node update, residuals.

    .. math::
        e'_{ij} = e_{ij} + \mathrm{MLP}_e([x_i, x_j, e_{ij}]), \qquad
        x'_i = x_i + \mathrm{MLP}_v\big([x_i, \textstyle\sum_{j} e'_{ij}]\big)

    **Shapes:** ``x`` ``(N, C)``, ``edge_index`` ``(2, E)`` (row 0 source ``j``, row 1 target
    ``i``), ``edge_attr`` ``(E, C)`` -> ``(x' (N, C), e' (E, C))``.
    """

    def __init__(self, hidden: int, mlp_layers: int = 2) -> None:
        super().__init__(aggr="add")
        self.hidden = check_positive_int(hidden, "hidden")
        check_positive_int(mlp_layers, "mlp_layers")
        self.edge_mlp = mlp(3 * hidden, hidden, hidden, mlp_layers)
        self.node_mlp = mlp(2 * hidden, hidden, hidden, mlp_layers)

    def forward(
        self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        src, dst = edge_index
        e = edge_attr + self.edge_mlp(torch.cat([x[dst], x[src], edge_attr], -1))
        agg = self.propagate(edge_index, e=e, size=(x.shape[0], x.shape[0]))
        return x + self.node_mlp(torch.cat([x, agg], -1)), e

    def message(self, e: torch.Tensor) -> torch.Tensor:
        return e


class MeshGraphNet(torch.nn.Module):
    """Encoder (node and edge MLPs), ``num_layers`` processor blocks, decoder MLP.

    Parameters
    ----------
    node_in, edge_in, out_dim:
        Input node / edge feature widths, output width per node.
    hidden:
        Latent width.
    num_layers:
        Processor blocks (message-passing steps).
    mlp_layers:
        Linear layers per MLP.

    **Shapes:** ``x`` ``(N, node_in)``, ``edge_index`` ``(2, E)``, ``edge_attr`` ``(E, edge_in)`` ->
    ``(N, out_dim)``.

    **Communication:** none itself; under :class:`DomainParallel` one halo exchange per block.
    """

    def __init__(
        self, node_in: int, edge_in: int, out_dim: int, hidden: int = 64, num_layers: int = 4, mlp_layers: int = 2
    ) -> None:
        super().__init__()
        for name, v in (
            ("node_in", node_in),
            ("edge_in", edge_in),
            ("out_dim", out_dim),
            ("hidden", hidden),
            ("num_layers", num_layers),
            ("mlp_layers", mlp_layers),
        ):
            check_positive_int(v, name)
        self.node_encoder = mlp(node_in, hidden, hidden, mlp_layers)
        self.edge_encoder = mlp(edge_in, hidden, hidden, mlp_layers)
        self.blocks = torch.nn.ModuleList(MeshGraphNetBlock(hidden, mlp_layers) for _ in range(num_layers))
        self.decoder = mlp(hidden, hidden, out_dim, mlp_layers, norm=False)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor) -> torch.Tensor:
        h = self.node_encoder(x)
        e = self.edge_encoder(edge_attr)
        for block in self.blocks:
            h, e = block(h, edge_index, e)
        return self.decoder(h)
