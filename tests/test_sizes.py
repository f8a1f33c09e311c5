"""``meshshard/_sizes.py``: offsets from uneven sizes, the one source every layer uses."""

from __future__ import annotations

import torch

from meshshard._sizes import offsets_of, offsets_tensor


def test_offsets_of_uneven_and_empty_sizes():
    assert offsets_of([3, 0, 5, 1]) == (0, 3, 3, 8, 9)
    assert offsets_of([]) == (0,)
    assert offsets_of(torch.tensor([2, 2])) == (0, 2, 4)


def test_offsets_tensor_matches_offsets_of():
    sizes = torch.tensor([4, 0, 0, 7], dtype=torch.int32)
    got = offsets_tensor(sizes)
    assert got.dtype == torch.long and got.tolist() == list(offsets_of(sizes.tolist()))
    assert offsets_tensor(torch.zeros(0, dtype=torch.long)).tolist() == [0]


def test_a_partition_derives_its_offsets_here():
    from meshshard.partition import Partition

    part = Partition(torch.arange(9), torch.tensor([3, 0, 6]))
    assert part.offsets.tolist() == list(offsets_of([3, 0, 6]))
