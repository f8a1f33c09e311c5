"""Bad-input catalogue: every public function, fed bad input, raises a clear error naming the argument.

One table (``CASES``): ``(case id, call, expected exception type, regex the message must match)``.
A call receives ``env``, a namespace of tiny valid inputs (a 20-point cloud, its partition, a
one-rank mesh in this process, a synthetic DrivaerML folder and store), and breaks one thing.
Never a crash deep inside torch, a hang, or a silently accepted bad value.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import meshshard as ms
from meshshard.errors import CheckpointError, DatasetError


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from meshshard.datasets import make_synthetic_drivaerml, preprocess
    from meshshard.nn import PhysicsAttention, Transolver
    from meshshard.partition import partition

    tmp = tmp_path_factory.mktemp("bad_input")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp / "pg"), 1), rank=0, world_size=1)
    try:
        g = torch.Generator().manual_seed(0)
        pts = torch.rand(20, 3, generator=g)
        nan_pts, inf_pts = pts.clone(), pts.clone()
        nan_pts[3, 1], inf_pts[5, 0] = float("nan"), float("inf")
        mesh = ms.init_mesh()
        raw = tmp / "raw"
        make_synthetic_drivaerml(raw, 3, surface_cells=200, volume_cells=0, seed=1)
        store = tmp / "store"
        assert preprocess(raw, store, parts=(1,), workers=1, splits=(0.6, 0.2, 0.2), progress=False).ok
        corrupt = tmp / "corrupt"
        (corrupt / "run_1").mkdir(parents=True)
        (corrupt / "run_1" / "boundary_1.vtp").write_text("not a vtp file")
        bad_meta = tmp / "bad_meta"
        bad_meta.mkdir()
        (bad_meta / "meta.json").write_text("{truncated")
        yield types.SimpleNamespace(
            tmp=tmp,
            pts=pts,
            nan=nan_pts,
            inf=inf_pts,
            meta=torch.empty(20, 3, device="meta"),
            part=partition(pts, 2),
            mesh=mesh,
            x=ms.scatter(pts, [20], mesh),
            raw=raw,
            store=store,
            corrupt=corrupt,
            bad_meta=bad_meta,
            model=Transolver(3, 1, n_hidden=8, n_layers=1, n_head=2, slice_num=4),
            attention=PhysicsAttention(8, heads=2, dim_head=4, slice_num=4),
        )
    finally:
        dist.destroy_process_group()


def _partition(*a, **k):
    from meshshard.partition import partition

    return partition(*a, **k)


def _quality(*a, **k):
    from meshshard.partition import quality

    return quality(*a, **k)


def _write(*a, **k):
    from meshshard.io import write_partitions

    return write_partitions(*a, **k)


def _render(*a, **k):
    from meshshard.io import render_partitions

    return render_partitions(*a, **k)


def _drivaerml(*a, **k):
    from meshshard.datasets import DrivaerML

    return DrivaerML(*a, **k)


def _dataset(*a, **k):
    from meshshard.datasets import DrivaerMLDataset

    return DrivaerMLDataset(*a, **k)


def _preprocess(src, dst, **k):
    from meshshard.datasets import preprocess

    return preprocess(src, dst, **{"workers": 1, "progress": False, **k})


def _synthetic(*a, **k):
    from meshshard.datasets import make_synthetic_drivaerml

    return make_synthetic_drivaerml(*a, **k)


def _preprocess_corrupt(e):
    report = _preprocess(e.corrupt, e.tmp / "s_corrupt")
    if not report.ok:  # a corrupt run is reported per run, with the file's name, and skipped
        (message,) = report.failed.values()
        raise ValueError(message)
    return report


def _curator_density(e, value):
    from meshshard.datasets import CuratorDrivaerML
    from meshshard.testing.curator import write_curator_runs

    root = e.tmp / f"curator_density_{value}"
    if not root.exists():
        write_curator_runs(e.raw, root, fmt="npz", runs=[1], volume=False, air_density=value)
    return CuratorDrivaerML(root, volume=False)


def _second_mesh_binary_op(e):
    other = ms.ShardTensor.from_local(e.pts, ms.init_mesh(), sizes=[20])
    return e.x + other


def _corrupt_sample(e):
    import shutil

    store = e.tmp / "store_corrupt"
    if not store.exists():
        shutil.copytree(e.store, store)
        for f in store.rglob("pos.npy"):
            f.write_bytes(f.read_bytes()[:100])  # truncated mid-header
    ds = _dataset(store, mesh=None)
    return ds[0]


def _missing_sample(e):
    import shutil

    store = e.tmp / "store_missing"
    if not store.exists():
        shutil.copytree(e.store, store)
        for f in store.rglob("pos.npy"):
            f.unlink()
    return _dataset(store, mesh=None)[0]


def _sizes_tensor_float(e):
    return ms.ShardTensor.from_local(e.pts, e.mesh, sizes=torch.tensor([20.0]))


def _sync(e, module, mesh):
    from meshshard.nn import sync_gradients

    return sync_gradients(module, mesh)


def _train_config(e, **changes):
    from meshshard.training import TrainConfig

    return TrainConfig(**{"store": str(e.store), "out": str(e.tmp / "train_out"), **changes})


def _escaping_store(e) -> Path:
    """A copy of the good store's meta.json whose point order names a folder outside the store."""
    meta = json.loads((Path(e.store) / "meta.json").read_text())
    escaping = e.tmp / "escaping_store"
    escaping.mkdir(exist_ok=True)
    (escaping / "meta.json").write_text(json.dumps({**meta, "order_of": {"1": "../../etc"}}))
    return escaping


