"""Run every benchmark, side by side with its peers, and save tables, JSON and plots.

    .venv/bin/python benchmarks/run.py [--quick] [--only partition neighbors ...]

Results land in ``benchmarks/results/`` (``bench_<name>.json`` / ``.png``); each benchmark prints
its own table. ``make bench`` runs this script. Timings depend on the machine and its load: the
README's tables say which machine produced them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ("partition", "neighbors", "transolver", "dispatch", "preprocess", "io", "store", "meshgraphnet",
              "scale")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", HERE / f"bench_{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # worker processes unpickle functions by module name
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller problems (minutes, not tens of minutes)")
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, default=list(BENCHMARKS))
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    machine = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}
    done, failed = {}, {}
    for name in args.only:
        print(f"\n######## bench_{name} {'(quick)' if args.quick else ''}", flush=True)
        t0 = time.perf_counter()
        try:
            _load(name).main(quick=args.quick)
            done[name] = time.perf_counter() - t0
        except Exception as exc:  # one benchmark failing must not hide the others' results
            failed[name] = f"{type(exc).__name__}: {exc}"
            print(f"bench_{name} failed: {failed[name]}", flush=True)
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "run_summary.json").write_text(
        json.dumps({"machine": machine, "quick": args.quick, "seconds": done, "failed": failed}, indent=1)
    )
    print("\nbenchmarks done:", ", ".join(f"{k} {v:.0f} s" for k, v in done.items()))
    if failed:
        print("failed:", failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
