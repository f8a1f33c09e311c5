"""``DrivaerMLDataset``: samples of a preprocessed store, whole or as this rank's shard."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.device_mesh import DeviceMesh

from .._checks import check_positive_int
from .._sizes import offsets_of
from ._preprocess import load_meta
from ._store import NpyHeader, live_dir, read_npy_header, read_rows

__all__ = ["DrivaerMLDataset", "GEOMETRY"]

#: Stored arrays that describe geometry; ``normalize=True`` leaves them as they are.
GEOMETRY = ("pos", "normals", "areas")


def proportional_counts(total: int, sizes: Sequence[int]) -> list[int]:
    """Split ``total`` over parts in proportion to ``sizes`` (largest remainder, ties to lower rank).

    Every rank computes the same counts from the same sizes: no communication.
    """
    n = sum(sizes)
    if total >= n:
        return list(sizes)
    exact = [total * s / n for s in sizes]
    counts = [int(e) for e in exact]
    order = sorted(range(len(sizes)), key=lambda r: (-(exact[r] - counts[r]), r))
    for r in order[: total - sum(counts)]:
        counts[r] += 1
    return counts


class DrivaerMLDataset(torch.utils.data.Dataset):
    """Samples of a store written by :func:`~meshshard.datasets.preprocess`.

    **Single process** (no mesh): ``ds[k]`` is a whole run as a dict of tensors (``"pos"``,
    ``"normals"``, ``"areas"`` and the fields for the surface; ``"pos"``, ``"sdf"`` and the fields
    for the volume), in store order, plus ``"run"``; with ``as_pyg=True`` a
    ``torch_geometric.data.Data`` with the same attributes.

    **Under a device mesh** of ``P`` ranks on its last (domain) axis: ``ds[k]`` holds this rank's
    shard of every array as a :class:`~meshshard.ShardTensor` built with the store's sizes for
    ``P``. Rank ``r`` reads only the rows ``[offset_r, offset_r + size_r)`` of each array (one
    contiguous byte range per array, read straight into the tensor: ``size_r`` rows times the row
    bytes; :attr:`bytes_read` counts them).

    Samples differ in size, so wrap it in a ``DataLoader`` with ``batch_size=None`` (one sample
    per step, as the DrivaerML recipes do) or your own collate function.

    **Communication:** none. Every rank derives the sizes, and the subsample counts, from
    ``meta.json``.

    Parameters
    ----------
    store:
        The store folder.
    split:
        ``"train"``, ``"val"`` or ``"test"`` (runs recorded in the store), or ``"all"``.
    kind:
        ``"surface"`` or ``"volume"``.
    fields:
        Stored arrays to return (default: all); ``"pos"`` is always returned.
    mesh:
        A ``DeviceMesh``; ``"auto"`` (default) uses :func:`meshshard.init_mesh` when
        ``torch.distributed`` is initialised, else returns whole samples; ``None``: whole samples.
        On a 2-D ``(dp, domain)`` mesh, shards split over the domain axis; give each data-parallel
        group different indices (e.g. a ``DistributedSampler`` over the dp axis).
    num_points:
        Random subsample of this many points per sample (over all ranks: rank ``r`` keeps
        ``num_points * size_r / N`` of its rows, largest remainder). Drawn from
        ``(seed, epoch, run, rank)``; call :meth:`set_epoch` to draw new points each epoch.
    normalize:
        Return fields (not ``pos``, ``normals``, ``areas``) as ``(x - mean) / std`` with the
        training statistics of the store (see :attr:`stats`, :meth:`denormalize`).
    as_pyg:
        Return ``torch_geometric.data.Data`` (single process only).
    return_index:
        Add ``"index"``: the original VTK cell id of every returned point (int64).

    Examples
    --------
    >>> ds = DrivaerMLDataset("store", split="train", mesh=None)        # doctest: +SKIP
    >>> sample = ds[0]; sample["pos"].shape, sample["pMeanTrim"].shape  # doctest: +SKIP
    (torch.Size([20020, 3]), torch.Size([20020]))

    Not run as a doctest: it needs a preprocessed store (``meshshard preprocess``).
    """

    def __init__(
        self,
        store: str | os.PathLike[str],
        split: str = "train",
        kind: str = "surface",
        fields: Sequence[str] | None = None,
        mesh: DeviceMesh | str | None = "auto",
        num_points: int | None = None,
        seed: int = 0,
        normalize: bool = False,
        as_pyg: bool = False,
        return_index: bool = False,
    ) -> None:
        self.store = Path(store)
        self.meta = load_meta(self.store)
        if kind not in self.meta["kinds"]:
            raise ValueError(f"kind must be one of {self.meta['kinds']} for this store (got {kind!r})")
        splits = self.meta["splits"]
        if split == "all":
            self.runs = sorted(r for runs in splits.values() for r in runs)
        elif split in splits:
            self.runs = list(splits[split])
        else:
            raise ValueError(f"split must be one of {sorted(splits)} or 'all' (got {split!r})")
        stored = list(self.meta["fields"][kind])
        if fields is None:
            names = stored
        else:
            if isinstance(fields, str):
                raise TypeError("fields must be a sequence of names (got str)")
            missing = [f for f in fields if f not in stored]
            if missing:
                raise ValueError(f"fields {missing} are not in the store's {kind} arrays {stored}")
            names = ["pos", *(f for f in fields if f != "pos")]
        self.kind = kind
        self.fields = names
        self.num_points = check_positive_int(num_points, "num_points", allow_none=True)
        self.seed = seed
        self.normalize = normalize
        self.return_index = return_index
        self.epoch = 0
        #: Bytes of array data this dataset object has read from disk (headers excluded).
        self.bytes_read = 0
        self.mesh = self._resolve_mesh(mesh)
        if self.mesh is not None and as_pyg:
            raise ValueError("as_pyg=True returns whole samples; use it without a device mesh (mesh=None)")
        self.as_pyg = as_pyg
        if self.mesh is not None:
            axis = self.mesh.ndim - 1
            self.num_parts = self.mesh.size(axis)
            self.rank = self.mesh.get_local_rank(axis)
        else:
            self.num_parts, self.rank = 1, 0
        if str(self.num_parts) not in self.meta["order_of"]:
            raise ValueError(
                f"store has no partition for P={self.num_parts} (the mesh size); it serves "
                f"P in {sorted(int(p) for p in self.meta['order_of'])}: preprocess again with "
                f"--parts {self.num_parts}"
            )
        self._order = self.meta["order_of"][str(self.num_parts)]
        self._headers: dict[Path, NpyHeader] = {}

    @staticmethod
    def _resolve_mesh(mesh: DeviceMesh | str | None) -> DeviceMesh | None:
        if isinstance(mesh, str):
            if mesh != "auto":
                raise ValueError(f"mesh must be a DeviceMesh, None or 'auto' (got {mesh!r})")
            from meshshard.comm import group_rank_and_size

            if group_rank_and_size() is None:  # no process group
                return None
            from meshshard.device_mesh import init_mesh

            return init_mesh()
        if mesh is not None:
            if not isinstance(mesh, DeviceMesh):
                raise TypeError(f"mesh must be a DeviceMesh, None or 'auto' (got {type(mesh).__name__})")
        return mesh

    def __len__(self) -> int:
        return len(self.runs)

    def __repr__(self) -> str:
        return (
            f"DrivaerMLDataset(store={str(self.store)!r}, kind={self.kind!r}, runs={len(self.runs)}, "
            f"P={self.num_parts}, rank={self.rank})"
        )

    def set_epoch(self, epoch: int) -> None:
        """Draw a different subsample (``num_points``) in each epoch."""
        self.epoch = int(epoch)

    @property
    def stats(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Training-set ``(mean, std)`` per stored array (float32, per component)."""
        out = {}
        for name, s in self.meta["stats"][self.kind].items():
            out[name] = (torch.tensor(s["mean"]).float(), torch.tensor(s["std"]).float())
        return out

    def denormalize(self, name: str, values: torch.Tensor) -> torch.Tensor:
        """Undo ``normalize=True`` for array ``name``: ``values * std + mean``."""
        mean, std = self._mean_std(name)
        return values * std.to(values.device) + mean.to(values.device)

    def _mean_std(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        stats = self.meta["stats"][self.kind]
        if name not in stats:
            raise ValueError(f"no statistics for {name!r} (the store has {sorted(stats)}; no training runs?)")
        mean = torch.tensor(stats[name]["mean"], dtype=torch.float32)
        std = torch.tensor(stats[name]["std"], dtype=torch.float32)
        std = torch.where(std > 0, std, torch.ones_like(std))
        shape = self.meta["fields"][self.kind][name]["shape"]
        return mean.reshape(shape), std.reshape(shape)

    def sizes(self, index: int) -> list[int]:
        """Every rank's number of points of sample ``index`` for this dataset's ``P``, before subsampling."""
        return list(self.meta["runs"][str(self.runs[index])][self.kind]["sizes"][str(self.num_parts)])

    def _read(self, path: Path, start: int, stop: int) -> np.ndarray:
        header = self._headers.get(path)
        if header is None:
            header = self._headers[path] = read_npy_header(path)
        rows = read_rows(path, start, stop, header)
        self.bytes_read += rows.nbytes
        return rows

    def _subsample(self, run: int, sizes: list[int]) -> tuple[torch.Tensor | None, list[int]]:
        if self.num_points is None or self.num_points >= sum(sizes):
            return None, sizes
        counts = proportional_counts(self.num_points, sizes)
        state = np.random.SeedSequence([self.seed, self.epoch, run, self.rank]).generate_state(2)
        gen = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
        local = torch.randperm(sizes[self.rank], generator=gen)[: counts[self.rank]]
        return torch.sort(local).values, counts

    def __getitem__(self, index: int) -> Any:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"index must be an int (got {type(index).__name__})")
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples")
        run = self.runs[index]
        sizes = self.sizes(index)
        start = offsets_of(sizes)[self.rank]
        stop = start + sizes[self.rank]
        folder = live_dir(self.store / "runs" / f"run_{run}") / self.kind / self._order
        names = list(self.fields) + (["perm"] if self.return_index else [])
        pick, out_sizes = self._subsample(run, sizes)
        tensors: dict[str, torch.Tensor] = {}
        for name in names:
            values = torch.from_numpy(self._read(folder / f"{name}.npy", start, stop))
            if pick is not None:
                values = values[pick]
            if self.normalize and name not in GEOMETRY and name != "perm":
                mean, std = self._mean_std(name)
                values = (values - mean) / std
            tensors["index" if name == "perm" else name] = values
        if self.mesh is not None:
            from meshshard.tensor import ShardTensor

            tensors = {k: ShardTensor.from_local(v, self.mesh, sizes=out_sizes, dim=0) for k, v in tensors.items()}
        if self.as_pyg:
            from torch_geometric.data import Data

            return Data(**tensors, run=run)
        return {"run": run, **tensors}
