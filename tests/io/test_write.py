"""meshshard.io._write: what is read back is exactly what was written, ghosts are exact, failures are clean.

write_partitions (one process writes every piece), write_local_partition (each rank its own piece, rank 0
the index; nothing gathered), write_partition_index and read_partitions.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import pyvista as pv
import torch
import torch.distributed as dist
import trimesh
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_geometric.data import Data

import meshshard.io._write as write_module
from meshshard.io import read_partitions, write_local_partition, write_partition_index, write_partitions
from meshshard.partition import Partition
from meshshard.partition._ghosts import ghost_sets
from meshshard.testing import DistributedError, run_distributed

from .conftest import slab_partition


def _owned(mesh: pv.DataSet, association: str = "point") -> np.ndarray:
    data = mesh.point_data if association == "point" else mesh.cell_data
    if "vtkGhostType" not in data:
        return np.ones(mesh.n_points if association == "point" else mesh.n_cells, dtype=bool)
    return np.asarray(data["vtkGhostType"]) == 0


def _brute_ghosts(centres: np.ndarray, owner: np.ndarray, radius: float, rank: int) -> set[int]:
    d = np.linalg.norm(centres[:, None, :].astype(np.float64) - centres[None, :, :], axis=-1)
    near = (d[owner == rank] <= radius).any(axis=0)
    return set(np.flatnonzero(near & (owner != rank)).tolist())


# ---------------------------------------------------------------- point clouds


def test_cloud_round_trip_exact(tmp_path, cloud):
    part = Partition(perm=torch.randperm(40, generator=torch.Generator().manual_seed(1)),
                     sizes=torch.tensor([15, 0, 25]))
    p = torch.linspace(0, 1, 40, dtype=torch.float64)
    u = torch.arange(120, dtype=torch.float32).reshape(40, 3)
    index = write_partitions(cloud, part, tmp_path / "cloud.pvtp", fields={"p": p, "u": u})
    assert index == tmp_path / "cloud.pvtp"
    assert sorted(f.name for f in tmp_path.iterdir()) == [
        "cloud.pvtp", "cloud.vtpd", "cloud_0.vtp", "cloud_1.vtp", "cloud_2.vtp"
    ]
    mesh = read_partitions(index)
    gids = np.asarray(mesh.point_data["GlobalPointIds"])
    assert sorted(gids.tolist()) == list(range(40))
    np.testing.assert_array_equal(mesh.points, cloud.numpy()[gids])
    assert mesh.points.dtype == np.float32
    np.testing.assert_array_equal(mesh.point_data["p"], p.numpy()[gids])
    np.testing.assert_array_equal(mesh.point_data["u"], u.numpy()[gids])
    np.testing.assert_array_equal(mesh.point_data["vtkProcessId"], part.owner.numpy()[gids])
    assert "vtkGhostType" not in mesh.point_data
    # Pieces are in partition order, rank by rank.
    for rank in range(3):
        piece = pv.read(tmp_path / f"cloud_{rank}.vtp")
        np.testing.assert_array_equal(piece.point_data["GlobalPointIds"], part.shard_indices(rank).numpy())
        assert piece.n_cells == piece.n_points  # one vertex per point, so ParaView draws them


def test_sample_dict_and_pyg_data_keep_their_per_point_arrays(tmp_path, cloud):
    part = Partition.from_owner(torch.arange(40) % 2, 2)
    normals = torch.nn.functional.normalize(torch.randn(40, 3), dim=1)
    sample = {"pos": cloud, "normals": normals, "pressure": torch.randn(40), "name": "run_1"}
    mesh = read_partitions(write_partitions(sample, part, tmp_path / "s.pvtp"))
    gids = np.asarray(mesh.point_data["GlobalPointIds"])
    assert {"normals", "pressure"} <= set(mesh.point_data.keys())
    np.testing.assert_array_equal(mesh.point_data["normals"], normals.numpy()[gids])

    data = Data(pos=cloud, x=torch.randn(40, 4), y=torch.randn(40, 1))
    mesh = read_partitions(write_partitions(data, part, tmp_path / "g.pvtp", fields=["x"]))
    gids = np.asarray(mesh.point_data["GlobalPointIds"])
    assert "x" in mesh.point_data and "y" not in mesh.point_data
    np.testing.assert_array_equal(mesh.point_data["x"], data.x.numpy()[gids])


def test_numpy_float64_and_folder_path(tmp_path):
    points = np.random.default_rng(0).random((12, 3))
    part = Partition(perm=torch.arange(12), sizes=torch.tensor([12]))
    index = write_partitions(points, part, tmp_path / "out")
    assert index == tmp_path / "out" / "partitions.pvtp"
    mesh = read_partitions(index)
    assert mesh.points.dtype == np.float64
    np.testing.assert_array_equal(mesh.points, points)


@pytest.mark.parametrize("compression", ["zlib", "lz4"])
def test_compressed_pieces_read_back_exactly_and_are_smaller(tmp_path, compression):
    points = np.repeat(np.random.default_rng(0).random((50, 3)), 20, axis=0)  # compressible
    part = Partition.from_owner(torch.arange(1000) % 2, 2)
    raw = write_partitions(points, part, tmp_path / "raw.pvtp")
    packed = write_partitions(points, part, tmp_path / "packed.pvtp", compression=compression)
    assert packed.with_name("packed_0.vtp").stat().st_size < raw.with_name("raw_0.vtp").stat().st_size
    mesh = read_partitions(packed)
    np.testing.assert_array_equal(mesh.points, points[np.asarray(mesh.point_data["GlobalPointIds"])])
    expected = "compression must be one of (None, 'zlib', 'lz4', 'lzma') (got 'gzip')"
    with pytest.raises(ValueError, match=re.escape(expected)):
        write_partitions(points, part, tmp_path / "x.pvtp", compression="gzip")


def test_planar_cloud_gets_z_zero(tmp_path):
    points = np.arange(12, dtype=np.int64).reshape(6, 2)
    part = Partition.from_owner(torch.tensor([0, 1, 0, 1, 0, 1]), 2)
    mesh = read_partitions(write_partitions(points, part, tmp_path / "flat.pvtp", ghost_radius=3.0))
    gids = np.asarray(mesh.point_data["GlobalPointIds"])
    np.testing.assert_array_equal(mesh.points[:, :2], points[gids])
    assert np.all(mesh.points[:, 2] == 0) and mesh.points.dtype == np.float64


def test_cloud_ghosts_are_exact_and_marked(tmp_path, cloud):
    part = slab_partition(cloud.numpy(), 3)
    radius = 0.2
    index = write_partitions(cloud, part, tmp_path / "g.pvtp", ghost_radius=radius)
    owner = part.owner.numpy()
    assert 'GhostLevel="1"' in index.read_text()
    for rank in range(3):
        piece = pv.read(tmp_path / f"g_{rank}.vtp")
        ghost = np.asarray(piece.point_data["vtkGhostType"])
        gids = np.asarray(piece.point_data["GlobalPointIds"])
        np.testing.assert_array_equal(gids[ghost == 0], part.shard_indices(rank).numpy())
        assert set(gids[ghost == 1].tolist()) == _brute_ghosts(cloud.numpy(), owner, radius, rank)
        assert np.all(ghost[: int(part.sizes[rank])] == 0) and np.all(ghost[int(part.sizes[rank]):] == 1)
        np.testing.assert_array_equal(piece.point_data["vtkProcessId"], owner[gids])  # owner, even for ghosts
        np.testing.assert_array_equal(piece.cell_data["vtkGhostType"], ghost)  # vertex cells hidden too
    mesh = read_partitions(index)
    keep = _owned(mesh)
    assert sorted(np.asarray(mesh.point_data["GlobalPointIds"])[keep].tolist()) == list(range(40))


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(0, 30),
    num_parts=st.integers(1, 4),
    radius=st.floats(0.05, 0.6),
    seed=st.integers(0, 2**16),
)
def test_property_cloud_round_trip_and_ghosts(tmp_path_factory, n, num_parts, radius, seed):
    rng = np.random.default_rng(seed)
    points = rng.random((n, 3)).astype(np.float32)
    part = Partition.from_owner(torch.as_tensor(rng.integers(0, num_parts, n)), num_parts)
    out = tmp_path_factory.mktemp("prop") / "c.pvtp"
    write_partitions({"pos": points, "f": points[:, :2] * 2}, part, out, ghost_radius=radius)
    owner = part.owner.numpy()
    for rank in range(num_parts):
        piece = pv.read(out.with_name(f"c_{rank}.vtp"))
        ghost = np.asarray(piece.point_data["vtkGhostType"]) if piece.n_points else np.zeros(0)
        gids = np.asarray(piece.point_data["GlobalPointIds"]) if piece.n_points else np.zeros(0, int)
        assert gids[ghost == 0].tolist() == part.shard_indices(rank).tolist()
        assert set(gids[ghost == 1].tolist()) == _brute_ghosts(points, owner, radius, rank)
        if piece.n_points:
            np.testing.assert_array_equal(piece.points, points[gids])
            np.testing.assert_array_equal(piece.point_data["f"], points[gids, :2] * 2)


# ---------------------------------------------------------------- meshes


def _faces_in_original_ids(mesh: pv.DataSet, width: int) -> np.ndarray:
    """Each cell's points as original point ids (fixed-size cells of ``width`` points)."""
    cells = (mesh.faces if isinstance(mesh, pv.PolyData) else mesh.cells).reshape(-1, width + 1)[:, 1:]
    return np.asarray(mesh.point_data["GlobalPointIds"])[cells]


