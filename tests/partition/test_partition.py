"""The Partition record: construction, derived fields, shards, reordering, save/load, errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from meshshard.partition import Partition, partition


def test_manual_from_perm_and_sizes():
    part = Partition(perm=torch.tensor([2, 0, 3, 1, 4]), sizes=torch.tensor([2, 0, 3]))
    assert part.method == "manual" and part.params == {} and part.boxes is None and part.regions is None
    assert part.offsets.tolist() == [0, 2, 2, 5]
    assert part.owner.tolist() == [0, 2, 0, 2, 2]
    assert part.num_parts == 3 and part.num_points == 5
    assert part.shard_indices(0).tolist() == [2, 0]
    assert part.shard_indices(1).tolist() == []
    assert part.shard_indices(2).tolist() == [3, 1, 4]
    assert repr(part) == "Partition(method='manual', num_parts=3, num_points=5, sizes=[2, 0, 3])"


def test_accepts_lists_and_numpy():
    a = Partition(perm=[1, 0], sizes=[1, 1])
    b = Partition(perm=np.array([1, 0]), sizes=np.array([1, 1]))
    assert torch.equal(a.owner, b.owner) and a.perm.dtype == torch.long


def test_from_owner_is_stable():
    owner = torch.tensor([2, 0, 2, 1, 0, 2])
    part = Partition.from_owner(owner, 4)
    assert part.sizes.tolist() == [2, 1, 3, 0]
    assert part.perm.tolist() == [1, 4, 3, 0, 2, 5]
    assert torch.equal(part.owner, owner)
    assert Partition.from_owner(np.array([0, 0]), 1, method="x").method == "x"


def test_apply_and_unapply_round_trip():
    part = Partition(perm=torch.tensor([2, 0, 1]), sizes=torch.tensor([1, 2]))
    x = torch.tensor([[10.0, 1.0], [20.0, 2.0], [30.0, 3.0]])
    y = part.apply(x)
    assert y[:, 0].tolist() == [30.0, 10.0, 20.0]
    assert torch.equal(part.unapply(y), x)
    assert part.apply(np.array([10, 20, 30])).tolist() == [30, 10, 20]
    assert part.unapply(np.array([30, 10, 20])).tolist() == [10, 20, 30]


def test_shards_cover_apply_order():
    pts = torch.rand(200, 3, generator=torch.Generator().manual_seed(0))
    part = partition(pts, 5)
    ordered = part.apply(pts)
    for r in range(5):
        lo, hi = part.offsets[r].item(), part.offsets[r + 1].item()
        assert torch.equal(ordered[lo:hi], pts[part.shard_indices(r)])


def test_save_load_round_trip(tmp_path):
    pts = torch.rand(300, 3, generator=torch.Generator().manual_seed(1))
    part = partition(pts, 4, method="hilbert", fractions=[0.1, 0.2, 0.3, 0.4])
    part.save(tmp_path / "p.pt")
    back = Partition.load(tmp_path / "p.pt")
    assert torch.equal(back.perm, part.perm) and torch.equal(back.sizes, part.sizes)
    assert torch.equal(back.boxes, part.boxes) and torch.equal(back.regions, part.regions)
    assert back.method == "hilbert" and back.params == part.params
    manual = Partition(perm=torch.tensor([1, 0]), sizes=torch.tensor([2]))
    manual.save(str(tmp_path / "m.pt"))
    assert Partition.load(str(tmp_path / "m.pt")).boxes is None


def test_load_rejects_other_files(tmp_path):
    torch.save({"perm": torch.arange(3)}, tmp_path / "x.pt")
    with pytest.raises(ValueError, match="does not hold a saved Partition"):
        Partition.load(tmp_path / "x.pt")


def test_frozen_and_to():
    part = Partition(perm=torch.tensor([0, 1]), sizes=torch.tensor([1, 1]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        part.sizes = torch.tensor([2, 0])
    moved = part.to("cpu")
    assert moved is not part and torch.equal(moved.owner, part.owner) and moved.device.type == "cpu"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"perm": torch.tensor([0, 0, 1])}, ValueError, r"perm must be a permutation of 0..2"),
        ({"perm": torch.tensor([0, 1, 3])}, ValueError, r"perm must be a permutation of 0..2"),
        (
            {"perm": torch.tensor([0.0, 1.0, 2.0])},
            TypeError,
            r"perm must be an integer tensor \(got torch.float32\)",
        ),
        ({"perm": torch.zeros(3, 1, dtype=torch.long)}, ValueError, r"perm must be one-dimensional"),
        ({"sizes": torch.tensor([2, 2])}, ValueError, r"sizes must sum to len\(perm\) = 3 \(got sum 4\)"),
        ({"sizes": torch.tensor([4, -1])}, ValueError, r"sizes must be non-negative"),
        ({"sizes": torch.tensor([], dtype=torch.long)}, ValueError, r"sizes must have at least one part"),
        ({"perm": "abc"}, TypeError, r"perm must be a LongTensor \(got str\)"),
        ({"boxes": torch.zeros(3, 2, 3)}, ValueError, r"boxes must have shape \(2, 2, D\)"),
        ({"method": 5}, TypeError, r"method must be a string"),
    ],
)
def test_bad_construction(kwargs, error, match):
    args = {"perm": torch.tensor([2, 0, 1]), "sizes": torch.tensor([1, 2]), **kwargs}
    with pytest.raises(error, match=match):
        Partition(**args)


def test_bad_use():
    part = Partition(perm=torch.tensor([2, 0, 1]), sizes=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"rank must lie in \[0, 2\) \(got 2\)"):
        part.shard_indices(2)
    with pytest.raises(TypeError, match=r"rank must be an integer \(got float\)"):
        part.shard_indices(1.0)
    with pytest.raises(ValueError, match=r"tensor must have num_points = 3 rows \(got shape \(2, 4\)\)"):
        part.apply(torch.zeros(2, 4))
    with pytest.raises(TypeError, match=r"tensor must be a torch.Tensor or numpy.ndarray \(got list\)"):
        part.apply([1, 2, 3])
    with pytest.raises(ValueError, match=r"owner must lie in \[0, num_parts=2\) \(found 5\)"):
        Partition.from_owner(torch.tensor([0, 5]), 2)
    with pytest.raises(ValueError, match=r"num_parts must be at least 1"):
        Partition.from_owner(torch.tensor([0]), 0)


def test_pickle_and_deepcopy():
    import copy
    import pickle

    part = partition(torch.rand(40, 3, generator=torch.Generator().manual_seed(2)), 3)
    for clone in (pickle.loads(pickle.dumps(part)), copy.deepcopy(part)):
        assert torch.equal(clone.perm, part.perm) and torch.equal(clone.shard_indices(2), part.shard_indices(2))
