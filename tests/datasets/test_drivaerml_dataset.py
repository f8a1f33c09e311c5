from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from meshshard.datasets import DrivaerMLDataset, load_meta
from meshshard.datasets._store import read_npy_header
from meshshard.testing import run_distributed

COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
    "broadcast_object_list", "all_to_all", "all_to_all_single", "reduce_scatter_tensor", "barrier",
    "send", "recv", "isend", "irecv", "gather", "scatter", "reduce",
)  # fmt: skip


def _stored(store: Path, run: int, kind: str, order: str, name: str) -> np.ndarray:
    return np.load(store / "runs" / f"run_{run}" / kind / order / f"{name}.npy")


def test_whole_samples(tiny_store: Path) -> None:
    ds = DrivaerMLDataset(tiny_store, split="all", mesh=None, return_index=True)
    assert len(ds) == 3 and ds.runs == [1, 2, 3] and ds.num_parts == 1
    sample = ds[1]
    assert sample["run"] == 2
    assert set(sample) == {
        "run",
        "index",
        "pos",
        "normals",
        "areas",
        "pMeanTrim",
        "CpMeanTrim",
        "wallShearStressMeanTrim",
    }
    for name in ("pos", "wallShearStressMeanTrim", "pMeanTrim"):
        np.testing.assert_array_equal(sample[name].numpy(), _stored(tiny_store, 2, "surface", "p4", name))
    assert torch.equal(sample["index"], torch.from_numpy(_stored(tiny_store, 2, "surface", "p4", "perm")))
    assert sample["pos"].dtype == torch.float32 and sample["index"].dtype == torch.int64
    full = sum(v.nbytes for k, v in sample.items() if k != "run")
    assert ds.bytes_read == full


def test_splits_kinds_and_fields(tiny_store: Path) -> None:
    meta = load_meta(tiny_store)
    train = DrivaerMLDataset(tiny_store, split="train", mesh=None)
    assert train.runs == meta["splits"]["train"]
    vol = DrivaerMLDataset(tiny_store, split="all", kind="volume", fields=["sdf"], mesh=None)
    assert set(vol[0]) == {"run", "pos", "sdf"}
    with pytest.raises(ValueError, match=r"split must be one of \['test', 'train', 'val'\] or 'all' \(got 'dev'\)"):
        DrivaerMLDataset(tiny_store, split="dev", mesh=None)
    with pytest.raises(ValueError, match=r"kind must be one of \['surface', 'volume'\] for this store \(got 'wake'\)"):
        DrivaerMLDataset(tiny_store, kind="wake", mesh=None)
    with pytest.raises(ValueError, match=r"fields \['UMeanTrim'\] are not in the store's surface arrays"):
        DrivaerMLDataset(tiny_store, fields=["UMeanTrim"], mesh=None)
    with pytest.raises(ValueError, match="num_points must be at least 1"):
        DrivaerMLDataset(tiny_store, num_points=0, mesh=None)
    with pytest.raises(TypeError, match="mesh must be a DeviceMesh, None or 'auto' \\(got int\\)"):
        DrivaerMLDataset(tiny_store, mesh=3)
    with pytest.raises(IndexError, match="index 5 out of range for 3 samples"):
        DrivaerMLDataset(tiny_store, split="all", mesh=None)[5]


def test_auto_mesh_without_process_group_gives_whole_samples(tiny_store: Path) -> None:
    ds = DrivaerMLDataset(tiny_store, split="all")
    assert ds.mesh is None and isinstance(ds[0]["pos"], torch.Tensor)


def test_normalize_round_trip(tiny_store: Path) -> None:
    raw = DrivaerMLDataset(tiny_store, split="train", mesh=None)
    norm = DrivaerMLDataset(tiny_store, split="train", mesh=None, normalize=True)
    a, b = raw[0], norm[0]
    assert torch.equal(a["pos"], b["pos"]) and torch.equal(a["normals"], b["normals"])
    mean, std = raw.stats["wallShearStressMeanTrim"]
    assert mean.shape == (3,)
    torch.testing.assert_close(b["wallShearStressMeanTrim"], (a["wallShearStressMeanTrim"] - mean) / std)
    torch.testing.assert_close(norm.denormalize("pMeanTrim", b["pMeanTrim"]), a["pMeanTrim"], rtol=1e-5, atol=1e-3)
    if len(raw) == 1:  # over the training runs, a normalised field has mean 0 and std 1
        torch.testing.assert_close(b["pMeanTrim"].double().mean(), torch.tensor(0.0).double(), atol=1e-5, rtol=0)


def test_subsampling_is_seeded_per_epoch(tiny_store: Path) -> None:
    ds = DrivaerMLDataset(tiny_store, split="all", mesh=None, num_points=500, return_index=True)
    first = ds[0]
    assert first["pos"].shape == (500, 3) and first["pMeanTrim"].shape == (500,)
    again = ds[0]
    assert torch.equal(first["index"], again["index"])
    ds.set_epoch(1)
    other = ds[0]
    assert not torch.equal(first["index"], other["index"])
    whole = DrivaerMLDataset(tiny_store, split="all", mesh=None, return_index=True)[0]
    rows = {int(i): k for k, i in enumerate(whole["index"])}
    picked = torch.tensor([rows[int(i)] for i in other["index"]])
    assert len(set(picked.tolist())) == 500
    assert torch.equal(other["pos"], whole["pos"][picked])  # fields stay aligned with positions
    big = DrivaerMLDataset(tiny_store, split="all", mesh=None, num_points=10**9)[0]
    assert big["pos"].shape == whole["pos"].shape