def test_polydata_round_trip_over_cells(tmp_path, sphere):
    part = slab_partition(np.asarray(sphere.cell_centers().points), 3)
    index = write_partitions(sphere, part, tmp_path / "s.pvtp")
    mesh = read_partitions(index)
    cids = np.asarray(mesh.cell_data["GlobalCellIds"])
    assert sorted(cids.tolist()) == list(range(sphere.n_cells))
    np.testing.assert_array_equal(mesh.cell_data["vtkProcessId"], part.owner.numpy()[cids])
    np.testing.assert_array_equal(mesh.cell_data["c"], sphere.cell_data["c"][cids])
    pids = np.asarray(mesh.point_data["GlobalPointIds"])
    np.testing.assert_array_equal(mesh.points, sphere.points[pids])
    np.testing.assert_array_equal(mesh.point_data["q"], sphere.point_data["q"][pids])
    original = sphere.faces.reshape(-1, 4)[:, 1:]
    np.testing.assert_array_equal(_faces_in_original_ids(mesh, 3), original[cids])
    # Each piece holds its cells in partition order, with just the points they use.
    piece = pv.read(tmp_path / "s_1.vtp")
    np.testing.assert_array_equal(piece.cell_data["GlobalCellIds"], part.shard_indices(1).numpy())
    assert set(np.asarray(piece.point_data["GlobalPointIds"]).tolist()) == set(
        original[part.shard_indices(1).numpy()].ravel().tolist()
    )


