"""Exit soak: run the README's tour under torchrun, and ``meshshard train --nproc 2``, many times; count exit codes.

    .venv/bin/python benchmarks/exit_soak.py [--tour 50] [--train 20] [--hogs 4] [--store STORE]

A job whose ranks finished their work must exit 0; the failure this counts is the abort at exit
(SIGABRT, "terminate called without an active exception", from gloo threads alive during interpreter
finalization; see ``meshshard.device_mesh``). ``--hogs`` CPU-bound processes run beside the jobs the
whole time (a starved CPU is when the race was lost). Every rank also reports, from its last ``atexit``
hook, whether a gloo thread was still alive (the abort's precondition, ``tests/_exit_probe``), so a
run shows the precondition even when the race is won.

``--store``: a preprocessed store partitioned for 2 ranks (e.g. ``demo_out/store`` after ``make demo``);
without it, the demo's store (6 synthetic runs of ~8000 surface cells, parts 1 and 2) is built in a
temporary folder first. Results: ``benchmarks/results/exit_soak.json``, rewritten after every run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests._exit_probe import GLOO_THREADS, exit_threads, probe_env  # noqa: E402
from tests.test_readme import python_blocks  # noqa: E402


def _tour() -> str:
    blocks = [b for b in python_blocks() if b.startswith("# torchrun")]
    if len(blocks) != 1:
        raise SystemExit(f"exit_soak: expected one torchrun block in README.md (found {len(blocks)})")
    return blocks[0]


def _demo_store(folder: Path) -> Path:
    from meshshard.datasets import make_synthetic_drivaerml, preprocess

    make_synthetic_drivaerml(folder / "raw", 6, surface_cells=8000, volume_cells=0, seed=0)
    report = preprocess(folder / "raw", folder / "store", parts=(1, 2), method="rcb", workers=2, progress=False)
    if not report.ok:
        raise SystemExit(f"exit_soak: preprocessing failed: {report.failed}")
    return folder / "store"


def _one(kind: str, cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> dict:
    t0 = time.perf_counter()
    try:
        res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, err = res.returncode, res.stderr
    except subprocess.TimeoutExpired as exc:
        rc, err = "timeout", (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) \
            else (exc.stderr or "")
    threads = exit_threads(err)
    entry = {
        "kind": kind,
        "rc": rc,
        "seconds": round(time.perf_counter() - t0, 1),
        "abort": "terminate called" in err or "SIGABRT" in err,
        "ranks_reporting": len(threads),
        "ranks_with_gloo_threads_at_exit": sum(bool(set(n) & set(GLOO_THREADS)) for n in threads.values()),
        "load_avg_1min": round(os.getloadavg()[0], 1),
    }
    if rc != 0:
        entry["stderr_tail"] = err[-3000:]
    return entry


def _summary(runs: list[dict]) -> dict:
    out = {}
    for kind in sorted({r["kind"] for r in runs}):
        mine = [r for r in runs if r["kind"] == kind]
        codes: dict[str, int] = {}
        for r in mine:
            codes[str(r["rc"])] = codes.get(str(r["rc"]), 0) + 1
        out[kind] = {"runs": len(mine), "exit_codes": codes, "aborts": sum(r["abort"] for r in mine),
                     "runs_with_gloo_threads_at_exit": sum(r["ranks_with_gloo_threads_at_exit"] > 0 for r in mine),
                     "median_s": sorted(r["seconds"] for r in mine)[len(mine) // 2],
                     "mean_load_avg": round(sum(r["load_avg_1min"] for r in mine) / len(mine), 1)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tour", type=int, default=50, help="runs of the README's torchrun tour (2 ranks)")
    parser.add_argument("--train", type=int, default=20, help="runs of meshshard train --nproc 2")
    parser.add_argument("--hogs", type=int, default=4, help="CPU-bound processes running beside the jobs")
    parser.add_argument("--steps", type=int, default=5, help="training steps per train run")
    parser.add_argument("--store", type=Path, help="a store partitioned for 2 ranks (default: build the demo's)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "exit_soak.json")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run before it counts as hung")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped early: still kill the hogs, keep the counts

    env = probe_env({**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                     "VTK_DEFAULT_OPENGL_WINDOW": "vtkEGLRenderWindow",
                     "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    runs: list[dict] = []
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="exit_soak_") as tmp:
        work = Path(tmp)
        store = args.store if args.store is not None else (_demo_store(work / "demo") if args.train else None)
        (work / "tour.py").write_text(_tour())
        tour = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "tour.py"]
        hogs = [subprocess.Popen([sys.executable, "-c", "while True:\n    pass"]) for _ in range(args.hogs)]
        try:
            # interleaved (tour, train, tour, ...), so a soak stopped early has counts of both
            plan = sorted([("tour", i, i / max(args.tour, 1)) for i in range(args.tour)]
                          + [("train", i, (i + 0.5) / max(args.train, 1)) for i in range(args.train)],
                          key=lambda p: p[2])
            for kind, i, _ in plan:
                if kind == "tour":
                    cmd = tour
                else:
                    cmd = [sys.executable, "-m", "meshshard.cli", "train", str(store), "--out", str(work / f"t{i}"),
                           "--nproc", "2", "--steps", str(args.steps), "--n-hidden", "32", "--n-layers", "2",
                           "--n-head", "4", "--slice-num", "16", "--checkpoint-every", str(args.steps)]
                entry = _one(kind, cmd, work, env, args.timeout)
                runs.append(entry)
                print(f"{kind} {i + 1}: rc {entry['rc']}  {entry['seconds']:6.1f} s  load {entry['load_avg_1min']}"
                      f"{'  ABORT' if entry['abort'] else ''}"
                      f"{'  gloo threads at exit' if entry['ranks_with_gloo_threads_at_exit'] else ''}", flush=True)
                result = {"started": started, "hogs": args.hogs, "cpus": os.cpu_count(),
                          "platform": platform.platform(), "summary": _summary(runs), "runs": runs}
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(result, indent=1))
        finally:
            for hog in hogs:
                hog.kill()
            for hog in hogs:
                hog.wait(timeout=30)
    summary = _summary(runs)
    print(json.dumps(summary, indent=1))
    bad = sum(r["rc"] != 0 for r in runs)
    print(f"{len(runs) - bad}/{len(runs)} runs exited 0")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
