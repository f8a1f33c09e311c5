"""meshshard._atomic: a file, or a set of files, is replaced whole or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshshard._atomic import atomic_replace, atomic_replace_all, atomic_write


def test_atomic_write_and_replace(tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    atomic_write(target, lambda f: f.write("one"))
    atomic_replace(target, lambda tmp: tmp.write_text("two"))
    assert target.read_text() == "two" and sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    target.write_text("old")

    def fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_replace(target, fail)
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_replace_all_renames_only_when_every_file_is_written(tmp_path: Path) -> None:
    paths = [tmp_path / f"p{i}.txt" for i in range(3)]
    for p in paths:
        p.write_text("old")

    def items(fail_at: int | None):
        for i, p in enumerate(paths):
            if i == fail_at:
                yield p, lambda tmp: (tmp.write_text("half"), 1 / 0)
            else:
                yield p, lambda tmp, i=i: tmp.write_text(f"new {i}")

    with pytest.raises(ZeroDivisionError):
        atomic_replace_all(items(fail_at=2))
    assert [p.read_text() for p in paths] == ["old"] * 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p0.txt", "p1.txt", "p2.txt"]
    assert atomic_replace_all(items(fail_at=None)) == paths
    assert [p.read_text() for p in paths] == ["new 0", "new 1", "new 2"]
    assert atomic_replace_all([]) == []