def test_unstructured_grid_writes_pvtu_that_pyvista_reads(tmp_path, tets):
    part = slab_partition(np.asarray(tets.cell_centers().points), 4)
    with pytest.raises(ValueError, match=r"path for a volume mesh must end with \.pvtu"):
        write_partitions(tets, part, tmp_path / "v.pvtp")
    index = write_partitions(tets, part, tmp_path / "v.pvtu", fields=["u"])
    assert [p.name for p in sorted(tmp_path.glob("v_*.vtu"))] == [f"v_{r}.vtu" for r in range(4)]
    mesh = pv.read(index)
    cids = np.asarray(mesh.cell_data["GlobalCellIds"])
    assert sorted(cids.tolist()) == list(range(tets.n_cells))
    np.testing.assert_array_equal(mesh.cell_data["u"], tets.cell_data["u"][cids])
    assert "T" not in mesh.point_data
    np.testing.assert_array_equal(mesh.celltypes, tets.celltypes[cids])
    np.testing.assert_array_equal(_faces_in_original_ids(mesh, 4), tets.cells.reshape(-1, 5)[cids, 1:])


def test_mixed_polydata_sections_keep_global_cell_ids(tmp_path):
    mesh = pv.PolyData(
        np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0], [2, 0, 0]], dtype=np.float32),
        faces=[3, 0, 1, 2, 4, 0, 2, 3, 4],
        lines=[2, 1, 4],
        verts=[1, 4],
    )
    # VTK numbers verts, then lines, then polys.
    mesh.cell_data["kind"] = np.array([0, 1, 2, 2], dtype=np.int8)
    part = Partition(perm=torch.tensor([3, 0, 2, 1]), sizes=torch.tensor([2, 2]))
    back = read_partitions(write_partitions(mesh, part, tmp_path / "m.pvtp"))
    cids = np.asarray(back.cell_data["GlobalCellIds"])
    assert sorted(cids.tolist()) == [0, 1, 2, 3]
    np.testing.assert_array_equal(back.cell_data["kind"], mesh.cell_data["kind"][cids])
    for local, cid in enumerate(cids):
        got = np.asarray(back.point_data["GlobalPointIds"])[back.get_cell(local).point_ids]
        assert got.tolist() == list(mesh.get_cell(int(cid)).point_ids)


