"""Replay ownership after finalization: selected, consumed, evicted, always by group id."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import msgspec
import pytest

from eventlog import NO_STREAM
from eventlog.log import EventLog
from eventlog.recovery.checkpoint import SNAPSHOT_NAME
from eventlog.recovery.errors import LedgerRuleError, StaleAttemptError
from eventlog.recovery.vocabulary import (
    CONTROLLER_STREAM,
    EPOCH_STREAM,
    REPLAY_STREAM,
    ReplayEvicted,
    StaleResultRejected,
)
from tests.fixtures.ledger import (  # noqa: F401
    Harness,
    backend_harness_fixture,
    sqlite_harness_fixture,
)
from tests.vocabulary import LogNote


@pytest.fixture(name="harness")
def _harness_on_each_backend(backend_harness: Harness) -> Harness:
    """Every test here runs on SQLite and on the real PostgreSQL server (the in-memory data
    plane), and on SQLite with the real TransferQueue."""
    return backend_harness


def _finalize(h: Harness, gid: str) -> None:
    h.finalize(gid)


def _finalized(h: Harness, *group_ids: str) -> None:
    for gid in group_ids:
        h.reserve(gid, n=1)
        h.dispatch(gid)
        h.seal(gid, 0)
        _finalize(h, gid)


def test_finalized_groups_move_from_the_ledger_to_the_replay_buffer(harness: Harness) -> None:
    h = harness
    _finalized(h, "g1", "g2")
    assert h.ledger.state.groups == {}
    assert [e.group_id for e in h.ledger.replay.entries("ready")] == ["g1", "g2"]
    h.run(lambda cut: h.ledger.replay.select(cut, ["g2"], step=3))
    with pytest.raises(LedgerRuleError, match="was selected for step 3, not consumed by step 4"):
        h.run(lambda cut: h.ledger.replay.consume(cut, ["g2"], step=4))
    assert h.run(lambda cut: h.ledger.replay.consume(cut, ["g2"], step=3)) == ["g2"]
    with pytest.raises(LedgerRuleError, match="cannot select: the replay buffer does not own it"):
        h.run(lambda cut: h.ledger.replay.select(cut, ["g2"], step=4))
    assert [e.group_id for e in h.ledger.replay.entries()] == ["g1"]


def test_a_selected_group_cannot_be_evicted_until_released(harness: Harness) -> None:
    h = harness
    _finalized(h, "g1")
    h.run(lambda cut: h.ledger.replay.select(cut, ["g1"], step=1))
    with pytest.raises(LedgerRuleError, match="cannot evict while it is selected"):
        h.run(lambda cut: h.ledger.replay.evict(cut, ["g1"], reason="stale"))
    h.run(lambda cut: h.ledger.replay.release(cut, ["g1"], reason="step failed"))
    assert h.run(lambda cut: h.ledger.replay.evict(cut, ["g1"], reason="stale")) == ["g1"]


def test_removal_by_id_under_concurrent_mutation_never_hits_the_wrong_group(
    harness: Harness,
) -> None:
    h = harness
    _finalized(h, "g1", "g2", "g3", "g4")

    async def scenario() -> tuple[list[str], list[str]]:
        first_listed = asyncio.Event()
        other_done = asyncio.Event()

        async def evictor_by_position() -> list[str]:
            # Decides on "the second and third ready groups", then yields before removing.
            async with h.barrier.mutation("group_removals") as cut:
                ready = h.ledger.replay.entries("ready")
                chosen = [ready[1].group_id, ready[2].group_id]  # ids taken before any await
            first_listed.set()
            await other_done.wait()
            async with h.barrier.mutation("group_removals") as cut:
                return h.ledger.replay.evict(cut, chosen, reason="stale")

        async def concurrent_remover() -> list[str]:
            await first_listed.wait()
            async with h.barrier.mutation("group_removals") as cut:
                removed = h.ledger.replay.evict(cut, ["g1", "g2"], reason="window moved")
            other_done.set()
            return removed

        first, other = await asyncio.gather(evictor_by_position(), concurrent_remover())
        return first, other

    removed_by_first, removed_by_other = asyncio.run(scenario())
    # Positions shifted under the first task (g1 left); it still removed exactly g3 and skipped
    # g2, which the other task had already taken. g4 was never named, so it survives.
    assert removed_by_other == ["g1", "g2"]
    assert removed_by_first == ["g3"]
    assert [e.group_id for e in h.ledger.replay.entries()] == ["g4"]
    evictions = [
        r.event for r in h.log.read_stream(REPLAY_STREAM) if isinstance(r.event, ReplayEvicted)
    ]
    assert [e.group_ids for e in evictions] == [["g1", "g2"], ["g3"]]


def test_replay_ownership_comes_back_with_a_restore(harness: Harness) -> None:
    h = harness
    _finalized(h, "g1", "g2")
    h.checkpoint(1)
    h.run(lambda cut: h.ledger.replay.select(cut, ["g1", "g2"], step=2))
    h.run(lambda cut: h.ledger.replay.consume(cut, ["g1", "g2"], step=2))
    h.fresh_process()
    plan = h.run(lambda cut: h.ledger.restore(cut, h.dataset))
    assert plan.replay_group_ids == ["g1", "g2"]
    assert {e.status for e in h.ledger.replay.entries()} == {"ready"}


def test_a_checkpoint_keeps_the_versions_of_the_work_in_flight_not_of_every_group_trained(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A weeks-long run trains millions of groups. Were every group stream's version kept in
    each snapshot (and in the ledger's memory), both would grow with the run, and every
    restore with them; a group that left is looked up in the log if a command names it
    (a reused id, a late result's record)."""
    h = harness
    _finalized(h, "g1", "g2", "g3")
    h.run(lambda cut: h.ledger.replay.select(cut, ["g1", "g2"], step=1))
    h.run(lambda cut: h.ledger.replay.consume(cut, ["g1"], step=1))
    h.run(lambda cut: h.ledger.replay.evict(cut, ["g3"], reason="stale"))
    h.reserve("g4", n=1)
    h.checkpoint(1)
    found = h.log.load_snapshot(SNAPSHOT_NAME)
    assert found is not None
    versions = msgspec.msgpack.decode(found[1])["versions"]
    kept = {s: v for s, v in versions.items() if s.startswith("group/")}
    assert kept == {s: h.log.stream_version(s) for s in ("group/g2", "group/g4")}
    assert versions[REPLAY_STREAM] == h.log.stream_version(REPLAY_STREAM)

    reads: list[str] = []
    stream_version = EventLog.stream_version

    def counted(log: EventLog, stream: str) -> int | None:
        reads.append(stream)
        return stream_version(log, stream)

    monkeypatch.setattr(EventLog, "stream_version", counted)
    with pytest.raises(LedgerRuleError, match="'g1': the id was already used"):
        h.reserve("g1", n=1)  # a trained group's id: its stream is read, and it is refused
    assert reads == ["group/g1"]
    h.dispatch("g4")  # a group in flight: at the version the ledger kept, nothing read
    assert reads == ["group/g1"]


