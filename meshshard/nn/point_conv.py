"""``PointConv``: a PointNet++-style point convolution over ball-query / kNN neighbourhoods."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import faults
from .._checks import check_choice
from ..ops.neighbors import Neighbors
from ..tensor import ShardTensor, local_of

__all__ = ["PointConv"]

_AGGRS = ("max", "mean")



class PointConv(torch.nn.Module):
    r"""Point convolution (PointNet++ set abstraction) over precomputed neighbourhoods.

    .. math::
        h_i = \operatorname{AGG}_{j \in \mathcal{N}(i)}
              \operatorname{MLP}\big([\,x_j,\; p_j - p_i\,]\big)

    with ``AGG`` the element-wise max or mean over the valid neighbours of query ``i`` (a query
    without neighbours gets zeros). Runs unchanged on plain tensors (one process) and on
    ShardTensors: the neighbours' features and positions come from ``nbr.plan.exchange``, so the
    result and every gradient equal the single-process ones for any partition.

    Parameters
    ----------
    in_channels:
        ``C``, point feature width (``0``: positions only, pass ``x=None``).
    out_channels:
        Output width.
    hidden_channels:
        Widths of the hidden layers of the edge MLP (Linear + ReLU each).
    aggr:
        ``"max"`` (PointNet++) or ``"mean"``.
    pos_dim:
        ``D``, coordinate dimension.

    **Shapes:** ``x`` ``(N_local, C)``, ``pos`` ``(N_local, D)``, ``query_pos`` ``(M_local, D)``
    -> ``(M_local, out_channels)`` (a ShardTensor sharded like the queries when the inputs are).

    **Communication:** one ``all_to_all`` forward (features and positions fused when they share a
    dtype; ``N_send * (C + D)`` elements sent by this rank) and one backward; none on plain tensors.
    Parameters get partial gradients: call :func:`meshshard.nn.sync_gradients` after backward.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        hidden_channels: Sequence[int] = (64,),
        aggr: str = "max",
        pos_dim: int = 3,
    ) -> None:
        super().__init__()
        for name, value in (
            ("in_channels", in_channels),
            ("out_channels", out_channels),
            ("pos_dim", pos_dim),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int (got {type(value).__name__})")
        if in_channels < 0 or out_channels < 1 or pos_dim < 1:
            raise ValueError(
                "in_channels must be >= 0, out_channels and pos_dim >= 1 "
                f"(got {in_channels}, {out_channels}, {pos_dim})"
            )
        check_choice(aggr, "aggr", _AGGRS)
        self.in_channels, self.out_channels, self.pos_dim, self.aggr = (
            in_channels,
            out_channels,
            pos_dim,
            aggr,
        )
        widths = [in_channels + pos_dim, *hidden_channels]
        layers: list[torch.nn.Module] = []
        for a, b in zip(widths[:-1], widths[1:]):
            layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
        layers.append(torch.nn.Linear(widths[-1], out_channels))
        self.mlp = torch.nn.Sequential(*layers)

    @faults.layer
    def forward(
        self,
        x: torch.Tensor | None,
        pos: torch.Tensor,
        nbr: Neighbors,
        query_pos: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Convolve; ``query_pos`` defaults to ``pos`` (queries are the points)."""
        if not isinstance(nbr, Neighbors):
            raise TypeError(f"nbr must be a meshshard.ops.Neighbors (got {type(nbr).__name__})")
        x_local, pos_local = local_of(x), local_of(pos)
        q_local = pos_local if query_pos is None else local_of(query_pos)
        if (x_local is None) != (self.in_channels == 0):
            raise ValueError(
                f"x must be None exactly when in_channels is 0 (in_channels={self.in_channels}, "
                f"got x={'None' if x_local is None else tuple(x_local.shape)})"
            )
        if pos_local.dim() != 2 or pos_local.shape[1] != self.pos_dim:
            raise ValueError(f"pos must have shape (N_local, {self.pos_dim}) (got {tuple(pos_local.shape)})")
        if q_local.shape[0] != nbr.num_queries:
            raise ValueError(
                f"query_pos must have one row per query of nbr ({nbr.num_queries}) (got {q_local.shape[0]}); "
                "pass query_pos when the queries are not the points"
            )
        plan = nbr.plan
        if x_local is not None and x_local.dtype == pos_local.dtype:
            ext = plan.exchange(torch.cat([x_local, pos_local], 1))
            ext_x, ext_pos = ext[:, : self.in_channels], ext[:, self.in_channels :]
        else:
            ext_pos = plan.exchange(pos_local)
            ext_x = None if x_local is None else plan.exchange(x_local)
        valid = nbr.index >= 0
        idx = nbr.index.clamp(min=0)
        rel = ext_pos[idx] - q_local[:, None, :]  # (M, K, D)
        edge_in = rel if ext_x is None else torch.cat([ext_x[idx], rel], -1)
        h = self.mlp(edge_in)  # (M, K, out)
        mask = valid[..., None]
        if self.aggr == "max":
            out = h.masked_fill(~mask, -torch.inf).amax(1)
            out = torch.where((nbr.count > 0)[:, None], out, torch.zeros_like(out))
        else:
            out = (h * mask).sum(1) / nbr.count.clamp(min=1)[:, None].to(h.dtype)
        spec = nbr.query_spec
        if spec is None:
            return out
        return ShardTensor.from_local(
            out, spec.mesh, sizes=spec.sizes, mesh_dim=spec.mesh_dim, validate=False
        )

    def extra_repr(self) -> str:
        return f"in_channels={self.in_channels}, out_channels={self.out_channels}, aggr={self.aggr!r}"
