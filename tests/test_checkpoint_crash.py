"""A checkpoint is atomic against a crash at any step, with one checkpoint directory reused.

The walk of every crash point is DURABILITY.md §9; each case here stops a checkpoint at one
of them (the process "dies": the next one starts with an empty data plane) and restores.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from eventlog import EventLog
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.records import AppendRequest, AppendResult
from eventlog.recovery import ledger as ledger_module
from eventlog.recovery.ledger import RecoveryLedger
from eventlog.recovery.vocabulary import (
    CONTROLLER_STREAM,
    CheckpointCommitted,
    CheckpointRetired,
    RestoreCompleted,
)
from projections.siblings import state_digest
from tests.fixtures.ledger import TQ_MARKS, Harness, open_harness, tq_harness


class Crash(BaseException):
    """The process dies here (BaseException: nothing on the way may catch it)."""


def _appending(log: EventLog, event_type: type) -> Callable[[Sequence[AppendRequest]], Any]:
    original = log.append_batch

    def append_batch(requests: Sequence[AppendRequest]) -> list[AppendResult]:
        if any(isinstance(e, event_type) for r in requests for e in r.events):
            raise Crash(f"before appending {event_type.__name__}")
        return original(requests)

    return append_batch


@pytest.fixture(name="harness", params=["memory", pytest.param("transferqueue", marks=TQ_MARKS)])
def _harness_on_each_data_plane(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Harness]:
    """Every test here runs on SQLite with the in-memory data plane and with the real
    TransferQueue (whose checkpoints are folders of TQ's own files)."""
    if request.param == "memory":
        h = open_harness(tmp_path / "run.db")
    else:
        h = tq_harness(request, tmp_path / "run.db")
    try:
        yield h
    finally:
        h.log.close()


def _partial_save(h: Harness) -> Callable[[str], None]:
    """A save that got half way: a folder with a truncated file in it, where the harness's
    data plane keeps the file its load reads first."""
    name = (
        "memory-dataplane.rows"
        if isinstance(h.data_plane, InMemoryDataPlane)
        else ("transferqueue/metadata.json")
    )

    def save(location: str) -> None:
        (Path(location) / name).parent.mkdir(parents=True, exist_ok=True)
        (Path(location) / name).write_bytes(b"EVLM\x00\x01")
        raise Crash("during the data-plane save")

    return save


def _half_deleted(events: Sequence[CheckpointRetired]) -> None:
    for event in events:
        for entry in Path(event.data_plane_ref).iterdir():
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            raise Crash("in the middle of deleting a retired checkpoint")


CRASH_POINTS: dict[str, Callable[[Harness, pytest.MonkeyPatch], None]] = {
    "during the data-plane save": lambda h, mp: mp.setattr(
        h.data_plane, "save_checkpoint", _partial_save(h)
    ),
    "after the save, before CheckpointCommitted": lambda h, mp: mp.setattr(
        h.log, "append_batch", _appending(h.log, CheckpointCommitted)
    ),
    "after CheckpointCommitted, before the snapshot": lambda h, mp: mp.setattr(
        h.log, "save_snapshot", lambda *a: (_ for _ in ()).throw(Crash("before the snapshot"))
    ),
    "after the snapshot, before CheckpointRetired": lambda h, mp: mp.setattr(
        h.log, "append_batch", _appending(h.log, CheckpointRetired)
    ),
    "after CheckpointRetired, before the delete": lambda h, mp: mp.setattr(
        ledger_module,
        "delete_retired",
        lambda events: (_ for _ in ()).throw(Crash("before the delete")),
    ),
    "in the middle of the delete": lambda h, mp: mp.setattr(
        ledger_module, "delete_retired", _half_deleted
    ),
}
COMMITTED = {
    "during the data-plane save": False,
    "after the save, before CheckpointCommitted": False,
}


def _checkpoint(h: Harness, directory: Path, step: int) -> CheckpointCommitted:
    return h.run_checkpoint(
        lambda cut: h.ledger.checkpoint(cut, step=step, directory=str(directory), keep=1)
    )


def _restore_and_check(h: Harness) -> int:
    """A new process restores; the data plane holds what the log says. Returns the step."""
    h.fresh_process()
    plan = h.run(lambda cut: h.ledger.restore(cut, h.dataset), kind="recovery_restore")
    h.ledger.check_rows()
    rebuilt = RecoveryLedger.open(h.log, InMemoryDataPlane(), read_only=True)
    assert state_digest(rebuilt.state) == h.ledger.digest()
    return plan.checkpoint_step


@pytest.mark.parametrize("point", list(CRASH_POINTS))
def test_a_crash_at_any_checkpoint_step_leaves_a_restorable_run(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    h = harness
    directory = tmp_path / "checkpoints"  # the one directory every checkpoint uses
    h.reserve("g1", n=2)
    h.dispatch("g1")
    h.seal("g1", 0)
    first = _checkpoint(h, directory, step=1)
    h.seal("g1", 1)
    h.reserve("g2", n=1)
    with monkeypatch.context() as mp:
        CRASH_POINTS[point](h, mp)
        with pytest.raises(Crash):
            _checkpoint(h, directory, step=2)
    committed = COMMITTED.get(point, True)
    assert _restore_and_check(h) == (2 if committed else 1)
    assert Path(first.data_plane_ref).parent == directory
    # The run goes on with the same directory: checkpoint, crash-free this time, restore.
    h.reserve("g3", n=1)
    h.dispatch("g3")
    h.seal("g3", 0)
    third = _checkpoint(h, directory, step=3)
    assert _restore_and_check(h) == 3
    retired = [
        r.event
        for r in h.log.read_stream(CONTROLLER_STREAM)
        if isinstance(r.event, CheckpointRetired)
    ]
    assert first.step in {e.step for e in retired}
    assert all(e.deleted for e in retired)
    assert not any(Path(e.data_plane_ref).exists() for e in retired)
    assert Path(third.data_plane_ref).exists()


def test_a_step_checkpointed_twice_into_one_directory_keeps_the_committed_one(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's case: `{run_dir}/step_N` reused; the second save crashes before its commit."""
    h = harness
    directory = tmp_path / "step_1"
    h.reserve("g1", n=2)
    h.dispatch("g1")
    h.seal("g1", 0)
    h.run_checkpoint(lambda cut: h.ledger.checkpoint(cut, step=1, directory=str(directory)))
    h.seal("g1", 1)
    with monkeypatch.context() as mp:
        mp.setattr(h.log, "append_batch", _appending(h.log, CheckpointCommitted))
        with pytest.raises(Crash):
            h.run_checkpoint(lambda cut: h.ledger.checkpoint(cut, step=1, directory=str(directory)))
    assert _restore_and_check(h) == 1
    (done,) = [
        r.event
        for r in h.log.read_stream(CONTROLLER_STREAM)
        if isinstance(r.event, RestoreCompleted)
    ]
    assert done.siblings_reused == 1 and done.siblings_redispatched == 1


def test_the_leftover_of_an_uncommitted_save_is_replaced_not_kept(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    directory = tmp_path / "checkpoints"
    h.reserve("g1", n=1)
    with monkeypatch.context() as mp:
        mp.setattr(h.data_plane, "save_checkpoint", _partial_save(h))
        with pytest.raises(Crash):
            _checkpoint(h, directory, step=1)
    (leftover,) = directory.iterdir()
    (leftover / "half-written.tmp").write_bytes(b"x")
    event = _checkpoint(h, directory, step=1)  # same cut: same fresh folder, saved anew
    assert Path(event.data_plane_ref) == leftover
    assert not (leftover / "half-written.tmp").exists()
    assert _restore_and_check(h) == 1


def test_a_retired_checkpoint_is_not_restored_even_when_its_retirement_was_rolled_back(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    directory = tmp_path / "checkpoints"
    h.reserve("g1", n=1)
    _checkpoint(h, directory, step=1)
    h.dispatch("g1")
    _checkpoint(h, directory, step=2)  # retires step 1
    h.fresh_process()
    h.run(lambda cut: h.ledger.restore(cut, h.dataset, step=2), kind="recovery_restore")
    h.fresh_process()
    with pytest.raises(Exception, match="no checkpoint at step 1"):
        h.run(lambda cut: h.ledger.restore(cut, h.dataset, step=1))