def _trained(h: Harness, group_id: str, step: int) -> None:
    _finalized(h, group_id)
    h.run(lambda cut: h.ledger.replay.select(cut, [group_id], step=step))
    h.run(lambda cut: h.ledger.replay.consume(cut, [group_id], step=step))


def _late_result(h: Harness, group_id: str) -> StaleAttemptError:
    """The error a late result of the group's first attempt gets once the group left."""
    with pytest.raises(StaleAttemptError) as caught:
        h.ledger.check_result(group_id, 0, f"{group_id}_g0")
    return caught.value


def test_a_reopened_ledger_keeps_no_version_of_a_stream_it_never_appends_to(
    sqlite_harness: Harness,
) -> None:
    """An open reads the versions of every stream written after its snapshot (attempt
    streams, other applications' streams): the next checkpoint keeps only the ledger's own
    streams and its groups', or each reopening would pin more of them for good."""
    h = sqlite_harness
    h.log.append("another-app", [LogNote(text="not the ledger's")], NO_STREAM)
    for step, group_id in enumerate(["g1", "g2", "g3"], start=1):
        _trained(h, group_id, step)  # workers wrote the attempt stream of g{step}_g0
        h.reopen()  # a process that goes on with the run, its data plane kept
        h.checkpoint(step)
    found = h.log.load_snapshot(SNAPSHOT_NAME)
    assert found is not None
    assert sorted(msgspec.msgpack.decode(found[1])["versions"]) == [
        CONTROLLER_STREAM,
        EPOCH_STREAM,
        REPLAY_STREAM,
    ]


