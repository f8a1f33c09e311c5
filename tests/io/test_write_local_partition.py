"""Distributed writing: each of 3 ranks writes its own piece, rank 0 the index; nothing gathered.

pyvista is imported inside the tests only: the rank workers import this module too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

from meshshard.io import read_partitions, write_local_partition, write_partition_index
from meshshard.io._ghosts import ghost_items
from meshshard.partition import Partition
from meshshard.testing import DistributedError, run_distributed

N = 31


def _global_data() -> tuple[torch.Tensor, torch.Tensor, Partition]:
    gen = torch.Generator().manual_seed(3)
    points = torch.rand(N, 3, generator=gen)
    pressure = torch.randn(N, 2, generator=gen, dtype=torch.float64)
    # Uneven parts, one of them empty.
    part = Partition(perm=torch.randperm(N, generator=gen), sizes=torch.tensor([12, 0, N - 12]))
    return points, pressure, part


def _write_rank_piece(out: str, radius: float) -> str:
    rank = dist.get_rank()
    points, pressure, part = _global_data()
    ids = part.shard_indices(rank)
    ghosts = torch.as_tensor(ghost_items(points.numpy(), part.owner.numpy(), radius, part.num_parts)[rank])
    index = write_local_partition(
        points[ids], out,
        fields={"pressure": pressure[ids]},
        global_ids=ids,
        ghost_points=points[ghosts],
        ghost_fields={"pressure": pressure[ghosts]},
        ghost_global_ids=ghosts,
        ghost_ranks=part.owner[ghosts],
    )
    return str(index)


def test_three_ranks_write_pieces_that_read_back_exactly(tmp_path):
    import pyvista as pv

    out = tmp_path / "dist.pvtp"
    radius = 0.25
    indices = run_distributed(_write_rank_piece, 3, str(out), radius)
    assert indices == [str(out)] * 3
    points, pressure, part = _global_data()
    mesh = read_partitions(out)
    owned = np.asarray(mesh.point_data["vtkGhostType"]) == 0
    gids = np.asarray(mesh.point_data["GlobalPointIds"])
    assert sorted(gids[owned].tolist()) == list(range(N))
    np.testing.assert_array_equal(mesh.points, points.numpy()[gids])
    np.testing.assert_array_equal(mesh.point_data["pressure"], pressure.numpy()[gids])
    np.testing.assert_array_equal(mesh.point_data["vtkProcessId"], part.owner.numpy()[gids])
    ghosts = ghost_items(points.numpy(), part.owner.numpy(), radius, 3)
    for rank in range(3):
        piece = pv.read(out.with_name(f"dist_{rank}.vtp"))
        n_own = int(part.sizes[rank])
        got = np.asarray(piece.point_data["GlobalPointIds"]) if piece.n_points else np.zeros(0, int)
        assert got[:n_own].tolist() == part.shard_indices(rank).tolist()
        assert got[n_own:].tolist() == ghosts[rank].tolist()
    assert pv.read(out.with_suffix(".vtpd")).n_partitions == 3


def _write_shard_tensor_piece(out: str, radius: float | None) -> int:
    import meshshard as ms
    from meshshard.halo import HaloPlan

    points, pressure, part = _global_data()
    mesh = ms.init_mesh()
    sizes = part.sizes.tolist()
    rank = dist.get_rank()
    ids = part.shard_indices(rank)
    x = ms.ShardTensor.from_local(points[ids], mesh, sizes=sizes)
    p = ms.ShardTensor.from_local(pressure[ids], mesh, sizes=sizes)
    halo = None if radius is None else HaloPlan.build(x, radius)
    write_local_partition(x, out, fields={"pressure": p}, halo=halo)  # ids default to partition order
    return rank


@pytest.mark.parametrize("radius", [None, 0.3])
def test_shard_tensors_default_to_partition_order_ids_and_take_a_halo_plan(tmp_path, radius):
    import pyvista as pv

    out = tmp_path / "st.pvtp"
    assert run_distributed(_write_shard_tensor_piece, 3, str(out), radius) == [0, 1, 2]
    points, pressure, part = _global_data()
    ordered, ordered_pressure = part.apply(points).numpy(), part.apply(pressure).numpy()
    mesh = read_partitions(out)
    gids = np.asarray(mesh.point_data["GlobalPointIds"])
    np.testing.assert_array_equal(mesh.points, ordered[gids])
    np.testing.assert_array_equal(mesh.point_data["pressure"], ordered_pressure[gids])
    if radius is None:
        assert gids.tolist() == list(range(N))
        assert "vtkGhostType" not in mesh.point_data
        return
    owner = np.repeat(np.arange(3), part.sizes.numpy())
    np.testing.assert_array_equal(mesh.point_data["vtkProcessId"], owner[gids])
    expected = ghost_items(ordered, owner, radius, 3)
    for rank in range(3):
        piece = pv.read(out.with_name(f"st_{rank}.vtp"))
        if piece.n_points == 0:
            assert len(expected[rank]) == 0
            continue
        ghost = np.asarray(piece.point_data["vtkGhostType"]) == 1
        got = np.asarray(piece.point_data["GlobalPointIds"])
        assert sorted(got[ghost].tolist()) == expected[rank].tolist()
        assert got[~ghost].tolist() == list(range(int(part.offsets[rank]), int(part.offsets[rank + 1])))


def _plain_tensors_one_rank_fails(out: str, bad_rank: int) -> int:
    points, _, part = _global_data()
    rank = dist.get_rank()
    target = out if rank != bad_rank else out + "/../x.txt"  # a path this rank cannot use
    write_local_partition(points[part.shard_indices(rank)], target)
    return rank


def test_a_failing_rank_fails_every_rank_and_leaves_no_index(tmp_path):
    out = tmp_path / "f.pvtp"
    with pytest.raises(DistributedError) as info:
        run_distributed(_plain_tensors_one_rank_fails, 3, str(out), 1)
    messages = {f.rank: str(f) for f in info.value.failures}
    assert set(messages) == {0, 1, 2}
    assert "path must be a folder or end with .pvtp" in messages[1]
    assert "another rank failed to write its piece" in messages[0]
    assert not out.exists()


def test_without_process_group_pieces_then_index(tmp_path):
    points, _, part = _global_data()
    out = tmp_path / "solo.pvtp"
    for rank in range(3):
        ids = part.shard_indices(rank)
        write_local_partition(points[ids], out, global_ids=ids, rank=rank, num_ranks=3)
    assert not out.exists()
    assert write_partition_index(out, 3) == out
    mesh = read_partitions(out)
    assert sorted(np.asarray(mesh.point_data["GlobalPointIds"]).tolist()) == list(range(N))
    with pytest.raises(FileNotFoundError, match=r"missing pieces \['solo_3.vtp'\]"):
        write_partition_index(out, 4)
    with pytest.raises(ValueError, match="global_ids is required when no process group"):
        write_local_partition(points[:3], out, rank=0, num_ranks=3)
    with pytest.raises(ValueError, match=r"rank must satisfy 0 <= rank < num_ranks \(got rank=3"):
        write_local_partition(points[:3], out, global_ids=torch.arange(3), rank=3, num_ranks=3)