def test_mesh_ghost_cells_and_points(tmp_path, sphere):
    centres = np.asarray(sphere.cell_centers().points, dtype=np.float64)
    part = slab_partition(centres, 2)
    radius = 0.15
    write_partitions(sphere, part, tmp_path / "g.pvtp", ghost_radius=radius)
    owner = part.owner.numpy()
    faces = sphere.faces.reshape(-1, 4)[:, 1:]
    exact_centres = sphere.points[faces].astype(np.float64).mean(axis=1)
    for rank in range(2):
        piece = pv.read(tmp_path / f"g_{rank}.vtp")
        cghost = np.asarray(piece.cell_data["vtkGhostType"])
        cids = np.asarray(piece.cell_data["GlobalCellIds"])
        assert set(cids[cghost == 1].tolist()) == _brute_ghosts(exact_centres, owner, radius, rank)
        assert cids[cghost == 0].tolist() == part.shard_indices(rank).tolist()
        # A point is a ghost exactly when no owned cell of the piece uses it.
        pids = np.asarray(piece.point_data["GlobalPointIds"])
        used_by_owned = set(faces[cids[cghost == 0]].ravel().tolist())
        expected = np.array([0 if p in used_by_owned else 1 for p in pids], dtype=np.uint8)
        np.testing.assert_array_equal(piece.point_data["vtkGhostType"], expected)
        assert expected.sum() > 0


# ---------------------------------------------------------------- index files


def test_index_references_every_piece_and_vtpd_reads(tmp_path, sphere):
    sizes = torch.tensor([0, sphere.n_cells - 5, 0, 5])  # two empty parts
    part = Partition(perm=torch.arange(sphere.n_cells), sizes=sizes)
    index = write_partitions(sphere, part, tmp_path / "idx.pvtp", ghost_radius=0.3)
    root = ET.parse(index).getroot()
    assert root.get("type") == "PPolyData"
    sources = [p.get("Source") for p in root.iter("Piece")]
    assert sources == [f"idx_{r}.vtp" for r in range(4)]
    assert all((tmp_path / s).is_file() for s in sources)
    declared = {a.get("Name") for a in root.find("PPolyData/PCellData")}
    assert {"vtkProcessId", "GlobalCellIds", "c", "vtkGhostType"} <= declared
    empty = pv.read(tmp_path / "idx_0.vtp")
    assert empty.n_points == 0 and empty.n_cells == 0
    assert set(empty.cell_data.keys()) >= {"GlobalCellIds", "vtkGhostType"}
    mesh = read_partitions(index)
    assert sorted(np.asarray(mesh.cell_data["GlobalCellIds"])[_owned(mesh, "cell")].tolist()) == list(
        range(sphere.n_cells)
    )
    blocks = pv.read(tmp_path / "idx.vtpd")
    assert len(blocks) == 4
    assert blocks[3].n_cells >= 5


