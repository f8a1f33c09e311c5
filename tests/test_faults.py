"""Faults: a rank that dies or raises makes the others fail promptly, naming it and the operation.

The harness gives the surviving ranks a few seconds after the first failure to report their own
error; a survivor still blocked then is reported as ``timeout``. So ``kind == "exception"`` for a
survivor proves that it raised promptly, and its message is what a user would read.

Also here: nothing is lost when a write crashes (checkpoints, store metadata), and training resumes
after a crash during a checkpoint write without a repeated or skipped step.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist

import meshshard as ms
from meshshard import comm, faults
from meshshard.errors import CollectiveError
from meshshard.testing import DistributedError, run_distributed

SIZES = [5, 0, 7]


class _PoolNet(torch.nn.Module):
    """A per-point MLP with a global mean-pooled context: one all-reduce per forward.

    ``@faults.layer`` (opt-in, as on meshshard's own layers) makes a failure message name this forward.
    """

    def __init__(self) -> None:
        super().__init__()
        self.lin1 = torch.nn.Linear(3, 8)
        self.lin2 = torch.nn.Linear(8, 1)

    @faults.layer
    def forward(self, x):
        h = self.lin1(x).relu()
        return self.lin2(h + h.mean(dim=0))


def _sharded_forward(mode: str):
    """Rank 2 fails inside the forward (between lin1 and the mean); ranks 0 and 1 carry on."""
    mesh = ms.init_mesh()
    torch.manual_seed(0)
    model = _PoolNet()
    x = ms.scatter(torch.randn(sum(SIZES), 3), SIZES, mesh)
    rank = dist.get_rank()

    def hook(module, inputs, output):
        if rank != 2:
            return output
        if mode == "die":
            os._exit(3)  # no report: a segfault or an OOM kill looks like this
        # a shape bug on this rank only: raised inside a sharded op, so reported automatically
        return output @ torch.ones(7, 8)

    model.lin1.register_forward_hook(hook)
    try:
        y = model(x)
    except RuntimeError:
        if mode == "raise_then_exit" and rank == 2:
            os._exit(1)  # as a torchrun worker dies of an uncaught exception
        raise
    return float(y.sum())


def _survivors(info: pytest.ExceptionInfo) -> dict[int, str]:
    failures = {f.rank: f for f in info.value.failures}
    assert sorted(failures) == [0, 1, 2], str(info.value)
    for r in (0, 1):
        assert failures[r].kind == "exception", str(info.value)  # not "timeout": it raised promptly
        assert failures[r].message.startswith("CollectiveError: "), failures[r].message
    return {r: failures[r].message for r in (0, 1)}


def test_a_dead_rank_is_named_by_the_survivors():
    with pytest.raises(DistributedError) as info:
        run_distributed(_sharded_forward, 3, "die", timeout=5)
    assert info.value.failures[2].kind == "died"
    for rank, msg in _survivors(info).items():
        assert msg.startswith(f"CollectiveError: [rank {rank}] all_reduce ("), msg
        assert "in torch.Tensor.mean" in msg and "_PoolNet.forward" in msg, msg
        assert "rank 2 did not report (no report; it may have died" in msg, msg
        assert "backend error: RuntimeError" in msg, msg


def test_a_rank_that_raised_and_died_is_named_with_its_error():
    with pytest.raises(DistributedError) as info:
        run_distributed(_sharded_forward, 3, "raise_then_exit", timeout=5)
    for rank, msg in _survivors(info).items():
        assert f"[rank {rank}] all_reduce (in torch.Tensor.mean" in msg, msg
        assert "rank 2 failed first: torch.Tensor.matmul: RuntimeError: mat1 and mat2 shapes cannot be" in msg, msg


def test_a_rank_that_raised_and_lives_on_is_named_after_the_timeout():
    # The culprit's process stays alive, so its peers wait for the process-group timeout (2 s).
    with pytest.raises(DistributedError) as info:
        run_distributed(_sharded_forward, 3, "raise", timeout=2)
    failures = {f.rank: f for f in info.value.failures}
    assert failures[2].kind == "exception" and "mat1 and mat2 shapes cannot be" in failures[2].message
    for msg in _survivors(info).values():
        assert "rank 2 failed first: torch.Tensor.matmul: RuntimeError" in msg, msg
        assert "Timed out" in msg, msg


@pytest.fixture
def single_rank_group(tmp_path):
    """A one-rank gloo process group in this process (cheap), destroyed afterwards."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield dist.distributed_c10d._get_default_store()
    faults.clear_reports()
    dist.destroy_process_group()


def test_report_failures_writes_a_note_once(single_rank_group):
    store = single_rank_group
    key = f"{faults.FAILURE_PREFIX}0"
    with pytest.raises(FileNotFoundError), faults.report_failures("loading my shard"):
        with faults.report_failures("inner"):
            raise FileNotFoundError("run_7/surface.npy")
    note = store.get(key).decode()
    assert note.split("|", 1)[1] == "inner: FileNotFoundError: run_7/surface.npy"  # the innermost wins, once
    comm.all_reduce_(torch.ones(1))  # a one-rank collective is the identity, but the note stays
    with pytest.raises(CollectiveError), faults.report_failures():
        raise CollectiveError("a victim is not a culprit")
    assert store.get(key).decode() == note
    faults.clear_reports()
    assert not store.check([key])


def test_excepthook_reports_an_uncaught_exception(single_rank_group, monkeypatch, capsys):
    import sys

    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    faults.install_excepthook()
    try:
        raise MemoryError("CUDA out of memory")
    except MemoryError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)  # what the interpreter does before dying
    note = single_rank_group.get(f"{faults.FAILURE_PREFIX}0").decode()
    assert note.split("|", 1)[1] == "uncaught exception: MemoryError: CUDA out of memory"
    assert "MemoryError: CUDA out of memory" in capsys.readouterr().err  # the previous hook still prints


