"""How a rebuild and a restore read the log: pinned as behaviour (speed is measured in bench/).

A rebuild reads and decodes only the record types the siblings fold handles; a restore reads
the in-flight groups' streams, the attempt streams its staging rows name and the versions it
appends at in a few queries, however many groups it brings back.
"""

from __future__ import annotations

import collections
import functools
import gc
from collections.abc import Callable
from typing import Any

import pytest

from eventlog import codec, collector
from eventlog.log import EventLog
from eventlog.recovery.checkpoint import fold_from_snapshot, fold_until
from eventlog.recovery.vocabulary import CONTROLLER_STREAM, RestoreCompleted
from projections.history import RolledBack, controller_history
from projections.siblings import FOLDED_TYPES, Folder, LedgerState, fold, state_digest
from tests.fixtures.ledger import Harness, sqlite_harness_fixture  # noqa: F401

READS = ("read", "read_stream", "read_stream_backwards", "stream_version", "stream_versions")


@pytest.fixture(name="harness")
def _sqlite(sqlite_harness: Harness) -> Harness:
    return sqlite_harness


def _run(h: Harness, groups: int) -> None:
    """`groups` groups of 3: sibling 0 sealed (rows staged), 1 dispatched with a row staged
    but not sealed, 2 reserved; a checkpoint; then more work that the restore rolls back."""
    for g in range(groups):
        gid = f"g{g}"
        h.reserve(gid, n=3)
        h.dispatch(gid, [0, 1])
        h.start_generation(gid, 0)
        h.seal(gid, 0)
        h.start_generation(gid, 1)
        h.stage(h.rollout_id(gid, 1), calls=1)
    h.checkpoint(1)
    for g in range(groups):
        h.seal(f"g{g}", 1)


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    calls: collections.Counter[str] = collections.Counter()
    for name in READS:
        method: Callable[..., Any] = getattr(EventLog, name)

        @functools.wraps(method)
        def counted(*args: Any, _name: str = name, _method: Any = method, **kw: Any) -> Any:
            calls[_name] += 1
            return _method(*args, **kw)

        monkeypatch.setattr(EventLog, name, counted)
    # Records built (a RecordedEvent with its event id): the restore's per-group reads decode
    # rows straight into events, so only the controller stream's records are built.
    import eventlog.log

    decode_row: Callable[..., Any] = eventlog.log._decode_row

    def built(*args: Any) -> Any:
        calls["record built"] += 1
        return decode_row(*args)

    monkeypatch.setattr(eventlog.log, "_decode_row", built)
    return calls


