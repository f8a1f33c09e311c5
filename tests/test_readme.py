"""Every Python block of README.md runs as a script, so the README cannot rot.

A block whose first line is ``# torchrun ... --nproc-per-node N FILE`` runs under torchrun on N
ranks; every other block runs with ``python``. Each block runs in its own empty folder, with this
checkout first on ``PYTHONPATH`` (also for spawned workers and torchrun's ranks).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def _command(block: str, script: Path) -> list[str]:
    first = block.splitlines()[0]
    if first.startswith("# torchrun"):
        match = re.search(r"--nproc[-_]per[-_]node[ =](\d+)", first)
        assert match, f"a torchrun block must say how many ranks: {first!r}"
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={match.group(1)}",
                str(script)]
    return [sys.executable, str(script)]


def test_the_readme_has_python_blocks():
    blocks = python_blocks()
    assert len(blocks) >= 4
    assert any(b.startswith("# torchrun") for b in blocks)
    assert all('if __name__ == "__main__":' in b for b in blocks if "run_distributed" in b or "preprocess(" in b)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_block_runs(index, tmp_path):
    block = python_blocks()[index]
    script = tmp_path / ("tour.py" if block.startswith("# torchrun") else f"block_{index}.py")
    script.write_text(block)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VTK_DEFAULT_OPENGL_WINDOW": "vtkEGLRenderWindow",
           "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run(_command(block, script), cwd=tmp_path, env=env, timeout=800, capture_output=True, text=True)
    assert res.returncode == 0, f"README block {index} failed:\n{block}\n--- stdout\n{res.stdout[-3000:]}\n" \
                                f"--- stderr\n{res.stderr[-5000:]}"