def test_a_late_result_of_a_group_that_left_is_recorded_with_no_read_on_the_loop(
    sqlite_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint dropped the trained group's version. Checking a late result reads it
    (it tells a late result from an unknown group) and keeps it for the record; a record
    the ledger did not check reads it in a thread (on PostgreSQL a round trip the loop
    would otherwise wait for)."""
    h = sqlite_harness
    _trained(h, "g1", 1)
    h.checkpoint(1)
    reads: list[str] = []
    stream_version = EventLog.stream_version

    def counted(log: EventLog, stream: str) -> int | None:
        on_loop = threading.current_thread() is threading.main_thread()
        reads.append("here" if on_loop else "thread")
        return stream_version(log, stream)

    monkeypatch.setattr(EventLog, "stream_version", counted)

    def record(stale: StaleAttemptError) -> None:
        async def recorded() -> None:
            async with h.barrier.mutation("seal") as cut:
                await h.ledger.record_rejected_result_async(cut, stale)

        asyncio.run(recorded())

    record(_late_result(h, "g1"))
    assert reads == ["here"]  # the check's own read, nothing for the record
    h.checkpoint(2)  # drops it again
    reads.clear()
    unchecked = StaleAttemptError(
        "late", group_id="g1", generation_index=0, rollout_id="g1_g0", current_rollout_id=None
    )
    record(unchecked)
    assert reads == ["thread"]
    late = [r for r in h.records("group/g1") if isinstance(r.event, StaleResultRejected)]
    assert len(late) == 2


def test_a_read_begun_before_a_checkpoint_is_not_kept_after_it(
    sqlite_harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version read for a stream the ledger did not hold may predate an append of ours
    whose version the checkpoint then dropped: kept, it would be stale, and the ledger's next
    append to that stream would fail and fence the ledger. (Found by review: a late result
    recorded while `unused_group_id_async` read the same trained group's stream.)"""
    h = sqlite_harness
    _trained(h, "g1", 1)
    h.checkpoint(1)
    gate, began = threading.Event(), threading.Event()
    stream_version = EventLog.stream_version

    def held(log: EventLog, stream: str) -> int | None:
        found = stream_version(log, stream)
        if stream == "group/g1" and not began.is_set():
            began.set()
            assert gate.wait(60)  # it read `found`: what follows lands before it returns
        return found

    monkeypatch.setattr(EventLog, "stream_version", held)

    async def race() -> str:
        pending = asyncio.ensure_future(h.ledger.unused_group_id_async("g1"))
        assert await asyncio.to_thread(began.wait, 60)
        async with h.barrier.mutation("seal") as cut:  # our append to group/g1 ...
            h.ledger.record_rejected_result(cut, _late_result(h, "g1"))
        async with h.barrier.checkpoint() as cut:  # ... whose version this drops
            h.ledger.checkpoint(cut, step=2, directory=str(tmp_path / "step_2" / "data_plane"))
        gate.set()
        return await pending

    assert asyncio.run(race()) == "g1-r1"
    monkeypatch.setattr(EventLog, "stream_version", stream_version)
    h.run(lambda cut: h.ledger.record_rejected_result(cut, _late_result(h, "g1")))
    late = [r for r in h.records("group/g1") if isinstance(r.event, StaleResultRejected)]
    assert len(late) == 2