def _text_file(e, name: str) -> Path:
    (e.tmp / name).write_text("not a checkpoint\n")
    return e.tmp / name


def _sphere():
    import pyvista as pv

    return pv.Sphere(theta_resolution=8, phi_resolution=8)


V, T, F = ValueError, TypeError, FileNotFoundError


CASES = [
    # -- partition / quality --------------------------------------------------------------------
    ("partition/nan", lambda e: _partition(e.nan, 2), V, r"points must be finite .*row 3"),
    ("partition/inf", lambda e: _partition(e.inf, 2), V, r"points must be finite .*row 5"),
    ("partition/complex", lambda e: _partition(e.pts.to(torch.complex64), 2), T, r"points must hold real"),
    ("partition/1-d", lambda e: _partition(e.pts[:, 0], 2), V, r"points must have shape \(N, 2\) or \(N, 3\)"),
    ("partition/4 columns", lambda e: _partition(torch.rand(5, 4), 2), V, r"points must have shape"),
    ("partition/string", lambda e: _partition("points", 2), T, r"points must be a torch.Tensor"),
    (
        "partition/meta device",
        lambda e: _partition(e.meta, 2),
        V,
        r"points must hold data on a real device such as cpu or cuda \(got a tensor on the 'meta' device\)",
    ),
    ("partition/zero parts", lambda e: _partition(e.pts, 0), V, r"num_parts must be at least 1 \(got 0\)"),
    ("partition/negative parts", lambda e: _partition(e.pts, -1), V, r"num_parts must be at least 1 \(got -1\)"),
    ("partition/float parts", lambda e: _partition(e.pts, 2.5), T, r"num_parts must be an integer"),
    ("partition/method", lambda e: _partition(e.pts, 2, method="metisx"), V, r"method must be one of"),
    (
        "partition/negative weights",
        lambda e: _partition(e.pts, 2, weights=-torch.ones(20)),
        V,
        r"weights must be non-negative",
    ),
    (
        "partition/NaN weights",
        lambda e: _partition(e.pts, 2, weights=torch.full((20,), float("nan"))),
        V,
        r"weights must be finite",
    ),
    (
        "partition/weights shape",
        lambda e: _partition(e.pts, 2, weights=torch.ones(19)),
        V,
        r"weights must have shape \(20,\)",
    ),
    (
        "partition/negative fractions",
        lambda e: _partition(e.pts, 2, fractions=[0.5, -0.5]),
        V,
        r"fractions must be non-negative",
    ),
    ("quality/negative radius", lambda e: _quality(e.pts, e.part, radius=-1.0), V, r"radius must be positive"),
    ("quality/NaN radius", lambda e: _quality(e.pts, e.part, radius=float("nan")), V, r"radius must be positive"),
    (
        "quality/mismatched points",
        lambda e: _quality(e.pts[:10], e.part, radius=0.1),
        V,
        r"points must have part.num_points = 20 rows \(got 10\)",
    ),
    ("quality/not a partition", lambda e: _quality(e.pts, [10, 10], radius=0.1), T, r"part must be a Partition"),
    ("quality/NaN points", lambda e: _quality(e.nan, e.part, radius=0.1), V, r"points must be finite"),
    # -- ShardTensor / scatter / reshard / meshes ----------------------------------------------------
    ("from_local/string", lambda e: ms.ShardTensor.from_local("x", e.mesh), T, r"'local' to be a torch.Tensor"),
    ("from_local/mesh string", lambda e: ms.ShardTensor.from_local(e.pts, "mesh"), T, r"'mesh' to be a DeviceMesh"),
    (
        "from_local/0-d",
        lambda e: ms.ShardTensor.from_local(torch.tensor(1.0), e.mesh),
        V,
        r"local must have at least one dimension",
    ),
    ("from_local/dim", lambda e: ms.ShardTensor.from_local(e.pts, e.mesh, dim=3), V, r"dim must be in \[-2, 2\)"),
    (
        "from_local/negative size",
        lambda e: ms.ShardTensor.from_local(e.pts, e.mesh, sizes=[-20]),
        V,
        r"sizes must be non-negative",
    ),
    (
        "from_local/size vs local",
        lambda e: ms.ShardTensor.from_local(e.pts, e.mesh, sizes=[19]),
        V,
        r"\[rank 0\] sizes\[0\] = 19 but the local tensor has 20",
    ),
    (
        "from_local/one size per rank",
        lambda e: ms.ShardTensor.from_local(e.pts, e.mesh, sizes=[10, 10]),
        V,
        r"sizes must have one entry per rank",
    ),
    (
        "from_local/fractional size",
        lambda e: ms.ShardTensor.from_local(e.pts, e.mesh, sizes=[20.5]),
        T,
        r"sizes must hold ints \(got 20.5\)",
    ),
    ("from_local/float tensor sizes", _sizes_tensor_float, T, r"sizes must be a 1-D integer tensor"),
    (
        "from_local/string sizes",
        lambda e: ms.ShardTensor.from_local(e.pts, e.mesh, sizes="20"),
        T,
        r"sizes must be a sequence of ints \(got str\)",
    ),
    ("scatter/string", lambda e: ms.scatter("x", [20], e.mesh), T, r"'global_tensor' to be a torch.Tensor"),
    ("scatter/0-d", lambda e: ms.scatter(torch.tensor(1.0), [1], e.mesh), V, r"global_tensor must have at least one"),
    ("scatter/sizes sum", lambda e: ms.scatter(e.pts, [19], e.mesh), V, r"partition covers 19 points but global"),
    (
        "scatter/parts vs ranks",
        lambda e: ms.scatter(e.pts, e.part, e.mesh),
        V,
        r"partition has 2 parts but mesh axis 0 has 1 ranks",
    ),
    ("scatter/negative size", lambda e: ms.scatter(e.pts, [-1], e.mesh), V, r"partition must be non-negative"),
    ("scatter/None partition", lambda e: ms.scatter(e.pts, None, e.mesh), T, r"partition must be a sequence"),
    ("scatter/mesh string", lambda e: ms.scatter(e.pts, [20], "mesh"), T, r"'mesh' to be a DeviceMesh"),
    ("scatter/dim", lambda e: ms.scatter(e.pts, [20], e.mesh, dim=2), V, r"dim must be in \[-2, 2\)"),
    ("reshard/negative", lambda e: e.x.reshard([-1]), V, r"new_sizes must be 1 non-negative ints \(got \(-1,\)\)"),
    ("reshard/sum", lambda e: e.x.reshard([19]), V, r"new_sizes must sum to N_global = 20"),
    ("reshard/count", lambda e: e.x.reshard([10, 10]), V, r"new_sizes must be 1 non-negative ints"),
    ("reshard/string", lambda e: e.x.reshard("20"), T, r"new_sizes must be a sequence of ints"),
    ("binary op/mismatched meshes", _second_mesh_binary_op, ms.ShardingError, r"different meshes"),
    ("init_mesh/zero", lambda e: ms.init_mesh(0), V, r"shape must be P or \(dp, domain\) with positive"),
    ("init_mesh/world", lambda e: ms.init_mesh((2, 2)), V, r"mesh shape \(2, 2\) has 4 ranks but the world has 1"),
    ("init_mesh/negative", lambda e: ms.init_mesh((-1, -1)), V, r"shape must be P or \(dp, domain\)"),
    ("init_mesh/3-d", lambda e: ms.init_mesh((1, 1, 1)), V, r"shape must be P or \(dp, domain\)"),
    ("init_mesh/string", lambda e: ms.init_mesh("domain"), T, r"shape must be None, an int P or a tuple"),
    ("init_mesh/float entries", lambda e: ms.init_mesh((1.0,)), T, r"shape must hold ints"),
    ("init_mesh/timeout", lambda e: ms.init_mesh(timeout=-1), V, r"timeout must be positive and finite \(got -1.0\)"),
    ("init_mesh/timeout type", lambda e: ms.init_mesh(timeout="5"), T, r"timeout must be a real number \(got str\)"),
    ("init_mesh/backend", lambda e: ms.init_mesh(backend="tcp"), V, r"backend must be 'gloo' or 'nccl'"),
    ("sync_gradients/mesh", lambda e: _sync(e, e.model, "mesh"), T, r"'mesh' to be a DeviceMesh"),
    ("sync_gradients/module", lambda e: _sync(e, "model", e.mesh), T, r"'module' to be a torch.nn.Module \(got str\)"),
    # -- neighbours / halo -------------------------------------------------------------------------
    (
        "ball_query/NaN points",
        lambda e: ms.ops.ball_query(e.nan, None, 0.3, 4),
        V,
        r"points must be finite \(found 1 row with NaN/Inf, first at row 3\)",
    ),
    (
        "ball_query/Inf queries",
        lambda e: ms.ops.ball_query(e.pts, e.inf, 0.3, 4),
        V,
        r"queries must be finite \(found 1 row with NaN/Inf, first at row 5\)",
    ),
    (
        "ball_query/negative radius",
        lambda e: ms.ops.ball_query(e.pts, None, -0.1, 4),
        V,
        r"radius must be positive and finite \(got -0.1\)",
    ),
    ("ball_query/zero radius", lambda e: ms.ops.ball_query(e.pts, None, 0.0, 4), V, r"radius must be positive"),
    (
        "ball_query/string radius",
        lambda e: ms.ops.ball_query(e.pts, None, "0.1", 4),
        T,
        r"radius must be a real number \(got str\)",
    ),
    (
        "ball_query/zero max_neighbors",
        lambda e: ms.ops.ball_query(e.pts, None, 0.1, 0),
        V,
        r"max_neighbors must be at least 1 \(got 0\)",
    ),
    (
        "ball_query/float max_neighbors",
        lambda e: ms.ops.ball_query(e.pts, None, 0.1, 2.5),
        T,
        r"max_neighbors must be an int",
    ),
    (
        "ball_query/integer coordinates",
        lambda e: ms.ops.ball_query(e.pts.long(), None, 0.1, 4),
        T,
        r"points must hold floating-point coordinates",
    ),
    ("ball_query/1-d", lambda e: ms.ops.ball_query(e.pts[:, 0], None, 0.1, 4), V, r"points must have shape \(N, D\)"),
    (
        "ball_query/dimension mismatch",
        lambda e: ms.ops.ball_query(e.pts, e.pts[:, :2], 0.1, 4),
        V,
        r"points and queries must have the same dimension D",
    ),
    (
        "ball_query/device mismatch",
        lambda e: ms.ops.ball_query(e.pts, e.meta, 0.1, 4),
        V,
        r"points and queries must be on one device",
    ),
    (
        "ball_query/meta device",
        lambda e: ms.ops.ball_query(e.meta, None, 0.1, 4),
        V,
        r"points must hold data on a real device such as cpu or cuda \(got a tensor on the 'meta' device\)",
    ),
    (
        "ball_query/backend",
        lambda e: ms.ops.ball_query(e.pts, None, 0.1, 4, backend="nope"),
        V,
        r"backend must be one of",
    ),
    (
        "ball_query/sharded and plain",
        lambda e: ms.ops.ball_query(e.x, e.pts, 0.1, 4),
        T,
        r"points and queries must both be ShardTensors or both plain",
    ),
    ("knn/NaN points", lambda e: ms.ops.knn(e.nan, None, 3), V, r"points must be finite"),
    ("knn/zero k", lambda e: ms.ops.knn(e.pts, None, 0), V, r"k must be at least 1 \(got 0\)"),
    ("knn/negative k", lambda e: ms.ops.knn(e.pts, None, -1), V, r"k must be at least 1 \(got -1\)"),
    ("knn/integer coordinates", lambda e: ms.ops.knn(e.pts.long(), None, 3), T, r"points must hold floating-point"),
    ("knn/1-d", lambda e: ms.ops.knn(e.pts[:, 0], None, 3), V, r"points must have shape \(N, D\)"),
    ("knn/meta device", lambda e: ms.ops.knn(e.meta, None, 3), V, r"points must hold data .*'meta' device"),
    ("HaloPlan/negative radius", lambda e: ms.HaloPlan.build(e.x, -1.0), V, r"radius must be positive"),
    ("HaloPlan/NaN radius", lambda e: ms.HaloPlan.build(e.x, float("nan")), V, r"radius must be positive"),
    (
        "HaloPlan/NaN points",
        lambda e: ms.HaloPlan.build(ms.scatter(e.nan, [20], e.mesh), 0.1),
        V,
        r"points must be finite",
    ),
    (
        "HaloPlan/string points",
        lambda e: ms.HaloPlan.build("x", 0.1),
        T,
        r"points must be a torch.Tensor or ShardTensor of shape \(N, D\) \(got str\)",
    ),
    (
        "HaloPlan/1-d points",
        lambda e: ms.HaloPlan.build(ms.scatter(e.pts[:, 0], [20], e.mesh), 0.1),
        V,
        r"points must have shape \(N, D\) \(got \(20,\)\)",
    ),
    (
        "HaloPlan.exchange/rows",
        lambda e: ms.HaloPlan.build(e.x, 0.1).exchange(torch.ones(7, 2)),
        V,
        r"features must have N_local = 20 rows",
    ),
    # -- models -----------------------------------------------------------------------------------
    ("Transolver/in_dim", lambda e: e.model(torch.rand(20, 5)), V, r"x must have shape \(N, 3\) or \(B, N, 3\)"),
    ("Transolver/1-d", lambda e: e.model(e.pts[:, 0]), V, r"x must have shape"),
    ("Transolver/integer input", lambda e: e.model(e.pts.long()), T, r"x must be floating-point \(got torch.int64\)"),
    (
        "Transolver/wrong device",
        lambda e: e.model(e.meta),
        V,
        r"x is on device meta but the model's parameters are on device cpu",
    ),
    ("Transolver/zero hidden", lambda e: ms.nn.Transolver(3, 1, n_hidden=0), V, r"n_hidden must be at least 1"),
    ("Transolver/negative layers", lambda e: ms.nn.Transolver(3, 1, n_layers=-1), V, r"n_layers must be at least 1"),
    (
        "Transolver/heads",
        lambda e: ms.nn.Transolver(3, 1, n_hidden=10, n_head=3),
        V,
        r"n_hidden must be divisible by n_head",
    ),
    ("Transolver/zero slices", lambda e: ms.nn.Transolver(3, 1, slice_num=0), V, r"slice_num must be at least 1"),
    ("Transolver/dropout", lambda e: ms.nn.Transolver(3, 1, dropout=1.5), V, r"dropout must be in \[0, 1\)"),
    ("PhysicsAttention/dim", lambda e: e.attention(torch.rand(20, 7)), V, r"x must have shape \(N, 8\)"),
    ("PhysicsAttention/zero heads", lambda e: ms.nn.PhysicsAttention(8, heads=0), V, r"heads must be at least 1"),
    (
        "PhysicsAttention/negative slices",
        lambda e: ms.nn.PhysicsAttention(8, slice_num=-3),
        V,
        r"slice_num must be at least 1",
    ),
    (
        "PhysicsAttention/integer input",
        lambda e: e.attention(torch.ones(20, 8, dtype=torch.long)),
        T,
        r"x must be floating-point \(got torch.int64\)",
    ),
    # -- io ---------------------------------------------------------------------------------------
    (
        "write_partitions/NaN points",
        lambda e: _write(e.nan, e.part, e.tmp / "w_nan.pvtp"),
        V,
        r"data must be finite \(found 1 row with NaN/Inf, first at row 3\)",
    ),
    (
        "write_partitions/mismatched partition",
        lambda e: _write(e.pts[:10], e.part, e.tmp / "w.pvtp"),
        V,
        r"partition covers 20 items but data has 10 points",
    ),
    (
        "write_partitions/suffix",
        lambda e: _write(e.pts, e.part, e.tmp / "w.txt"),
        V,
        r"path must be a folder or end with .pvtp or .pvtu",
    ),
    (
        "write_partitions/ghost_radius",
        lambda e: _write(e.pts, e.part, e.tmp / "w.pvtp", ghost_radius=-1.0),
        V,
        r"ghost_radius must be positive",
    ),
    ("write_partitions/data type", lambda e: _write("data", e.part, e.tmp / "w.pvtp"), T, r"data must be an \(N, 3\)"),
    (
        "write_partitions/fields",
        lambda e: _write({"pos": e.pts, "q": torch.ones(20)}, e.part, e.tmp / "w.pvtp", fields=["nope"]),
        V,
        r"fields \['nope'\] not found",
    ),
    (
        "render_partitions/mismatched partition",
        lambda e: _render(e.pts[:10], e.part, e.tmp / "r.png"),
        V,
        r"partition covers 20 items but data has 10",
    ),
    (
        "render_partitions/window",
        lambda e: _render(e.pts, e.part, e.tmp / "r.png", window_size=(0, -1)),
        V,
        r"window_size must be at least",
    ),
    ("render_partitions/data type", lambda e: _render("data", e.part, e.tmp / "r.png"), T, r"data must be an"),
    ("render_partitions/NaN points", lambda e: _render(e.nan, e.part, e.tmp / "r_nan.png"), V, r"data must be finite"),
    # -- datasets ---------------------------------------------------------------------------------
    ("DrivaerML/missing root", lambda e: _drivaerml(e.tmp / "nope"), F, r"root: .*nope is not a directory"),
    ("DrivaerML/root is a file", lambda e: _drivaerml(e.tmp / "pg"), F, r"root: .* is not a directory"),
    ("DrivaerML/missing run", lambda e: _drivaerml(e.raw, runs=[99]), F, r"runs: no folder run_<i> .*\[99\]"),
    ("DrivaerML/negative run", lambda e: _drivaerml(e.raw, runs=[-1]), F, r"runs: no folder"),
    ("DrivaerML/unknown field", lambda e: _drivaerml(e.raw, fields=["nope"])[0], V, r"field 'nope' not found"),
    ("DrivaerML/corrupt file", lambda e: _drivaerml(e.corrupt)[0], V, r"boundary_1.vtp: could not be read"),
    ("DrivaerML/index", lambda e: _drivaerml(e.raw)[5], IndexError, r"index 5 out of range for 3 runs"),
    ("preprocess/missing root", lambda e: _preprocess(e.tmp / "nope", e.tmp / "s1"), F, r"is not a directory"),
    ("preprocess/zero parts", lambda e: _preprocess(e.raw, e.tmp / "s2", parts=(0,)), V, r"parts must be positive"),
    (
        "preprocess/negative workers",
        lambda e: _preprocess(e.raw, e.tmp / "s3", workers=-1),
        V,
        r"workers must be at least 1 \(got -1\)",
    ),
    (
        "preprocess/two splits",
        lambda e: _preprocess(e.raw, e.tmp / "s4", splits=(0.5, 0.5)),
        V,
        r"splits must have 3 fractions",
    ),
    (
        "preprocess/negative splits",
        lambda e: _preprocess(e.raw, e.tmp / "s5", splits=(1.2, -0.1, -0.1)),
        V,
        r"splits must be non-negative and sum to 1",
    ),
    ("preprocess/method", lambda e: _preprocess(e.raw, e.tmp / "s6", method="nope"), V, r"method must be one of"),
    (
        "preprocess/chunk_size",
        lambda e: _preprocess(e.raw, e.tmp / "s7", chunk_size=0),
        V,
        r"chunk_size must be at least 1",
    ),
    ("preprocess/corrupt run", _preprocess_corrupt, V, r"boundary_1.vtp: could not be read"),
    (
        "preprocess/unknown option",
        lambda e: _preprocess(e.raw, e.tmp / "s8", part=(1,)),
        T,
        r"preprocess: unknown keyword argument\(s\) \['part'\] \(the store options are \['parts', ",
    ),
    (
        "PreprocessOptions/unknown field",
        lambda e: ms.datasets.PreprocessOptions().replace(part=(1,)),
        T,
        r"^PreprocessOptions: unknown keyword argument\(s\) \['part'\] \(the store options are \['parts', ",
    ),
    (
        "preprocess/options type",
        lambda e: _preprocess(e.raw, e.tmp / "s9", options=(1, 2)),
        T,
        r"preprocess: options must be a PreprocessOptions \(got tuple\)",
    ),
    (
        "DrivaerMLDataset/missing store",
        lambda e: _dataset(e.tmp / "nope", mesh=None),
        F,
        r"store: .*meta.json not found",
    ),
    (
        "DrivaerMLDataset/corrupt meta.json",
        lambda e: _dataset(e.bad_meta, mesh=None),
        V,
        r"store: .*meta.json is not valid JSON",
    ),
    ("DrivaerMLDataset/split", lambda e: _dataset(e.store, split="nope", mesh=None), V, r"split must be one of"),
    ("DrivaerMLDataset/kind", lambda e: _dataset(e.store, kind="nope", mesh=None), V, r"kind must be one of"),
    (
        "DrivaerMLDataset/num_points",
        lambda e: _dataset(e.store, num_points=-1, mesh=None),
        V,
        r"num_points must be at least 1 \(got -1\)",
    ),
    (
        "DrivaerMLDataset/fields",
        lambda e: _dataset(e.store, fields=["nope"], mesh=None),
        V,
        r"fields \['nope'\] are not in the store",
    ),
    ("DrivaerMLDataset/mesh", lambda e: _dataset(e.store, mesh="mesh"), V, r"mesh must be a DeviceMesh, None or"),
    ("DrivaerMLDataset/truncated array", _corrupt_sample, V, r"pos.npy"),
    ("DrivaerMLDataset/missing array", _missing_sample, F, r"pos.npy"),
    ("make_synthetic_drivaerml/zero runs", lambda e: _synthetic(e.tmp / "y1", 0), V, r"num_runs must be at least 1"),
    (
        "make_synthetic_drivaerml/negative cells",
        lambda e: _synthetic(e.tmp / "y2", 1, surface_cells=-5),
        V,
        r"surface_cells must be at least 32 \(got -5\)",
    ),
    ("make_synthetic_drivaerml/float runs", lambda e: _synthetic(e.tmp / "y3", 1.5), T, r"num_runs must be an int"),
    # -- the rest of the public surface, one or more cases each ---------------------------------------
    ("partition_mesh/not a mesh", lambda e: ms.partition.partition_mesh("car", 2), T, r"mesh must be a pyvista/VTK"),
    (
        "partition_mesh/zero parts",
        lambda e: ms.partition.partition_mesh(_sphere(), 0),
        V,
        r"num_parts must be at least 1",
    ),
    (
        "neighbor_radius/zero k",
        lambda e: ms.partition.neighbor_radius(e.pts, 0),
        V,
        r"num_neighbors must be at least 1",
    ),
    ("neighbor_radius/too few", lambda e: ms.partition.neighbor_radius(e.pts, 40), V, r"more than num_neighbors = 40"),
    (
        "surface_to_volume_estimate/radius",
        lambda e: ms.partition.surface_to_volume_estimate(e.pts, 2, -1.0),
        V,
        r"radius must be positive and finite \(got -1.0\)",
    ),
    (
        "surface_to_volume_estimate/parts",
        lambda e: ms.partition.surface_to_volume_estimate(e.pts, 0, 0.1),
        V,
        r"num_parts must be at least 1 \(got 0\)",
    ),
    ("repartition/plain tensor", lambda e: ms.partition.repartition(e.pts), T, r"x must be a ShardTensor"),
    ("repartition/method", lambda e: ms.partition.repartition(e.x, method="metis"), V, r"method must be one of"),
    (
        "repartition/zero parts",
        lambda e: ms.partition.repartition(e.x, num_parts=0),
        V,
        r"num_parts must be at least 1",
    ),
    (
        "Partition/float perm",
        lambda e: ms.partition.Partition(torch.zeros(3), torch.tensor([3])),
        T,
        r"perm must be an integer tensor",
    ),
    (
        "Partition/sizes",
        lambda e: ms.partition.Partition(torch.arange(3), torch.tensor([2, 2])),
        V,
        r"sizes must sum to len\(perm\) = 3 \(got sum 4\)",
    ),
    (
        "ShardSpec/negative sizes",
        lambda e: ms.ShardSpec(e.mesh, 0, 0, (-1, 4), torch.Size([3, 2])),
        V,
        r"sizes must be non-negative",
    ),
    (
        "ShardSpec/sizes vs shape",
        lambda e: ms.ShardSpec(e.mesh, 0, 0, (2, 2), torch.Size([3, 2])),
        V,
        r"sizes must sum to global_shape\[dim\] = 3 \(got sum 4\)",
    ),
    ("ShardSpec/dim", lambda e: ms.ShardSpec(e.mesh, 0, 2, (3,), torch.Size([3, 2])), V, r"dim must be in \[0, 2\)"),
    ("register_rule/not an op", lambda e: ms.register_rule("sum"), T, r"register_rule takes torch functions"),
    ("register_rule/nothing", lambda e: ms.register_rule(), T, r"register_rule needs at least one"),
    ("register_rule/rule", lambda e: ms.register_rule(torch.sin)(3), T, r"a sharding rule must be callable"),
    (
        "ShardedGraph/float edges",
        lambda e: ms.ops.ShardedGraph.from_edges(e.x, torch.zeros(2, 3)),
        V,
        r"edge_index must be an integer tensor of shape \(2, E\)",
    ),
    (
        "shard_edges/plain nodes",
        lambda e: ms.ops.shard_edges(torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 2)),
        T,
        r"nodes must be a ShardTensor sharded along dim 0 \(got Tensor\)",
    ),
    ("cells_to_edges/float", lambda e: ms.ops.cells_to_edges(torch.zeros(3, 3)), T, r"cells must be an integer tensor"),
    (
        "simulate_graph_halo/float",
        lambda e: ms.ops.simulate_graph_halo(torch.zeros(2, 3), [1, 2], row_bytes=4),
        V,
        r"edge_index must be an integer tensor",
    ),
    (
        "slice_tokens/rows",
        lambda e: ms.ops.slice_tokens(torch.rand(20, 4), torch.rand(19, 2)),
        V,
        r"weights \(\.\.\., N, M\) and features \(\.\.\., N, C\) must agree",
    ),
    (
        "slice_sums/rows",
        lambda e: ms.ops.slice_sums(torch.rand(20, 4), torch.rand(19, 2)),
        V,
        r"weights \(\.\.\., N, M\) and features \(\.\.\., N, C\) must agree",
    ),
    (
        "finish_slice_tokens/shapes",
        lambda e: ms.ops.finish_slice_tokens(torch.rand(2, 4), torch.rand(3)),
        V,
        r"sum_wf \(\.\.\., M, C\) and sum_w \(\.\.\., M\) disagree",
    ),
    (
        "relative_l2_error/shapes",
        lambda e: ms.ops.relative_l2_error(torch.rand(3, 2), torch.rand(4, 2)),
        V,
        r"pred and target must have the same shape",
    ),
    (
        "DomainParallel/graph",
        lambda e: ms.nn.DomainParallel(e.model, None),
        T,
        r"graph must be a meshshard.ops.ShardedGraph",
    ),
    ("MeshGraphNet/zero width", lambda e: ms.nn.MeshGraphNet(0, 1, 1), V, r"node_in must be at least 1 \(got 0\)"),
    ("MeshGraphNetBlock/zero width", lambda e: ms.nn.MeshGraphNetBlock(0), V, r"hidden must be at least 1 \(got 0\)"),
    ("PointConv/float channels", lambda e: ms.nn.PointConv(1.5, 2), T, r"in_channels must be an int \(got float\)"),
    (
        "PointNetSurrogate/zero width",
        lambda e: ms.nn.PointNetSurrogate(0, 1),
        V,
        r"in_dim must be at least 1 \(got 0\)",
    ),
    ("TransolverBlock/heads", lambda e: ms.nn.TransolverBlock(10, 3, 4), V, r"dim must be divisible by heads"),
    ("chunked_forward/chunk", lambda e: ms.nn.chunked_forward(e.model, e.pts, 0), V, r"chunk_size must be at least 1"),
    (
        "chunked_forward/model",
        lambda e: ms.nn.chunked_forward(torch.nn.Linear(3, 3), e.pts, 4),
        T,
        r"Expected 'model' to be a Transolver \(got Linear\)",
    ),
    (
        "plot_partition_quality/not a dict",
        lambda e: ms.io.plot_partition_quality("q", e.part, e.tmp / "q.png"),
        T,
        r"quality must be a dict \(got str\)",
    ),
    (
        "plot_partition_quality/no ghosts",
        lambda e: ms.io.plot_partition_quality({}, e.part, e.tmp / "q.png"),
        V,
        r"quality needs a per-rank 'ghosts' entry",
    ),
    ("read_mesh/missing", lambda e: ms.io.read_mesh(e.tmp / "nope.vtp"), F, r"nope.vtp: file not found"),
    (
        "read_mesh/corrupt",
        lambda e: ms.io.read_mesh(e.corrupt / "run_1" / "boundary_1.vtp"),
        ms.io.MeshReadError,
        r"boundary_1.vtp",
    ),
    ("rank_colors/negative", lambda e: ms.io.rank_colors(-1), V, r"num_parts must be >= 0 \(got -1\)"),
    ("read_partitions/missing", lambda e: ms.io.read_partitions(e.tmp / "nope.pvtp"), F, r"no partition index at"),
    (
        "write_local_partition/rank",
        lambda e: ms.io.write_local_partition(e.pts, e.tmp / "lp.pvtp", rank=-1),
        V,
        r"rank must satisfy 0 <= rank < num_ranks \(got rank=-1, num_ranks=1\)",
    ),
    (
        "write_local_partition/suffix",
        lambda e: ms.io.write_local_partition(e.pts, e.tmp / "lp.txt"),
        V,
        r"path must be a folder or end with .pvtp or .pvtu",
    ),
    (
        "write_partition_index/zero ranks",
        lambda e: ms.io.write_partition_index(e.tmp / "idx.pvtp", 0),
        V,
        r"num_ranks must be at least 1 \(got 0\)",
    ),
    ("CuratorDrivaerML/missing", lambda e: ms.datasets.CuratorDrivaerML(e.tmp / "nope"), F, r"is not a directory"),
    (
        "CuratorDrivaerML/negative density",
        lambda e: _curator_density(e, -1.2),
        V,
        r"^run_1\.npz: metadata 'air_density' must be positive and finite \(got -1\.2\)$",
    ),
    (
        "CuratorDrivaerML/infinite density",
        lambda e: _curator_density(e, float("inf")),
        V,
        r"^run_1\.npz: metadata 'air_density' must be positive and finite \(got inf\)$",
    ),
    ("load_meta/missing", lambda e: ms.datasets.load_meta(e.tmp / "nope"), F, r"meta.json not found"),
    ("TransolverConfig/zero width", lambda e: ms.nn.TransolverConfig(n_hidden=0), V, r"n_hidden must be at least 1"),
    (
        "TransolverConfig/heads",
        lambda e: ms.nn.TransolverConfig(n_hidden=12, n_head=5),
        V,
        r"n_hidden must be divisible by n_head \(got n_hidden=12, n_head=5\)",
    ),
    ("TrainConfig/steps", lambda e: _train_config(e, steps=0), V, r"steps must be at least 1 \(got 0\)"),
    ("TrainConfig/lr", lambda e: _train_config(e, lr=-1.0), V, r"lr must be positive and finite \(got -1.0\)"),
    ("TrainConfig/arch", lambda e: _train_config(e, arch="unet"), V, r"arch must be one of"),
    ("TrainConfig/path", lambda e: _train_config(e, store=3), T, r"store must be a path \(got int\)"),
    ("MeshGraphNetConfig/zero width", lambda e: ms.training.MeshGraphNetConfig(hidden=0), V,
     r"hidden must be at least 1 \(got 0\)"),
    (
        "train/not a config",
        lambda e: ms.training.train({"steps": 3}),
        T,
        r"cfg must be a meshshard.training.TrainConfig",
    ),
    (
        "train/missing store",
        lambda e: ms.training.train(_train_config(e, store=e.tmp / "nope")),
        F,
        r"meta.json not found",
    ),
    (
        "evaluate/missing checkpoint",
        lambda e: ms.training.evaluate(e.store, e.tmp / "nope.pt"),
        F,
        r"nope.pt not found",
    ),
    (
        "load_checkpoint/not a checkpoint",
        lambda e: ms.training.load_checkpoint(_text_file(e, "notes.pt")),
        CheckpointError,
        r"notes.pt is not a checkpoint written by 'meshshard train' \(torch.load failed: Unsupported operand 110\)",
    ),
    (
        "check_resume/not a checkpoint",
        lambda e: ms.training.check_resume(_train_config(e, out=_text_file(e, "checkpoint.pt").parent)),
        CheckpointError,
        r"checkpoint.pt is not a checkpoint written by 'meshshard train'",
    ),
    (
        "convert_checkpoint/missing",
        lambda e: ms.training.convert_checkpoint(e.tmp / "nope.pt", e.tmp / "new.pt"),
        F,
        r"nope.pt not found",
    ),
    (
        "load_meta/path outside the store",
        lambda e: ms.datasets.load_meta(_escaping_store(e)),
        DatasetError,
        r"order_of holds '../../etc', which is not a plain file name .* store paths cannot point outside the store",
    ),
    ("features/missing fields", lambda e: ms.training.features({}, {}), V, r"features needs a sample with"),
    ("ghost_counts/radius", lambda e: ms.partition.ghost_counts(e.pts, e.part, -1.0), V, r"radius must be"),
    ("read_points/missing", lambda e: ms.io.read_points(e.tmp / "nope.npy"), FileNotFoundError, r"file not found"),
    ("plan/zero parts", lambda e: ms.planning.plan(num_points=100, parts=0), V, r"^parts must be at least 1 \(got 0\)"),
    ("plan/no cloud", lambda e: ms.planning.plan(parts=2), V, r"give num_points or data"),
    ("plan/radius", lambda e: ms.planning.plan(num_points=100, parts=2, radius=-1.0), V, r"^radius must be positive"),
    ("plan/too many parts", lambda e: ms.planning.plan(num_points=3, parts=4), V, r"^parts \(4\) is more than the 3"),
    ("plan/method", lambda e: ms.planning.plan(num_points=100, parts=2, method="x"), V, r"method must be one of"),
    ("car_cloud/zero points", lambda e: ms.planning.car_cloud(0), V, r"n must be at least 1 \(got 0\)"),
    (
        "car_cloud/kind",
        lambda e: ms.planning.car_cloud(10, kind="wing"),
        V,
        r"kind must be one of \('surface', 'volume'\) \(got 'wing'\)",
    ),
    ("car_surface_points/negative", lambda e: ms.planning.car_surface_points(-1), V, r"n must be at least 1"),
    (
        "activation_bytes_per_point/zero width",
        lambda e: ms.planning.activation_bytes_per_point(0, 1, 1, 1, 1),
        V,
        r"n_hidden must be at least 1",
    ),
    ("part_sizes/zero parts", lambda e: ms.planning.part_sizes(10, 0), V, r"parts must be at least 1 \(got 0\)"),
    (
        "part_sizes/negative points",
        lambda e: ms.planning.part_sizes(-1, 2),
        V,
        r"num_points must be a non-negative int",
    ),
]


