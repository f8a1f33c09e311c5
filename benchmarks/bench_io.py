"""Writing per-rank partitions to VTK: meshshard.io against pyvista's own way, same data, same run.

Peers: ``pyvista`` (``extract_cells`` / ``extract_points`` per part, then ``MultiBlock.save`` to
``.vtm``: what a pyvista user writes by hand; no global ids, ranks or ghosts unless added by hand).
VTK's parallel writers (``vtkXMLP*Writer``) split by streaming pieces, not by a given partition,
and need MPI for one piece per process, so they are not a peer for this task.

Cases: a point cloud, a triangulated surface (the synthetic car) and a tetrahedral volume, each
in ``P = 8`` RCB parts, without and with ghosts. Also: the time to render the picture.

Run: ``.venv/bin/python benchmarks/bench_io.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VTK_DEFAULT_OPENGL_WINDOW", "vtkEGLRenderWindow")

import numpy as np
import pyvista as pv
import torch

from meshshard.io import read_partitions, render_partitions, write_partitions
from meshshard.partition import partition, partition_mesh

RESULTS = Path(__file__).resolve().parent / "results"
NUM_PARTS = 8


def _folder_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file()) / 2**20


def _timed(fn, repeats: int = 1) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _car(num_faces: int) -> pv.PolyData:
    from meshshard.datasets.synthetic import CarParameters, car_surface

    vertices, faces = car_surface(CarParameters.sample(np.random.default_rng(0)), num_faces)
    mesh = pv.PolyData(vertices, np.hstack([np.full((len(faces), 1), 3), faces]).ravel())
    mesh.cell_data["pMeanTrim"] = np.random.default_rng(1).normal(size=mesh.n_cells).astype(np.float32)
    return mesh


def _volume(cells_per_side: int) -> pv.UnstructuredGrid:
    n = cells_per_side + 1
    grid = pv.ImageData(dimensions=(n, n, n), spacing=(1.0 / cells_per_side,) * 3)
    grid = grid.cast_to_unstructured_grid().triangulate()
    grid.cell_data["UMeanTrim"] = np.random.default_rng(2).normal(size=(grid.n_cells, 3)).astype(np.float32)
    return grid


def _pyvista_multiblock(mesh, owner: np.ndarray, path: Path, points: bool) -> None:
    blocks = pv.MultiBlock()
    for r in range(NUM_PARTS):
        ids = np.flatnonzero(owner == r)
        blocks.append(mesh.extract_points(ids, adjacent_cells=False) if points else mesh.extract_cells(ids))
    blocks.save(path)


def _case(name: str, data, owner: np.ndarray, part, radius: float, n_items: int, work: Path) -> list[dict]:
    rows = []
    is_cloud = isinstance(data, torch.Tensor)
    variants = [(None, None), (None, "zlib"), (radius, None)]
    for ghost_radius, compression in variants:
        out = work / f"{name}_{'g' if ghost_radius else 'n'}_{compression}"
        out.mkdir()
        index = out / ("p.pvtu" if isinstance(data, pv.UnstructuredGrid) else "p.pvtp")

        def write(index=index, g=ghost_radius, c=compression):
            write_partitions(data, part, index, ghost_radius=g, compression=c)

        seconds = _timed(write)
        back = read_partitions(index)
        ids_name = "GlobalPointIds" if is_cloud else "GlobalCellIds"
        ids = np.asarray(back.point_data[ids_name] if is_cloud else back.cell_data[ids_name])
        ghost = back.point_data if is_cloud else back.cell_data
        owned = np.asarray(ghost["vtkGhostType"]) == 0 if "vtkGhostType" in ghost else np.ones(len(ids), bool)
        exact = sorted(ids[owned].tolist()) == list(range(n_items))
        rows.append({
            "case": name,
            "tool": "meshshard.io" + (f" +ghosts r={ghost_radius:.3g}" if ghost_radius else "")
            + (f" {compression}" if compression else ""),
            "items": n_items, "seconds": seconds, "MB": _folder_mb(out),
            "ghosts": int((~owned).sum()), "exact_round_trip": exact,
        })
    peer = work / f"{name}_pv"
    peer.mkdir()
    mesh = pv.PolyData(data.numpy()) if is_cloud else data
    seconds = _timed(lambda: _pyvista_multiblock(mesh, owner, peer / "p.vtm", is_cloud))
    rows.append({"case": name, "tool": "pyvista MultiBlock.save (zlib)", "items": n_items, "seconds": seconds,
                 "MB": _folder_mb(peer) + sum(_folder_mb(d) for d in peer.iterdir() if d.is_dir()),
                 "ghosts": 0, "exact_round_trip": None})
    return rows


def main(quick: bool = False) -> dict:
    """Time the writers on three data kinds; print a table; save JSON and a PNG."""
    n_cloud = 100_000 if quick else 1_000_000
    n_faces = 100_000 if quick else 1_000_000
    side = 24 if quick else 48  # 6 * side^3 tetrahedra
    rows: list[dict] = []
    work = Path(tempfile.mkdtemp(prefix="bench_io_"))
    try:
        gen = torch.Generator().manual_seed(0)
        cloud = torch.rand(n_cloud, 3, generator=gen) * torch.tensor([4.0, 2.0, 1.5])
        part = partition(cloud, NUM_PARTS)
        radius = 1.5 * float((4.0 * 2.0 * 1.5 / n_cloud) ** (1 / 3))
        rows += _case("cloud", cloud, part.owner.numpy(), part, radius, n_cloud, work)

        car = _car(n_faces)
        mesh_part = partition_mesh(car, NUM_PARTS).cells
        edge = float(np.sqrt(car.area / car.n_cells * 2))
        rows += _case("surface", car, mesh_part.owner.numpy(), mesh_part, 1.5 * edge, car.n_cells, work)

        vol = _volume(side)
        vol_part = partition_mesh(vol, NUM_PARTS).cells
        rows += _case("volume", vol, vol_part.owner.numpy(), vol_part, 1.5 / side, vol.n_cells, work)

        picture = _car(200_000)
        picture_part = partition_mesh(picture, NUM_PARTS).cells
        render_s = _timed(lambda: render_partitions(picture, picture_part, work / "car.png"))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"{'case':<8} {'tool':<38} {'items':>9} {'seconds':>8} {'MB':>8} {'ghosts':>8} exact")
    for r in rows:
        print(f"{r['case']:<8} {r['tool']:<38} {r['items']:>9} {r['seconds']:>8.2f} {r['MB']:>8.1f} "
              f"{r['ghosts']:>8} {r['exact_round_trip']}")
    print(f"render_partitions, 200k-cell car, 1200x800, two views: {render_s:.2f} s")

    result = {"quick": quick, "num_parts": NUM_PARTS, "rows": rows, "render_seconds_200k_cells": render_s}
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "bench_io_quick" if quick else "bench_io"
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2))
    _plot(rows, RESULTS / f"{stem}.png")
    return result


def _tool(row: dict) -> str:
    """The tool name without the ghost radius (which differs per case)."""
    name = row["tool"]
    return name.split(" r=")[0] + (" zlib" if name.endswith(" zlib") and " r=" in name else "")


def _plot(rows: list[dict], png: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cases = list(dict.fromkeys(r["case"] for r in rows))
    tools = list(dict.fromkeys(_tool(r) for r in rows))
    fig = Figure(figsize=(8, 4), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.8 / len(tools)
    def seconds(case: str, tool: str) -> float:
        return next((r["seconds"] for r in rows if r["case"] == case and _tool(r) == tool), 0.0)

    for k, tool in enumerate(tools):
        values = [seconds(c, tool) for c in cases]
        ax.bar(np.arange(len(cases)) + k * width, values, width, label=tool)
    ax.set_xticks(np.arange(len(cases)) + width * (len(tools) - 1) / 2, cases)
    ax.set_ylabel("seconds to write 8 pieces")
    ax.set_title("Writing per-rank VTK pieces (lower is better)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for CI")
    main(parser.parse_args().quick)
