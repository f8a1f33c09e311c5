"""``meshshard/tensor/_spec.py``: ShardSpec metadata, its checks and the specs derived from it."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import meshshard as ms
from meshshard.tensor import ShardSpec
from meshshard.tensor._spec import as_sizes


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    store = dist.FileStore(str(tmp_path_factory.mktemp("spec") / "pg"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield ms.init_mesh()
    finally:
        dist.destroy_process_group()


def test_offsets_and_lengths_follow_the_sizes(mesh):
    spec = ShardSpec(mesh, 0, 0, (7,), torch.Size([7, 3]))
    assert spec.offsets == (0, 7) and spec.num_global == 7 and spec.ndim == 2
    assert spec.rank == 0 and spec.num_ranks == 1 and spec.local_length() == 7
    assert spec.local_shape_of([7, 5]) == [7, 5]


def test_moved_and_resized_keep_the_sizes_and_recompute_the_global_shape(mesh):
    spec = ShardSpec(mesh, 0, 0, (7,), torch.Size([7, 3]))
    assert spec.moved(0, [7, 3]) is spec  # memoised identity for the unchanged layout
    moved = spec.moved(1, [2, 7, 3])
    assert moved.dim == 1 and moved.global_shape == torch.Size([2, 7, 3]) and moved.sizes == (7,)
    assert spec.same_sharding(moved)
    resized = spec.resized(0, [4], [4, 3])
    assert resized.sizes == (4,) and not spec.same_sharding(resized)


@pytest.mark.parametrize(
    "dim, sizes, shape, match",
    [
        (2, (3,), (3, 2), r"dim must be in \[0, 2\) for a 2-d global shape \(got 2\)"),
        (0, (-1, 4), (3, 2), r"sizes must be non-negative \(got \[-1, 4\]\)"),
        (0, (2, 2), (3, 2), r"sizes must sum to global_shape\[dim\] = 3 \(got sum 4\)"),
    ],
)
def test_an_inconsistent_spec_is_refused(mesh, dim, sizes, shape, match):
    with pytest.raises(ValueError, match=match):
        ShardSpec(mesh, 0, dim, sizes, torch.Size(shape))


def test_as_sizes_accepts_sequences_and_integer_tensors():
    assert as_sizes([3, 0, 2], "sizes") == (3, 0, 2)
    assert as_sizes(torch.tensor([1, 2]), "sizes") == (1, 2)
    with pytest.raises((TypeError, ValueError), match="sizes"):
        as_sizes(torch.tensor([1.5]), "sizes")
    with pytest.raises(ValueError, match="sizes"):
        as_sizes([1, -2], "sizes")
