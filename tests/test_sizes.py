"""``meshshard/_sizes.py``: offsets from uneven sizes, the one source every layer uses."""

from __future__ import annotations

import torch

from meshshard._sizes import offsets_of, offsets_tensor, owner_of


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


def test_owner_of_finds_each_row_s_part_skipping_empty_parts():
    offsets = offsets_of([3, 0, 4, 0])  # (0, 3, 3, 7, 7): parts 1 and 3 own nothing
    ids = torch.arange(7)
    assert owner_of(ids, offsets).tolist() == [0, 0, 0, 2, 2, 2, 2]
    assert owner_of(ids, torch.tensor(offsets)).tolist() == [0, 0, 0, 2, 2, 2, 2]
    assert owner_of(torch.tensor([6, 0], dtype=torch.int32), offsets).dtype == torch.long
    assert owner_of(torch.tensor([[5], [1]]), offsets).tolist() == [[2], [0]]  # keeps the ids' shape
    assert owner_of(torch.tensor([-1, 7, 9]), offsets).tolist() == [-1, 4, 4]  # out of range: -1 or P
    assert owner_of(torch.zeros(0, dtype=torch.long), offsets).numel() == 0