def test_a_failed_collective_without_peers_says_what_it_knows(single_rank_group, monkeypatch):
    monkeypatch.setenv("MESHSHARD_FAULT_WAIT", "0")
    err = faults.collective_failed("all_to_all", None, RuntimeError("Connection closed by peer"))
    assert isinstance(err, CollectiveError) and err.op == "all_to_all" and err.rank == 0
    assert str(err).startswith("[rank 0] all_to_all failed: unknown rank (no report; it may have died)")
    assert str(err).endswith("(backend error: RuntimeError: Connection closed by peer)")


def _caught_then_fine(_: int):
    """A failure every rank catches is retracted by the next good collective: no stale blame."""
    mesh = ms.init_mesh()
    x = ms.ShardTensor.from_local(torch.ones(2, 3), mesh, sizes=[2, 2])
    y = ms.ShardTensor.from_local(torch.ones(1, 3), mesh, sizes=[1, 3] if dist.get_rank() == 0 else [3, 1])
    with pytest.raises(ms.ShardingError):
        x + y  # raised on every rank, reported by every rank
    store = dist.distributed_c10d._get_default_store()
    key = f"{faults.FAILURE_PREFIX}{dist.get_rank()}"
    before = store.check([key])
    total = float(x.sum())  # a good collective: the notes are stale now
    return before, store.check([key]), total


def test_notes_of_caught_failures_are_retracted():
    for before, after, total in run_distributed(_caught_then_fine, 2, 0):
        assert before and not after and total == 12.0


def test_collective_error_is_a_sharding_error_with_fields():
    err = CollectiveError("[rank 0] all_reduce failed", rank=0, op="all_reduce", culprits=[2])
    assert isinstance(err, ms.ShardingError)
    assert (err.rank, err.op, err.culprits) == (0, "all_reduce", (2,))


def test_notes_need_no_process_group():
    assert not dist.is_initialized()
    exc = ValueError("x")
    faults.report_failure(exc, "op")  # no store: a no-op, never an error
    with pytest.raises(KeyError), faults.report_failures():
        raise KeyError("k")
    faults.clear_reports()