def test_vtk_parallel_reader_reads_the_index(tmp_path, cloud):
    from vtkmodules.vtkIOXML import vtkXMLPPolyDataReader

    index = write_partitions(cloud, Partition.from_owner(torch.arange(40) % 3, 3), tmp_path / "r.pvtp")
    reader = vtkXMLPPolyDataReader()
    reader.SetFileName(str(index))
    reader.Update()
    assert reader.GetNumberOfPieces() == 3
    assert reader.GetOutput().GetNumberOfPoints() == 40
    assert reader.GetOutput().GetPointData().GetGlobalIds().GetName() == "GlobalPointIds"


# ---------------------------------------------------------------- errors and atomicity


def test_failed_write_leaves_no_index_and_no_temporaries(tmp_path, cloud, monkeypatch):
    part = Partition.from_owner(torch.arange(40) % 3, 3)
    index = write_partitions(cloud, part, tmp_path / "a.pvtp")  # an earlier, complete write
    assert index.exists()
    real, calls = write_module.write_piece, []

    def fail_on_second(piece, path, compression=None):
        calls.append(path)
        if len(calls) == 2:
            path.write_bytes(b"half a piece")
            raise OSError("disk full")
        real(piece, path, compression)

    monkeypatch.setattr(write_module, "write_piece", fail_on_second)
    with pytest.raises(OSError, match="disk full"):
        write_partitions(cloud, part, index)
    assert not index.exists() and not index.with_suffix(".vtpd").exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize(
    ("path", "error", "match"),
    [
        ("x.txt", ValueError, re.escape("path must be a folder or end with .pvtp or .pvtu (got")),
        ("x.pvtu", ValueError, re.escape("path for a point cloud must end with .pvtp (got")),
        ("blocker/x.pvtp", NotADirectoryError, "it is not a folder"),
        (3, TypeError, re.escape("path must be a str or os.PathLike (got int)")),
    ],
)
def test_bad_paths(tmp_path, cloud, path, error, match):
    (tmp_path / "blocker").write_text("a file, not a folder")
    target = path if isinstance(path, int) else tmp_path / path
    with pytest.raises(error, match=match):
        write_partitions(cloud, Partition.from_owner(torch.zeros(40, dtype=torch.long), 1), target)


@pytest.mark.parametrize(
    ("data", "kwargs", "error", "match"),
    [
        ("points.npy", {}, TypeError, r"data must be an \(N, 3\) tensor/array.*\(got str\)"),
        ([[0.0, 0, 0]] * 4, {}, TypeError, r"\(got list\)"),
        (torch.zeros(4, 4), {}, ValueError, re.escape("data must have shape (N, 2) or (N, 3) (got (4, 4))")),
        (torch.zeros(4, 3, dtype=torch.complex64), {}, TypeError, "data must hold real numbers"),
        ({"x": torch.zeros(4, 3)}, {}, ValueError, "a sample dict needs a 'pos' entry"),
        (torch.zeros(5, 3), {}, ValueError, "partition covers 4 items but data has 5 points"),
        (torch.zeros(4, 3), {"ghost_radius": -1.0}, ValueError,
         re.escape("ghost_radius must be positive and finite (got -1.0)")),
        (torch.zeros(4, 3), {"ghost_radius": "1"}, TypeError,
         re.escape("ghost_radius must be a real number (got str)")),
        (torch.zeros(4, 3), {"fields": {"p": torch.zeros(3)}}, ValueError,
         re.escape("field 'p' must have one row per point (4) (got shape (3,))")),
        (torch.zeros(4, 3), {"fields": {"vtkGhostType": torch.zeros(4)}}, ValueError, "is reserved"),
        (torch.zeros(4, 3), {"fields": ["p"]}, TypeError, "fields for a bare point array must be a mapping"),
        ({"pos": torch.zeros(4, 3)}, {"fields": ["p"]}, ValueError, re.escape("fields ['p'] not found")),
    ],
)
def test_unsupported_inputs(tmp_path, data, kwargs, error, match):
    part = Partition(perm=torch.arange(4), sizes=torch.tensor([2, 2]))
    with pytest.raises(error, match=match):
        write_partitions(data, part, tmp_path / "e.pvtp", **kwargs)
    assert not (tmp_path / "e.pvtp").exists()


