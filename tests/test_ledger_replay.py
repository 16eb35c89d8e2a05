"""Replay ownership after finalization: selected, consumed, evicted, always by group id."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from eventlog.log import EventLog
from eventlog.recovery.checkpoint import SNAPSHOT_NAME
from eventlog.recovery.errors import LedgerRuleError
from eventlog.recovery.vocabulary import REPLAY_STREAM, ReplayEvicted
from tests.fixtures.ledger import Harness, backend_harness_fixture  # noqa: F401


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
    restore with them; a group that left is looked up in the log if a command names it."""
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