def _ids(case) -> str:
    return case.values[0] if hasattr(case, "values") else case[0]


@pytest.mark.parametrize("case, call, error, match", CASES, ids=[_ids(c) for c in CASES])
def test_bad_input_raises_a_clear_error(env, case, call, error, match):
    with pytest.raises(error, match=match) as info:
        try:
            call(env)
        except Exception as exc:  # the library never exits: a user's `except Exception` catches every error
            assert not isinstance(exc, SystemExit)
            raise
    # never an error raised deep inside torch: the innermost frame is meshshard's own check
    innermost = info.traceback[-1].path
    assert "meshshard" in str(innermost) or "site-packages" not in str(innermost), (case, str(innermost))


#: Public modules whose ``__all__`` lists the entry points a user can call.
PUBLIC_MODULES = (
    "meshshard",
    "meshshard.partition",
    "meshshard.tensor",
    "meshshard.ops",
    "meshshard.nn",
    "meshshard.io",
    "meshshard.datasets",
    "meshshard.training",
    "meshshard.planning",
)

#: Entry points without a bad-input case here, and why.
EXEMPT = {
    "ShardTensor": "constructed through ShardTensor.from_local / scatter / reshard, which have cases",
    "ReplicatedTensor": "a result type (reductions return it); no public constructor",
    "Neighbors": "a result type returned by ball_query / knn",
    "ShardedEdges": "a result type returned by shard_edges",
    "MeshPartition": "a result type returned by partition_mesh",
    "PreprocessReport": "a result type returned by preprocess",
    "CommCounter": "takes no input: its fields are what it counts",
    "has_rule": "a question about any object; it answers False for anything that is not a registered op",
    "validate_enabled": "takes no input (reads MESHSHARD_VALIDATE)",
    "Plan": "a result type returned by plan",
    "RankPlan": "a result type (Plan.ranks)",
    "GhostEstimate": "a result type (Plan.estimate)",
    "format_plan": "formats the Plan that plan() returned",
}

#: Entry points whose cases are named after the method users call.
CASE_NAMES = {"ShardTensor": ("from_local", "reshard")}


def _public_entry_points() -> set[str]:
    import importlib
    import inspect

    names = set()
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.ismodule(value) or not callable(value):
                continue
            if inspect.isclass(value) and issubclass(value, BaseException):
                continue
            names.add(name)
    return names


def test_the_catalogue_covers_every_public_entry_point():
    covered = {_ids(c).split("/")[0].split(".")[0] for c in CASES}
    public = _public_entry_points()
    assert {"partition", "ball_query", "Transolver", "write_partitions", "preprocess"} <= public  # the reader works
    missing = sorted(name for name in public - set(EXEMPT) if name not in covered)
    assert not missing, f"public entry points without a bad-input case: {missing}"
    for name, methods in CASE_NAMES.items():
        assert set(methods) <= covered, (name, set(methods) - covered)
    stale = sorted(set(EXEMPT) - public)
    assert not stale, f"EXEMPT names that are no longer public: {stale}"


def test_meta_json_of_a_good_store_is_json(env):
    assert isinstance(json.loads((Path(env.store) / "meta.json").read_text()), dict)
