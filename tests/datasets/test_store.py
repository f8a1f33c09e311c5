"""``meshshard/datasets/_store.py``: the sharded store on disk.

* ``meshshard/datasets/_store.py``: headers, rows and atomic writes of the sharded store.
* Run-folder replacement: a crash at any point leaves a readable run (the old or the new one).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshshard.datasets import _store
from meshshard.datasets._store import (
    FieldStats,
    divisor_chains,
    nested_partition,
    read_npy_header,
    read_rows,
    split_runs,
)
from meshshard.datasets.drivaerml_dataset import proportional_counts


# -- Headers, rows, atomic writes ------------------------------------------------------------------------
def test_divisor_chains() -> None:
    assert divisor_chains([1, 2, 4]) == [[1, 2, 4]]
    assert divisor_chains([4, 2, 8, 1]) == [[1, 2, 4, 8]]
    assert divisor_chains([2, 3, 4, 6]) == [[2, 4], [3, 6]]
    assert divisor_chains([1, 3, 4, 12]) == [[1, 3, 12], [4]]
    assert divisor_chains([5]) == [[5]]


@pytest.mark.parametrize("method", ["rcb", "morton", "hilbert"])
@pytest.mark.parametrize("chain", [[1, 2, 4], [2, 6], [3], [1, 4, 8], [1]])
def test_nested_partition_is_contiguous_for_every_p(chain: list[int], method: str) -> None:
    points = torch.rand(301, 3, generator=torch.Generator().manual_seed(0))
    perm, sizes = nested_partition(points, chain, method)
    assert sorted(perm.tolist()) == list(range(301))
    assert sizes[1] == [301]
    for coarse, fine in zip(chain, chain[1:]):
        k = fine // coarse
        merged = [sum(sizes[fine][i * k : (i + 1) * k]) for i in range(coarse)]
        assert merged == sizes[coarse]  # every coarse part is a union of consecutive fine parts
    assert all(sum(sizes[p]) == 301 and len(sizes[p]) == p for p in chain)


def _nested_reference(points: torch.Tensor, chain: list[int], method: str) -> tuple[torch.Tensor, dict]:
    """Level-by-level re-partitioning (the definition of the nested order)."""
    from meshshard.partition import partition

    perm, current, prev, sizes = torch.arange(len(points)), [len(points)], 1, {}
    for p in chain:
        new_perm, new_sizes, start = torch.empty_like(perm), [], 0
        for size in current:
            block = perm[start : start + size]
            part = partition(points[block], p // prev, method=method)
            new_perm[start : start + size] = block[part.perm]
            new_sizes += part.sizes.tolist()
            start += size
        perm, current, prev, sizes[p] = new_perm, new_sizes, p, new_sizes
    return perm, sizes


def test_flat_rcb_equals_nested_rcb_for_powers_of_two() -> None:
    # The fast path (one RCB with P_max parts) gives the nested order's parts when N divides evenly.
    points = torch.rand(512, 3, generator=torch.Generator().manual_seed(1))
    perm, sizes = nested_partition(points, [1, 2, 4, 8], "rcb")
    ref_perm, ref_sizes = _nested_reference(points, [2, 4, 8], "rcb")
    for p in (2, 4, 8):
        assert sizes[p] == ref_sizes[p]
        offsets = np.cumsum([0, *sizes[p]])
        for r in range(p):
            got = set(perm[offsets[r] : offsets[r + 1]].tolist())
            assert got == set(ref_perm[offsets[r] : offsets[r + 1]].tolist())


def test_flat_rcb_coarse_parts_are_balanced_tree_nodes() -> None:
    points = torch.rand(37, 3, generator=torch.Generator().manual_seed(1))
    perm, sizes = nested_partition(points, [2, 4, 8], "rcb")
    for p in (2, 4, 8):
        assert all(abs(s - 37 / p) <= 1 for s in sizes[p])
    ordered = points[perm]
    left, right = ordered[: sizes[2][0]], ordered[sizes[2][0] :]
    gaps = [float(right[:, a].min() - left[:, a].max()) for a in range(3)]
    gaps += [float(left[:, a].min() - right[:, a].max()) for a in range(3)]
    assert max(gaps) >= 0  # the two halves are separated by an axis-aligned cut


def test_nested_path_for_non_powers_of_two() -> None:
    points = torch.rand(200, 3, generator=torch.Generator().manual_seed(2))
    perm, sizes = nested_partition(points, [3, 6], "rcb")
    ref_perm, ref_sizes = _nested_reference(points, [3, 6], "rcb")
    assert torch.equal(perm, ref_perm) and sizes[3] == ref_sizes[3] and sizes[6] == ref_sizes[6]


def test_split_runs() -> None:
    s = split_runs([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], (0.8, 0.1, 0.1), seed=0)
    assert [len(s[k]) for k in ("train", "val", "test")] == [8, 1, 1]
    assert sorted(s["train"] + s["val"] + s["test"]) == list(range(1, 11))
    assert split_runs(range(1, 11), (0.8, 0.1, 0.1), seed=0) == s
    assert split_runs(range(1, 11), (0.8, 0.1, 0.1), seed=1) != s
    small = split_runs([4, 5, 6], (0.8, 0.1, 0.1), seed=0)
    assert [len(small[k]) for k in ("train", "val", "test")] == [1, 1, 1]
    assert split_runs([1, 2], (1.0, 0.0, 0.0), 0) == {"train": [1, 2], "val": [], "test": []}
    with pytest.raises(ValueError, match=r"splits must be non-negative and sum to 1 \(got \[0.5, 0.1, 0.1\]\)"):
        split_runs([1], (0.5, 0.1, 0.1), 0)
    with pytest.raises(ValueError, match=r"splits must have 3 fractions"):
        split_runs([1], (1.0,), 0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=6), st.integers(0, 400))
def test_proportional_counts(sizes: list[int], total: int) -> None:
    counts = proportional_counts(total, sizes)
    assert sum(counts) == min(total, sum(sizes))
    assert all(0 <= c <= s for c, s in zip(counts, sizes))
    if total < sum(sizes):
        assert all(abs(c - total * s / sum(sizes)) < 1 for c, s in zip(counts, sizes))


def test_proportional_counts_hand_made() -> None:
    assert proportional_counts(5, [10, 10]) == [3, 2]  # tie goes to the lower rank
    assert proportional_counts(6, [1, 2, 3]) == [1, 2, 3]
    assert proportional_counts(100, [3, 4]) == [3, 4]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=5), st.integers(1, 3))
def test_field_stats_merge_equals_one_pass(chunks: list[int], width: int) -> None:
    rng = np.random.default_rng(sum(chunks))
    parts = [rng.normal(3.0, 2.0, size=(n, width)).astype(np.float32) for n in chunks]
    merged = FieldStats.of(parts[0])
    for p in parts[1:]:
        merged = merged.merge(FieldStats.of(p))
    whole = np.concatenate(parts).astype(np.float64)
    assert merged.count == len(whole)
    if len(whole):
        np.testing.assert_allclose(merged.mean, whole.mean(axis=0), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(merged.std, whole.std(axis=0), rtol=1e-10, atol=1e-12)
    again = FieldStats.from_json(merged.to_json())
    assert again.count == merged.count and np.array_equal(again.m2, merged.m2)


def test_read_rows_reads_only_the_slice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    values = np.arange(60, dtype=np.float32).reshape(20, 3)
    path = tmp_path / "a.npy"
    np.save(path, values)
    header = read_npy_header(path)
    assert header.shape == (20, 3) and header.row_bytes == 12
    calls = []
    real = _store._pread

    def spy(fd: int, buffer: memoryview, offset: int) -> int:
        calls.append((len(buffer), offset))
        return real(fd, buffer, offset)

    monkeypatch.setattr(_store, "_pread", spy)
    rows = read_rows(path, 5, 9)
    np.testing.assert_array_equal(rows, values[5:9])
    assert calls == [(4 * 12, header.data_offset + 5 * 12)]
    assert read_rows(path, 7, 7).shape == (0, 3)
    with pytest.raises(ValueError, match=r"rows \[3, 21\) out of range"):
        read_rows(path, 3, 21)
    np.save(path, values[:2])
    path.write_bytes(path.read_bytes()[:-4])  # truncated after the header was written
    with pytest.raises(OSError, match="unexpected end of file"):
        read_rows(path, 0, 2, header)


# -- Run-folder replacement survives a crash at any point ------------------------------------------------
class _Crash(BaseException):
    pass


def _run(path: Path, version: int) -> Path:
    path.mkdir()
    (path / "run.json").write_text(json.dumps({"v": version}))
    return path


def _version(path: Path) -> int:
    return json.loads((path / "run.json").read_text())["v"]


def test_replace_dir_swaps_in_the_new_run_and_leaves_no_backup(tmp_path):
    final = _run(tmp_path / "run_1", 1)
    _store.replace_dir(_run(tmp_path / ".tmp-run_1", 2), final)
    assert _version(final) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run_1"]


def test_replace_dir_into_a_missing_folder(tmp_path):
    _store.replace_dir(_run(tmp_path / ".tmp-run_1", 2), tmp_path / "run_1")
    assert _version(tmp_path / "run_1") == 2


def test_failed_second_rename_puts_the_old_run_back(tmp_path, monkeypatch):
    final, new = _run(tmp_path / "run_1", 1), _run(tmp_path / ".tmp-run_1", 2)
    real_rename = os.rename

    def fail_tmp_rename(src, dst):
        if Path(src) == new:
            raise _Crash
        real_rename(src, dst)

    monkeypatch.setattr(_store.os, "rename", fail_tmp_rename)
    with pytest.raises(_Crash):
        _store.replace_dir(new, final)
    assert _version(final) == 1 and not (tmp_path / ".old-run_1").exists()


def test_a_killed_process_between_the_renames_is_recovered(tmp_path):
    # what a SIGKILL between the two renames leaves: only the backup (no rollback ran)
    backup = _run(tmp_path / ".old-run_1", 1)
    final = tmp_path / "run_1"
    assert _store.live_dir(final) == backup  # readers still find the previous version
    _store.recover_dir(final)
    assert _version(final) == 1 and not backup.exists()
    assert _store.live_dir(final) == final


def test_a_stale_backup_next_to_a_live_run_is_dropped(tmp_path):
    # a kill after the second rename but before the backup was deleted
    final, _ = _run(tmp_path / "run_1", 2), _run(tmp_path / ".old-run_1", 1)
    _store.recover_dir(final)
    assert _version(final) == 2
    _store.replace_dir(_run(tmp_path / ".tmp-run_1", 3), final)
    assert _version(final) == 3 and sorted(p.name for p in tmp_path.iterdir()) == ["run_1"]


def test_a_store_whose_run_was_left_as_a_backup_stays_readable_and_preprocess_restores_it(
    tiny_root, tiny_store, tmp_path
):
    import shutil

    import torch

    from meshshard.datasets import DrivaerMLDataset, preprocess

    store = tmp_path / "store"
    shutil.copytree(tiny_store, store)
    expected = DrivaerMLDataset(store, split="all", mesh=None)[0]
    os.rename(store / "runs" / "run_1", store / "runs" / ".old-run_1")  # killed between the renames
    got = DrivaerMLDataset(store, split="all", mesh=None)[0]
    assert all(torch.equal(got[k], expected[k]) for k in expected if isinstance(expected[k], torch.Tensor))
    report = preprocess(tiny_root, store, parts=(1, 2, 3, 4), volume=True, workers=1, sdf_backend="igl",
                        progress=False)  # fmt: skip
    assert report.ok and report.skipped == [1, 2, 3] and report.processed == []
    assert (store / "runs" / "run_1" / "run.json").is_file() and not (store / "runs" / ".old-run_1").exists()


def test_an_npy_of_python_objects_is_refused_before_any_read(tmp_path):
    path = tmp_path / "pos.npy"
    np.save(path, np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match=r"pos.npy: store arrays hold numbers \(found dtype object"):
        read_npy_header(path)