def test_as_pyg(tiny_store: Path) -> None:
    data = DrivaerMLDataset(tiny_store, split="all", mesh=None, as_pyg=True)[0]
    assert isinstance(data, Data)
    assert data.pos.shape[1] == 3 and data.pMeanTrim.shape == (data.num_nodes,) and data.run == 1


# ------------------------------------------------------------------ distributed: rank-local reads
def _rank_local_sample(store: str, kind: str, num_points: int | None) -> dict[str, Any]:
    import torch.distributed as dist

    from meshshard.comm import CommCounter
    from meshshard.datasets import _store
    from meshshard.device_mesh import init_mesh

    mesh = init_mesh()
    reads: list[tuple[str, int, int]] = []
    real_pread = _store._pread

    def spy(fd: int, buffer: memoryview, offset: int) -> int:
        reads.append((os.readlink(f"/proc/self/fd/{fd}"), len(buffer), offset))
        return real_pread(fd, buffer, offset)

    calls: Counter = Counter()
    originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}

    def counting(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    _store._pread = spy
    for name, fn in originals.items():
        setattr(dist, name, counting(name, fn))
    try:
        with CommCounter() as cc:
            ds = DrivaerMLDataset(store, split="all", kind=kind, mesh=mesh, num_points=num_points, return_index=True)
            sample = ds[0]
    finally:
        _store._pread = real_pread
        for name, fn in originals.items():
            setattr(dist, name, fn)
    auto = DrivaerMLDataset(store, split="all", kind=kind)  # mesh="auto" under a process group
    full_pos = sample["pos"].full_tensor()  # communication allowed from here on
    return {
        "reads": reads,
        "bytes_read": ds.bytes_read,
        "sizes": ds.sizes(0),
        "shard_sizes": list(sample["pos"].sharding_sizes),
        "local": {k: v.to_local().numpy() for k, v in sample.items() if k != "run"},
        "types": {type(v).__name__ for k, v in sample.items() if k != "run"},
        "collectives": sum(calls.values()) + cc.total,
        "auto_parts": auto.num_parts,
        "full_pos": full_pos.numpy(),
    }


@pytest.mark.parametrize(("world", "kind"), [(2, "surface"), (3, "volume")])
def test_rank_reads_only_its_slice(tiny_store: Path, world: int, kind: str) -> None:
    results = run_distributed(_rank_local_sample, world, str(tiny_store), kind, None)
    meta = load_meta(tiny_store)
    order = meta["order_of"][str(world)]
    folder = tiny_store / "runs" / "run_1" / kind / order
    sizes = meta["runs"]["1"][kind]["sizes"][str(world)]
    offsets = np.cumsum([0, *sizes])
    total_bytes = sum(p.stat().st_size for p in folder.glob("*.npy"))
    for rank, res in enumerate(results):
        assert res["types"] == {"ShardTensor"} and res["collectives"] == 0
        assert res["sizes"] == res["shard_sizes"] == sizes and res["auto_parts"] == world
        expected = 0
        per_file: dict[str, list[tuple[int, int]]] = {}
        for path, nbytes, offset in res["reads"]:
            per_file.setdefault(Path(path).name, []).append((offset, offset + nbytes))
        assert set(per_file) == {f"{k}.npy" for k in res["local"] if k != "index"} | {"perm.npy"}
        for name, ranges in per_file.items():
            header = read_npy_header(folder / name)
            lo = header.data_offset + offsets[rank] * header.row_bytes
            hi = header.data_offset + offsets[rank + 1] * header.row_bytes
            assert min(a for a, _ in ranges) == lo and max(b for _, b in ranges) == hi
            assert sum(b - a for a, b in ranges) == hi - lo  # exactly this rank's rows, once
            expected += hi - lo
        assert res["bytes_read"] == expected < total_bytes
        for name, local in res["local"].items():
            stored = np.load(folder / ("perm.npy" if name == "index" else f"{name}.npy"))
            np.testing.assert_array_equal(local, stored[offsets[rank] : offsets[rank + 1]])
        np.testing.assert_array_equal(res["full_pos"], np.load(folder / "pos.npy"))


def test_rank_subsample_sizes(tiny_store: Path) -> None:
    results = run_distributed(_rank_local_sample, 2, str(tiny_store), "surface", 301)
    sizes = results[0]["shard_sizes"]
    assert sum(sizes) == 301 and results[1]["shard_sizes"] == sizes
    for rank, res in enumerate(results):
        assert res["collectives"] == 0 and len(res["local"]["pos"]) == sizes[rank]


def _no_partition_for_p(store: str) -> str:
    from meshshard.device_mesh import init_mesh

    try:
        DrivaerMLDataset(store, mesh=init_mesh())
    except ValueError as err:
        return str(err)
    return "no error"


def test_missing_partition_for_mesh_size(tiny_root: Path, tmp_path: Path) -> None:
    from meshshard.datasets import preprocess

    preprocess(tiny_root, tmp_path / "s", parts=(4,), runs=[1], splits=(1, 0, 0), workers=1, progress=False)
    messages = run_distributed(_no_partition_for_p, 2, str(tmp_path / "s"))
    assert messages[0] == (
        "store has no partition for P=2 (the mesh size); it serves P in [1, 4]: preprocess again with --parts 2"
    )
