"""`make gpu-check` in dry mode: the same script end to end on the CPU, so it never rots between GPU slots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.gpu_check import CHECKS, format_table

ROOT = Path(__file__).resolve().parents[2]
HARDWARE_ONLY = {"sharded_multigpu_nccl"}  # needs several GPUs: skipped, saying why


def _run(tmp_path: Path, *args: str, env: dict | None = None, timeout: float = 1800) -> tuple[dict, str, int]:
    out = tmp_path / "report.json"
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "tools.gpu_check", "--dry", "--out", str(out), *args],
        env={**os.environ, "PYTHONPATH": path, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )
    assert out.exists(), proc.stdout + proc.stderr
    return json.loads(out.read_text()), proc.stdout, proc.returncode


@pytest.mark.timeout(1900)
def test_dry_mode_runs_every_check_and_passes(tmp_path):
    report, stdout, code = _run(tmp_path, "--budget", "1500")
    assert report["mode"] == "dry" and report["device"] == "cpu"
    assert [c["name"] for c in report["checks"]] == [c.name for c in CHECKS]
    for c in report["checks"]:
        if c["name"] in HARDWARE_ONLY:
            assert c["status"] == "skipped" and "CUDA devices" in c["summary"], c
        else:
            assert c["status"] == "passed", (c["name"], c["summary"], c.get("details", {}).get("traceback"))
    assert code == 0 and report["passed"]
    assert "all checks passed" in stdout and format_table(report) in stdout
    checks = {c["name"]: c["details"] for c in report["checks"]}
    # what the figures and checks must carry, so a GPU run's report can be read without the script
    assert checks["environment"]["heavy_modules_loaded"] == []
    assert "grid" in checks["neighbors_cuda_equals_cpu"]["backends"]
    assert checks["sharded_multirank_one_gpu_gloo"]["world3/gloo"]["sizes"][1] == 0  # an empty shard
    runs = checks["fig_transolver_train_1M"]["runs"]
    assert runs["plain"]["step_s"] > 0 and len(runs["plain"]["losses"]) == 3
    assert checks["fig_chunked_inference_8_8M"]["runs"]["rel_err"] < 1e-5
    assert all(r["equal_to_cpu"] for r in checks["fig_partition_10M"]["runs"].values())
    figures = checks["fig_neighbors_1M_10M"]["figures"]
    assert all(figures[n]["ball_query/grid"]["s"] > 0 for n in figures)


@pytest.mark.timeout(300)
def test_a_failing_hanging_or_dying_check_is_recorded_and_the_others_run(tmp_path):
    faults = ",".join([
        "partition_cuda_equals_cpu=hang",
        "models_cuda_vs_float64_cpu=raise",
        "chunked_equals_full=exit",
        "fig_partition_10M=hang-after-save",
    ])
    only = ["environment", "partition_cuda_equals_cpu", "models_cuda_vs_float64_cpu", "chunked_equals_full",
            "fig_partition_10M"]
    # time scale 0.2: the two hangs are waited out for 6 s and 8 s (the smallest limits above the runner's 5 s
    # floor for these budgets), so the test waits 14 s rather than 35 s for the same verdicts
    report, stdout, code = _run(
        tmp_path, "--time-scale", "0.2", "--only", *only, env={"MESHSHARD_GPU_CHECK_FAULT": faults}, timeout=280
    )
    checks = {c["name"]: c for c in report["checks"]}
    status = {name: (c["status"], c["summary"]) for name, c in checks.items()}
    assert status["environment"][0] == "passed"
    assert status["partition_cuda_equals_cpu"] == ("failed", "timed out after 6 s (its time budget)")
    injected = "RuntimeError: fault injected into models_cuda_vs_float64_cpu"
    assert status["models_cuda_vs_float64_cpu"] == ("failed", injected)
    assert status["chunked_equals_full"] == ("failed", "the check's process died (exit code 3)")
    assert status["fig_partition_10M"] == ("failed", "timed out after 8 s (its time budget)")
    # what the hung figure had measured before it hung is kept, and marked partial
    partial = checks["fig_partition_10M"]["details"]
    assert partial["partial"] is True and partial["runs"]["rcb"]["equal_to_cpu"] is True
    assert "morton" not in partial["runs"]
    assert code == 1 and not report["passed"]
    failed = "partition_cuda_equals_cpu, models_cuda_vs_float64_cpu, chunked_equals_full, fig_partition_10M"
    assert f"FAILED: {failed}" in stdout
