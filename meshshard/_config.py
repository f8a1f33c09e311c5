"""Choices and defaults shared across layers: the partition methods, and the Transolver's hyper-parameters.

``TransolverConfig`` is public as ``meshshard.nn.TransolverConfig``. Standard library only: the
``meshshard`` command shows these choices and defaults in ``--help`` without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._checks import check_positive_int

__all__ = ["PARTITION_METHODS", "TransolverConfig"]

#: The geometric partitioners, by name (:func:`meshshard.partition.partition`'s ``method``).
PARTITION_METHODS = ("rcb", "morton", "hilbert")


@dataclass(frozen=True)
class TransolverConfig:
    """A :class:`~meshshard.nn.Transolver`'s hyper-parameters; the defaults are the authors' ShapeNet-Car model.

    ``Transolver``'s keyword defaults, :class:`meshshard.training.TrainConfig`,
    :func:`meshshard.planning.plan` and the ``meshshard train`` / ``meshshard plan`` options all take
    their defaults from here. ``Transolver(in_dim, out_dim, **dataclasses.asdict(config))`` builds one.

    Attributes
    ----------
    n_hidden, n_layers, n_head, slice_num, mlp_ratio:
        Width ``C``, depth ``L``, heads ``H`` (``C % H == 0``), slices ``M``, MLP width ratio.
    """

    n_hidden: int = 256
    n_layers: int = 8
    n_head: int = 8
    slice_num: int = 32
    mlp_ratio: int = 2

    def __post_init__(self) -> None:
        for name in ("n_hidden", "n_layers", "n_head", "slice_num", "mlp_ratio"):
            check_positive_int(getattr(self, name), name)
        if self.n_hidden % self.n_head:
            raise ValueError(
                f"n_hidden must be divisible by n_head (got n_hidden={self.n_hidden}, n_head={self.n_head})"
            )
