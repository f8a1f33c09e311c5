"""``meshshard/device_mesh.py``: ``init_mesh`` builds the 1-D domain mesh and the 2-D (dp, domain) mesh."""

from __future__ import annotations

import pytest
import torch.distributed as dist

import meshshard as ms
from meshshard.device_mesh import mesh_device_type
from meshshard.testing import run_distributed


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
