"""``meshshard/device_mesh.py``: ``init_mesh`` builds the 1-D domain mesh and the 2-D (dp, domain) mesh."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

import meshshard as ms
from meshshard.device_mesh import mesh_device_type
from meshshard.testing import run_distributed
from tests._exit_probe import GLOO_THREADS, exit_threads, probe_env


def _describe(shape):
    mesh = ms.init_mesh(shape)
    domain = mesh.get_group("domain")
    return {
        "names": mesh.mesh_dim_names,
        "shape": tuple(mesh.shape),
        "device": mesh_device_type(),
        "domain_ranks": dist.get_process_group_ranks(domain),
    }


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [1, 3])
def test_a_1d_mesh_spans_the_world_on_the_domain_axis(world):
    for got in run_distributed(_describe, world, None, timeout=300):
        assert got == {"names": ("domain",), "shape": (world,), "device": "cpu", "domain_ranks": list(range(world))}
    assert run_distributed(_describe, world, world, timeout=300)[0]["shape"] == (world,)


@pytest.mark.timeout(600)
def test_a_2d_mesh_groups_consecutive_ranks_into_domains():
    got = run_distributed(_describe, 4, (2, 2), timeout=300)
    assert [g["names"] for g in got] == [("dp", "domain")] * 4
    assert [g["domain_ranks"] for g in got] == [[0, 1], [0, 1], [2, 3], [2, 3]]


_EXIT_SCRIPT = """
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import meshshard as ms


KEEP = []                                           # alive until finalization, as module globals are


def main():
    mesh = {mesh}
    KEEP.extend([mesh, {mesh}])                     # two equal meshes, distinct objects, each with its registry
    rank = dist.get_rank()
    x = ms.ShardTensor.from_local(torch.ones(3 + rank, 2), mesh, sizes=[3, 4])
    assert float(ms.ShardTensor.from_local(torch.ones(3 + rank, 2), KEEP[1], sizes=[3, 4]).sum()) == 14.0
    total = float((x * 2).sum())                    # an all-reduce
    assert total == 28.0, total
    w = torch.ones(2, requires_grad=True)
    opt = torch.optim.AdamW([w])                    # imports torch.distributed.nn.functional after the group exists
    (x * w).mean().backward()
    opt.step()


if __name__ == "__main__":
    main()
    {end}
"""


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mesh, end", [
    ("ms.init_mesh()", "dist.destroy_process_group()"),               # the README's pattern
    ('init_device_mesh("cpu", (2,), mesh_dim_names=("domain",))', "pass"),   # torch's mesh, group never destroyed
])
def test_a_torchrun_script_ends_with_no_gloo_thread_left_for_finalization(tmp_path, mesh, end):
    """The SIGABRT at exit needs a gloo backend alive during finalization; meshshard's atexit hook destroys it.

    The probe (tests/_exit_probe) lists each rank's native threads from the last atexit hook, so this
    fails on every run where the precondition holds, not only when a starved CPU loses the race.
    """
    script = tmp_path / "job.py"
    script.write_text(_EXIT_SCRIPT.format(mesh=mesh, end=end))
    root = str(Path(__file__).resolve().parents[1])
    env = probe_env({**os.environ, "OMP_NUM_THREADS": "1",
                     "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])})
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                          str(script)], capture_output=True, text=True, timeout=500, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    threads = exit_threads(res.stderr)
    assert sorted(threads) == [0, 1], res.stderr[-3000:]
    for rank, names in threads.items():
        assert not set(names) & set(GLOO_THREADS), f"rank {rank} enters finalization with {names}"