def test_mesh_partition_from_the_partitioner_and_point_partitions_of_meshes(tmp_path, sphere):
    from meshshard.partition import partition, partition_mesh

    mesh_part = partition_mesh(sphere, 3)
    back = read_partitions(write_partitions(sphere, mesh_part, tmp_path / "m.pvtp"))
    cids = np.asarray(back.cell_data["GlobalCellIds"])
    np.testing.assert_array_equal(back.cell_data["vtkProcessId"], mesh_part.cells.owner.numpy()[cids])
    by_points = partition(torch.as_tensor(sphere.points), 3)
    with pytest.raises(ValueError, match="matches the mesh's points, but meshes are split by cells"):
        write_partitions(sphere, by_points, tmp_path / "p.pvtp")


def test_trimesh_is_a_surface_mesh_and_multiblocks_are_refused(tmp_path, sphere):
    tri = trimesh.Trimesh(np.asarray(sphere.points), sphere.faces.reshape(-1, 4)[:, 1:], process=False)
    part = slab_partition(np.asarray(tri.triangles_center), 2)
    back = read_partitions(write_partitions(tri, part, tmp_path / "t.pvtp"))
    assert sorted(np.asarray(back.cell_data["GlobalCellIds"]).tolist()) == list(range(len(tri.faces)))
    with pytest.raises(TypeError, match=r"data must be a single pyvista/VTK dataset \(got MultiBlock"):
        write_partitions(pv.MultiBlock([sphere]), part, tmp_path / "m.pvtp")


def test_read_partitions_reports_missing_pieces(tmp_path, cloud):
    index = write_partitions(cloud, Partition.from_owner(torch.arange(40) % 2, 2), tmp_path / "r.pvtp")
    index.with_name("r_1.vtp").unlink()
    with pytest.raises(FileNotFoundError, match=re.escape("r.pvtp references missing pieces ['r_1.vtp']")):
        read_partitions(index)
    with pytest.raises(ValueError, match=re.escape("path must end with .pvtp, .pvtu or .vtpd")):
        read_partitions(index.with_name("r_0.vtp"))


def test_partition_must_be_a_partition(tmp_path, cloud):
    with pytest.raises(TypeError, match=r"partition must be a meshshard Partition .*\(got Tensor\)"):
        write_partitions(cloud, torch.zeros(40), tmp_path / "p.pvtp")


