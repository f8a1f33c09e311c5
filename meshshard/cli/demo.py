"""``meshshard demo``: the main job, end to end, on embedded synthetic DrivaerML-like data.

1. synthesise car-like runs in the DrivaerML layout (skipped when already there);
2. preprocess them into a store partitioned for 1 and N ranks (finished runs are skipped);
3. train the Transolver surrogate on N CPU ranks (torchrun, gloo) on whole samples;
4. train the same model in one process on the same data, and compare the two loss trajectories;
5. evaluate both (relative L2 per field, drag coefficient vs the force CSV);
6. write ParaView files of a test car split over the N ranks (with ghosts) and a PNG;
7. print a summary.

The demo trains :data:`DEMO_MODEL`, a Transolver small enough for a few minutes on two CPU cores
(the library's defaults, :class:`~meshshard.nn.TransolverConfig`, are the authors' full-size model).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .._config import TransolverConfig
from ..errors import RunFailed, UsageError
from ._common import Formatter, add_command, positive_int
from ._inputs import check_out_folder

__all__ = ["DEMO_MODEL", "demo", "register", "run"]

#: The demo's model: small, so that training on 2 CPU ranks takes minutes (stated here, passed explicitly).
DEMO_MODEL = TransolverConfig(n_hidden=64, n_layers=3, n_head=4, slice_num=16, mlp_ratio=2)


def register(subparsers: Any, formatter_class: type[argparse.HelpFormatter] = Formatter) -> None:
    """Add the ``demo`` subcommand to an ``argparse`` subparsers object."""
    p = add_command(
        subparsers, "demo", run, formatter_class,
        summary="synthesise DrivaerML-like runs, train a sharded Transolver on N CPU ranks, compare with 1 process",
        description=(
            "The main job on embedded synthetic data: synthesise runs, preprocess them, train the sharded "
            "Transolver on --nproc ranks (torchrun, gloo), evaluate, write partition VTK files and a PNG, and "
            "compare with the same training in one process."
        ),
    )
    p.add_argument("--out", default="demo_out", help="output folder")
    p.add_argument("--nproc", type=positive_int, default=2, help="ranks")
    p.add_argument("--runs", type=positive_int, default=6, help="synthetic runs (at least 3: train, val, test)")
    p.add_argument("--surface-cells", type=positive_int, default=8000, help="surface cells per run")
    p.add_argument("--steps", type=positive_int, default=150, help="training steps")
    p.add_argument("--no-single", action="store_true", help="skip the single-process comparison")


def run(args: argparse.Namespace) -> int:
    check_out_folder("demo", args.out)
    demo(
        out=args.out,
        nproc=args.nproc,
        runs=args.runs,
        surface_cells=args.surface_cells,
        steps=args.steps,
        single=not args.no_single,
    )
    return 0


def _model_args(model: TransolverConfig) -> list[str]:
    """``--n-hidden 64 --n-layers 3 ...``: the model options of ``meshshard train`` for ``model``."""
    return [a for name, value in asdict(model).items() for a in (f"--{name.replace('_', '-')}", str(value))]


def _step(msg: str) -> None:
    print(f"\n== {msg}", flush=True)


def demo(
    out: str = "demo_out",
    nproc: int = 2,
    runs: int = 6,
    surface_cells: int = 8000,
    steps: int = 150,
    single: bool = True,
) -> dict[str, Any]:
    from ..datasets import make_synthetic_drivaerml, preprocess
    from ..training import evaluate
    from ._launch import torchrun

    if runs < 3:
        raise UsageError(f"meshshard demo: --runs must be at least 3 (train, val, test) (got {runs})")
    t_start = time.perf_counter()
    root = Path(out)
    raw, store = root / "raw", root / "store"

    _step(f"1/6 synthetic DrivaerML-like data: {runs} runs x ~{surface_cells} surface cells -> {raw}")
    have = sorted(p.name for p in raw.glob("run_*")) if raw.is_dir() else []
    if len(have) < runs:
        make_synthetic_drivaerml(raw, runs, surface_cells=surface_cells, volume_cells=0, seed=0)
    else:
        print(f"   {len(have)} runs already there")

    _step(f"2/6 preprocess into a store partitioned for P = 1 and {nproc} (rcb) -> {store}")
    report = preprocess(raw, store, parts=sorted({1, nproc}), method="rcb", workers=2, progress=False)
    if not report.ok:
        raise RunFailed(f"meshshard demo: preprocessing failed: {report.failed}")
    print(f"   processed {len(report.processed)} runs, skipped {len(report.skipped)} ({report.seconds:.1f} s)")

    common = ["--steps", str(steps), "--checkpoint-every", str(max(steps // 3, 1)), "--log-every", "25",
              *_model_args(DEMO_MODEL)]
    sharded_dir = root / f"train_p{nproc}"
    shutil.rmtree(sharded_dir, ignore_errors=True)
    m = DEMO_MODEL
    _step(f"3/6 train the sharded Transolver (C={m.n_hidden} L={m.n_layers} H={m.n_head} M={m.slice_num}) on "
          f"{nproc} CPU ranks (torchrun, gloo), {steps} steps")
    code = torchrun(nproc, ["train", str(store), "--out", str(sharded_dir), *common])
    if code != 0:
        raise RunFailed(f"meshshard demo: sharded training failed (exit code {code})")
    sharded = json.loads((sharded_dir / "train_summary.json").read_text())

    single_summary = None
    if single:
        single_dir = root / "train_p1"
        shutil.rmtree(single_dir, ignore_errors=True)
        _step(f"4/6 train the same model in ONE process (plain tensors) on the same data, {steps} steps")
        # a child process with one thread, like each rank: a fair and oversubscription-free comparison
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        code = subprocess.run(
            [sys.executable, "-m", "meshshard.cli", "train", str(store), "--out", str(single_dir), *common], env=env
        ).returncode
        if code != 0:
            raise RunFailed(f"meshshard demo: single-process training failed (exit code {code})")
        single_summary = json.loads((single_dir / "train_summary.json").read_text())
    else:
        _step("4/6 single-process comparison skipped (--no-single)")

    _step("5/6 evaluate on the test runs")
    ev_sharded = evaluate(str(store), str(sharded_dir / "checkpoint.pt"), split="test",
                          out=str(sharded_dir / "eval_test.json"))
    ev_single = (
        evaluate(str(store), str(root / "train_p1" / "checkpoint.pt"), split="test",
                 out=str(root / "train_p1" / "eval_test.json"))
        if single
        else None
    )

    _step(f"6/6 ParaView files and a picture of a test car split over {nproc} ranks")
    vis = _partition_files(raw, store, root / "partitions", nproc)

    summary = _summary(nproc, sharded, single_summary, ev_sharded, ev_single, vis, time.perf_counter() - t_start)
    (root / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\nthe graph surrogate on the same store: meshshard train {store} --model meshgraphnet "
          f"--nproc {nproc} --out {root / 'train_mgn'}")
    return summary


def _partition_files(raw: Path, store: Path, folder: Path, nproc: int) -> dict[str, Any]:
    import pyvista as pv

    from ..datasets import load_meta
    from ..io import render_partitions, write_partitions
    from ..partition import neighbor_radius, partition_mesh, quality

    meta = load_meta(store)
    run = (meta["splits"]["test"] or meta["splits"]["train"])[0]
    mesh = pv.read(raw / f"run_{run}" / f"boundary_{run}.vtp")
    part = partition_mesh(mesh, nproc, method="rcb")
    centres = mesh.cell_centers().points
    radius = neighbor_radius(centres, 32)
    folder.mkdir(parents=True, exist_ok=True)
    index = write_partitions(mesh, part, folder / f"run_{run}.pvtp", fields=["pMeanTrim", "wallShearStressMeanTrim"],
                             ghost_radius=radius)
    png = render_partitions(mesh, part, folder / f"run_{run}.png")
    q = quality(centres, part.cells, radius=radius)
    ghosts = [int(g) for g in q["ghosts"]]
    return {"run": run, "index": str(index), "png": str(png), "radius": radius,
            "points": part.cells.sizes.tolist(), "ghosts": ghosts, "imbalance": float(q["imbalance"])}


def _summary(nproc, sharded, single, ev_sharded, ev_single, vis, seconds) -> dict[str, Any]:
    losses = sharded["losses"]
    out: dict[str, Any] = {"nproc": nproc, "seconds": seconds, "sharded_losses": losses,
                           "per_rank": sharded["per_rank"], "partition": vis}
    print("\n" + "=" * 78)
    print(f"meshshard demo summary ({nproc} ranks, {len(losses)} steps, {seconds:.0f} s)")
    print("=" * 78)
    first = sum(losses[:5]) / min(5, len(losses))
    last = sum(losses[-5:]) / min(5, len(losses))
    print(f"loss (mean of first/last 5 steps), sharded:        {first:.4f} -> {last:.4f}")
    if single is not None:
        ref = single["losses"]
        diffs = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, ref)]
        out["single_losses"] = ref
        out["max_rel_loss_diff"] = max(diffs)
        out["first_step_rel_loss_diff"] = diffs[0]
        print(f"loss, single process:                              {sum(ref[:5]) / min(5, len(ref)):.4f} -> "
              f"{sum(ref[-5:]) / min(5, len(ref)):.4f}")
        print(f"sharded vs single: step-1 loss rel. diff {diffs[0]:.2e}, max over all steps {max(diffs):.2e}")
    print("\nper rank:   rank   points(last step)   peak RSS MB   ghosts@r(test car)")
    for r in sharded["per_rank"]:
        g = vis["ghosts"][r["rank"]] if r["rank"] < len(vis["ghosts"]) else "-"
        print(f"            {r['rank']:>4}   {r['points_last_step']:>17}   {r['peak_rss_mb']:>11.0f}   {g:>18}")
    print(f"(test car partition: imbalance {vis['imbalance']:.4f}, ghost radius {vis['radius']:.4f} m ~ 32 neighbours)")
    print("\ntest runs:   run   relL2 p   relL2 wss   Cd pred   Cd true   Cd csv" + ("   | single: relL2 p" if ev_single
                                                                                   else ""))
    for i, r in enumerate(ev_sharded["runs"]):
        line = (f"            {r['run']:>3}   {r['rel_l2']['pMeanTrim']:>7.4f}   "
                f"{r['rel_l2']['wallShearStressMeanTrim']:>9.4f}   {r['Cd_pred']:>7.4f}   {r['Cd_true']:>7.4f}   "
                f"{r['Cd_csv'] if r['Cd_csv'] is None else format(r['Cd_csv'], '>6.4f')}")
        if ev_single:
            line += f"   | {ev_single['runs'][i]['rel_l2']['pMeanTrim']:.4f}"
        print(line)
    out["eval_sharded"] = ev_sharded
    out["eval_single"] = ev_single
    if ev_single:
        d = max(abs(a["rel_l2"][k] - b["rel_l2"][k]) for a, b in zip(ev_sharded["runs"], ev_single["runs"])
                for k in a["rel_l2"])
        out["max_eval_rel_l2_diff"] = d
        print(f"sharded vs single test relative L2: max abs difference {d:.2e}")
    print(f"\nParaView: open {vis['index']}   picture: {vis['png']}")
    if math.isfinite(last) and last < first:
        print("loss went down: OK")
    else:
        print("WARNING: the loss did not go down")
    sys.stdout.flush()
    return out