def _restore_reads(tmp_path: Any, groups: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    from tests.fixtures.ledger import open_harness

    h = open_harness(tmp_path / f"run-{groups}.db")
    try:
        _run(h, groups)
        h.fresh_process()
        with monkeypatch.context() as patch:
            calls = _count_reads(patch)
            plan = h.run(lambda cut: h.ledger.restore(cut, h.dataset), kind="recovery_restore")
        done = [r.event for r in h.log.read(streams=[CONTROLLER_STREAM])][-1]
        assert isinstance(done, RestoreCompleted)
        return calls, plan
    finally:
        h.log.close()


def test_a_restore_reads_the_log_in_as_many_calls_for_3_groups_as_for_12(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No read per group or per attempt stream: the group streams, the attempt streams that
    unreferenced rows name and the versions the restore appends at go in batched calls, and
    no record object is built per record they hold."""
    few, few_plan = _restore_reads(tmp_path, 3, monkeypatch)
    many, many_plan = _restore_reads(tmp_path, 12, monkeypatch)
    # The runs restored what they should: each group's sealed sibling kept, the other two
    # rerun, the staged-but-unsealed row cleared under its attempt (read from its stream).
    assert (few_plan.counts["groups_restored"], many_plan.counts["groups_restored"]) == (3, 12)
    assert many_plan.counts["siblings_reused"] == 12
    assert many_plan.counts["siblings_redispatched"] == 24
    assert len(many_plan.staging.clear_of_attempts) == 12
    assert many_plan.staging.clear_never_staged == []
    assert few == many, (few, many)
    assert many["read_stream"] <= 2 and many["stream_version"] <= 2, many


def test_a_restore_folds_its_restart_events_once_and_adopts_that_state(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The restore validates its restart events by folding them while it prepares; the
    ledger adopts that state instead of folding every abandon and retry again, and what it
    adopted is what the log folds to."""
    import eventlog.recovery.ledger
    from eventlog.recovery.ledger import RecoveryLedger
    from tests.fixtures.ledger import open_harness

    h = open_harness(tmp_path / "run.db")
    try:
        _run(h, 3)
        h.fresh_process()
        folded_by_ledger: list[str] = []
        real = fold

        def counted(state: LedgerState, event: Any) -> LedgerState:
            folded_by_ledger.append(type(event).__name__)
            return real(state, event)

        monkeypatch.setattr(eventlog.recovery.ledger, "fold", counted)
        plan = h.run(lambda cut: h.ledger.restore(cut, h.dataset), kind="recovery_restore")
        restarted = [r.type for r in h.log.read(types=["UnsealedAbandoned", "RetryPrepared"])]
        assert plan.counts["siblings_redispatched"] == 6 and len(restarted) == 6
        assert not {"UnsealedAbandoned", "RetryPrepared"} & set(folded_by_ledger)
        rebuilt = RecoveryLedger.open(h.log, h.data_plane, read_only=True)
        assert rebuilt.digest() == h.ledger.digest()
        assert all(h.ledger.group(f"g{g}").indices("reserved") == [1, 2] for g in range(3))
    finally:
        h.log.close()


def _log_with_a_run(h: Harness) -> None:
    _run(h, 4)
    h.reserve("late", n=2)
    h.dispatch("late")


def test_a_rebuild_decodes_only_the_types_the_fold_handles(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    _log_with_a_run(h)
    every = list(h.log.read())
    folded_here = [r for r in every if r.type in FOLDED_TYPES]
    assert len(folded_here) < len(every)  # the attempt streams' records are not the fold's
    decoded: list[str] = []
    real = codec.decode

    def counting(type_name: str, *args: Any, **kw: Any) -> Any:
        decoded.append(type_name)
        return real(type_name, *args, **kw)

    monkeypatch.setattr(codec, "decode", counting)
    head = h.log.head()
    folded = fold_from_snapshot(h.log, head, RolledBack())
    assert folded.snapshot_seq < head  # folded, not only loaded
    assert sorted(decoded) == sorted(r.type for r in folded_here if r.seq > folded.snapshot_seq), (
        "the rebuild decoded a type the fold does not handle"
    )
    assert folded.records_folded == head - folded.snapshot_seq


def test_a_rebuild_decodes_payloads_without_building_a_record_or_event_id_per_row(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fold needs each row's event (and its seq, type and stream to name a broken one):
    no RecordedEvent and no UUID per record, which cost as much as the decode itself."""
    import eventlog.log

    h = harness
    _log_with_a_run(h)
    built: list[str] = []
    for name in ("_decode_row", "decode_record", "uuid_from_bytes"):
        real: Callable[..., Any] = getattr(eventlog.log, name)

        def counted(*args: Any, _name: str = name, _real: Any = real, **kw: Any) -> Any:
            built.append(_name)
            return _real(*args, **kw)

        monkeypatch.setattr(eventlog.log, name, counted)
    head = h.log.head()
    folded = fold_from_snapshot(h.log, head, RolledBack())
    assert folded.records_folded == head - folded.snapshot_seq > 0
    assert built == []
    expected, _ = _every_record(h.log, head)  # the reference rebuild builds records
    assert built
    assert state_digest(folded.state) == state_digest(expected)


def _every_record(log: EventLog, until: int) -> tuple[LedgerState, dict[str, int]]:
    """The reference rebuild: decode and fold every record from seq 1, versions as read."""
    state, versions = LedgerState(), {}
    _, skipped = controller_history(log, until)
    for rec in log.read(until_seq=until):
        versions[rec.stream] = rec.version
        if rec.seq not in skipped:
            fold(state, rec.event)
    return state, versions


@pytest.mark.parametrize("where", ["head", "before the checkpoint", "after a restore"])
def test_the_rebuild_reaches_the_state_and_versions_of_folding_every_record(
    harness: Harness, where: str
) -> None:
    h = harness
    _log_with_a_run(h)
    if where == "after a restore":
        h.fresh_process()
        h.run(lambda cut: h.ledger.restore(cut, h.dataset), kind="recovery_restore")
        h.dispatch("g0", [1])
    until = h.log.head()
    if where == "before the checkpoint":
        until = next(r.seq for r in h.log.read(types=["CheckpointCommitted"])) - 1
    _, skipped = controller_history(h.log, until)
    state, versions = fold_until(h.log, until, skipped)
    expected_state, expected_versions = _every_record(h.log, until)
    assert state_digest(state) == state_digest(expected_state)
    # Versions as of `until`: right for every stream listed, and every stream the records
    # after the snapshot touched is listed (the ledger appends at these versions).
    assert {s: expected_versions.get(s) for s in versions} == versions
    start = fold_from_snapshot(h.log, until, skipped).snapshot_seq
    touched = {r.stream for r in h.log.read(from_seq=start + 1, until_seq=until)}
    assert touched <= versions.keys()


def test_a_restore_collects_no_garbage_while_it_prepares_and_leaves_the_collector_on(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Collections during a restore rescanned the whole heap for values that cannot form
    cycles; the collector is paused while the restore prepares, and on again afterwards,
    also when the restore fails."""
    from eventlog.recovery import restore
    from eventlog.recovery.errors import LedgerRuleError
    from tests.fixtures.ledger import open_harness

    h = open_harness(tmp_path / "run.db")
    try:
        _run(h, 3)
        h.fresh_process()
        seen: list[str] = []
        inside: list[bool] = []
        entered: list[bool] = []  # the collector's state as each preparation began

        def watch(phase: str, info: dict[str, int]) -> None:
            if phase == "start" and inside:
                seen.append(f"generation {info['generation']}")

        real = restore._prepare_restore

        def watched(*args: Any, **kw: Any) -> Any:
            inside.append(True)
            entered.append(gc.isenabled())
            try:
                return real(*args, **kw)
            finally:
                inside.clear()

        monkeypatch.setattr(restore, "_prepare_restore", watched)
        threshold = gc.get_threshold()
        gc.callbacks.append(watch)
        gc.set_threshold(1)  # a collection at every allocation, were the collector on
        try:
            plan = h.run(lambda cut: h.ledger.restore(cut, h.dataset), kind="recovery_restore")
            assert gc.isenabled()
            with pytest.raises(LedgerRuleError, match="no checkpoint at step 7"):
                h.run(lambda cut: h.ledger.restore(cut, h.dataset, step=7))
            assert gc.isenabled()
        finally:
            gc.set_threshold(*threshold)
            gc.callbacks.remove(watch)
        assert plan.counts["groups_restored"] == 3
        assert seen == []
        assert entered and not any(entered)
    finally:
        h.log.close()


def test_a_rebuild_folds_with_the_collector_paused_and_leaves_it_on(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebuild's pages of rows, events and folded values are acyclic: the collector rests
    while every record is folded (collections rescanned and promoted them), and is on again
    afterwards, also when a record breaks a rule."""
    import eventlog.recovery.checkpoint as checkpoint
    from eventlog.errors import InvalidEventError
    from projections.siblings import RuleViolation

    h = harness
    _log_with_a_run(h)
    collector_on: list[bool] = []

    class Watched(Folder):
        def __call__(self, event: Any) -> None:
            collector_on.append(gc.isenabled())
            super().__call__(event)

    monkeypatch.setattr(checkpoint, "Folder", Watched)
    assert gc.isenabled()
    folded = fold_from_snapshot(h.log, h.log.head(), RolledBack())
    assert folded.records_folded > 0 and collector_on and not any(collector_on)
    assert gc.isenabled()

    class Breaks(Folder):
        def __call__(self, event: Any) -> None:
            raise RuleViolation("broken on purpose")

    monkeypatch.setattr(checkpoint, "Folder", Breaks)
    with pytest.raises(InvalidEventError, match="on stream 'group/"):
        fold_from_snapshot(h.log, h.log.head(), RolledBack())
    assert gc.isenabled()


def test_the_ledger_state_values_are_not_tracked_by_the_collector(harness: Harness) -> None:
    """Frozen values holding only strings, numbers and other such values cannot be part of
    a cycle; untracked, a state of 10^5 siblings costs collections nothing."""
    h = harness
    _log_with_a_run(h)
    folded = fold_from_snapshot(h.log, h.log.head(), RolledBack())
    assert folded.snapshot_seq > 0  # decoded from the snapshot, then folded
    group = folded.state.groups["late"]
    for value in (group, group.siblings[0], group.siblings[0].current):
        assert not gc.is_tracked(value), type(value).__name__
    assert not gc.is_tracked(folded.state.groups["g0"].siblings[0].current)


def test_a_fold_does_not_leave_the_collector_off_when_an_append_resumes_it_meanwhile(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collector's state is the process's: the writer thread pauses it for each commit
    while a fold may run in another thread. Modelled in one thread, in the order the two
    can take: a commit pauses, the fold begins, the commit ends during the fold. The fold
    stays paused to its end, and the collector is on again afterwards (a fold that found it
    off and switched it off anyway left it off for good; one that saw it on again went on
    with collections)."""
    import eventlog.recovery.checkpoint as checkpoint

    h = harness
    _log_with_a_run(h)
    assert gc.isenabled()
    collector.pause()  # a commit in the writer thread
    commit_ended: list[bool] = []
    collector_on: list[bool] = []

    class Watched(Folder):
        def __call__(self, event: Any) -> None:
            if not commit_ended:
                collector.resume()  # the commit's `finally`, while the fold goes on
                commit_ended.append(True)
            collector_on.append(gc.isenabled())
            super().__call__(event)

    monkeypatch.setattr(checkpoint, "Folder", Watched)
    try:
        fold_from_snapshot(h.log, h.log.head(), RolledBack())
        assert commit_ended and collector_on and not any(collector_on)
        assert gc.isenabled()
    finally:
        gc.enable()