def test_polyhedra_are_refused(tmp_path):
    from vtkmodules.vtkCommonDataModel import VTK_POLYHEDRON

    grid = pv.UnstructuredGrid(
        [4, 0, 1, 2, 3], np.array([10], dtype=np.uint8), np.eye(4, 3, dtype=np.float32)
    )
    grid.celltypes[:] = VTK_POLYHEDRON
    if VTK_POLYHEDRON not in grid.celltypes:  # pragma: no cover - this VTK forbids the edit
        pytest.skip("cannot build a polyhedron grid this way")
    with pytest.raises(ValueError, match="polyhedron"):
        write_partitions(grid, Partition(perm=torch.arange(1), sizes=torch.tensor([1])), tmp_path / "p.pvtu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_write_the_same_files(tmp_path, cloud):
    part = Partition.from_owner(torch.arange(40) % 3, 3)
    fields = {"p": torch.arange(40.0)}
    cpu = read_partitions(write_partitions(cloud, part, tmp_path / "cpu.pvtp", fields=fields, ghost_radius=0.2))
    gpu_fields = {"p": fields["p"].cuda()}
    gpu = read_partitions(
        write_partitions(cloud.cuda(), part.to("cuda"), tmp_path / "gpu.pvtp", fields=gpu_fields, ghost_radius=0.2)
    )
    np.testing.assert_array_equal(cpu.points, gpu.points)
    for name in ("p", "GlobalPointIds", "vtkProcessId", "vtkGhostType"):
        np.testing.assert_array_equal(cpu.point_data[name], gpu.point_data[name])



# ---------------------------------------------------------------- one piece per rank

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
    ghosts = ghost_sets(points, part.owner, part.num_parts, radius)[rank]
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
    ghosts = ghost_sets(points, part.owner, 3, radius)
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
    expected = ghost_sets(ordered, owner, 3, radius)
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


def test_local_ghost_arguments_are_checked(tmp_path):
    points, pressure, _ = _global_data()
    out = tmp_path / "g.pvtp"
    common = {"global_ids": torch.arange(3), "rank": 0, "num_ranks": 1, "fields": {"p": pressure[:3]}}
    with pytest.raises(ValueError, match="ghost_points needs ghost_global_ids and ghost_ranks"):
        write_local_partition(points[:3], out, ghost_points=points[3:5], ghost_global_ids=torch.arange(2), **common)
    with pytest.raises(ValueError, match=re.escape("ghost_fields must have the keys of fields ['p'] (got ['q'])")):
        write_local_partition(points[:3], out, ghost_points=points[3:5], ghost_fields={"q": pressure[3:5]},
                              ghost_global_ids=torch.arange(3, 5), ghost_ranks=torch.ones(2), **common)
    with pytest.raises(ValueError, match=re.escape("ghost_global_ids must have 2 rows (got shape (3,))")):
        write_local_partition(points[:3], out, ghost_points=points[3:5], ghost_fields={"p": pressure[3:5]},
                              ghost_global_ids=torch.arange(3), ghost_ranks=torch.ones(2), **common)
    # ghost descriptions without ghost rows were silently dropped before: now refused
    with pytest.raises(ValueError, match=re.escape("ghost_fields, ghost_ranks describe ghost rows: give ghost_points")):
        write_local_partition(points[:3], out, ghost_fields={"p": pressure[3:5]}, ghost_ranks=torch.ones(2), **common)
    assert not any(tmp_path.iterdir())


def _local_rank_and_halo_misuse(out: str) -> list[str]:
    import meshshard as ms
    from meshshard.halo import HaloPlan

    points, _, part = _global_data()
    x = ms.ShardTensor.from_local(points[part.shard_indices(dist.get_rank())], ms.init_mesh(), sizes=[12, 0, N - 12])
    messages = []
    halo = HaloPlan.build(x, 0.3)
    for kwargs in ({"num_ranks": 4}, {"halo": halo, "ghost_points": points[:2]}, {"halo": halo, "ghost_ranks": [0]}):
        with pytest.raises(ValueError) as info:
            write_local_partition(x, out, **kwargs)
        messages.append(str(info.value))
    return messages


def test_local_rank_must_match_the_group_and_halo_excludes_ghost_points(tmp_path):
    out = tmp_path / "m.pvtp"
    results = run_distributed(_local_rank_and_halo_misuse, 3, str(out))
    for rank, (mismatch, both, ignored) in enumerate(results):
        assert mismatch == f"rank/num_ranks ({rank}/4) differ from the process group's ({rank}/3)"
        assert both == "give either halo or ghost_points, not both"
        assert ignored == "a halo supplies the ghosts' fields, ids and ranks: drop ghost_ranks"
    assert not any(tmp_path.iterdir())