def test_fault_wait_is_configurable(monkeypatch):
    monkeypatch.setenv("MESHSHARD_FAULT_WAIT", "0.25")
    assert faults.fault_wait_s() == 0.25
    monkeypatch.setenv("MESHSHARD_FAULT_WAIT", "soon")
    assert faults.fault_wait_s() == 1.0


# -- nothing lost: crashes during writes -----------------------------------------------------------
class _Crash(Exception):
    pass


def test_store_json_write_crash_keeps_the_previous_version(tmp_path, monkeypatch):
    from meshshard.datasets import _store

    path = tmp_path / "meta.json"
    _store.atomic_write_json(path, {"version": 1})

    def half_then_crash(obj, f, **k):
        f.write('{"version": ')
        raise _Crash

    monkeypatch.setattr(_store.json, "dump", half_then_crash)
    with pytest.raises(_Crash):
        _store.atomic_write_json(path, {"version": 2})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"version": 1}


def test_store_run_folder_replacement_crash_keeps_a_readable_run(tmp_path, monkeypatch):
    from meshshard.datasets import _store

    final, new = tmp_path / "run_1", tmp_path / ".tmp-run_1"
    final.mkdir()
    (final / "run.json").write_text('{"v": 1}')
    new.mkdir()
    (new / "run.json").write_text('{"v": 2}')
    real_rename, calls = os.rename, []

    def crash_on_second_rename(src, dst):
        calls.append(src)
        if len(calls) == 2:
            raise _Crash
        real_rename(src, dst)

    monkeypatch.setattr(_store.os, "rename", crash_on_second_rename)
    with pytest.raises(_Crash):
        _store.replace_dir(new, final)
    monkeypatch.undo()
    assert json.loads((final / "run.json").read_text())["v"] == 1  # rolled back: the previous run


def test_the_context_names_the_op_the_entry_and_the_layer_from_context_variables():
    class _Layer(torch.nn.Module):
        @faults.layer
        def forward(self, x):
            return faults._context()

    class _Plain(torch.nn.Module):  # an undecorated forward is not named: no stack frame is read
        def forward(self, x):
            return faults._context()

    @faults.entry
    def build(layer):
        return layer(None)

    assert faults._context() == ""
    with faults.running_op(torch.Tensor.mean):
        assert faults._context() == " (in torch.Tensor.mean)"
        assert _Plain()(None) == " (in torch.Tensor.mean)"
        with faults.running_op(torch.add):  # the innermost op wins, and the outer one comes back
            assert _Layer()(None) == " (in torch.add, in _Layer.forward)"
            assert build(_Layer()) == " (in torch.add, in build, in _Layer.forward)"
        assert faults._context() == " (in torch.Tensor.mean)"
    assert faults._context() == ""
    assert build.__name__ == "build" and _Layer.forward.__qualname__.endswith("_Layer.forward")


def test_library_entries_and_layers_are_named():
    from meshshard.halo import HaloPlan
    from meshshard.nn import PhysicsAttention, Transolver
    from meshshard.ops import ball_query, slice_tokens

    for fn in (HaloPlan.build, HaloPlan.exchange, ball_query, slice_tokens):
        assert fn.__wrapped__ is not None, fn
    for cls in (PhysicsAttention, Transolver):
        assert cls.forward.__wrapped__ is not None, cls


#: The one module allowed to look at the call stack, and why (issue 30: no stack-frame inspection otherwise).
FRAME_READERS = {
    "_spawn.py": "check_main_guard needs the line of the main script's top-level call (code names and line "
    "numbers only, no locals), before spawning workers: a cold path that only the stack can answer",
}


def test_no_stack_frame_is_inspected_outside_the_listed_module():
    from pathlib import Path

    package = Path(faults.__file__).parent
    found = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if any(word in path.read_text() for word in ("_getframe", ".f_back", "inspect.stack", "currentframe"))
    )
    assert found == sorted(FRAME_READERS), found
