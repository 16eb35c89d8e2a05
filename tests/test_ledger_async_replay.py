"""The asyncio forms of the replay buffer's commands and what the async ledger runs off the loop.

What is pinned: `select_async` / `consume_async` await the log's group commit and share it with
commands on groups; two replay commands take turns (one stream), and the later one decides
again on what the earlier adopted; a command waiting for keys in flight runs its body again
only once they are free, not on every commit that lands meanwhile; an async command's
data-plane deletion runs outside the event loop's thread; finalize takes the weight versions its
seals read (no attempt stream read again on the loop), and a receipt naming a key not seen
before is checked against the log again.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import pytest

from eventlog.recovery import ledger as ledger_module
from eventlog.recovery.barrier import Cut
from eventlog.recovery.errors import LedgerRuleError
from eventlog.recovery.ledger import RecoveryLedger
from eventlog.recovery.vocabulary import (
    REPLAY_STREAM,
    PromptRef,
    Receipt,
    ReplayConsumed,
    RowsCleared,
    attempt_stream,
    group_stream,
)
from projections.siblings import GroupState
from tests.fixtures.ledger import Harness, backend_harness_fixture, make_prompt  # noqa: F401
from tests.test_ledger_async import in_flight_together, ready, same_as_rebuilt, seal_async


@pytest.fixture(name="harness")
def _harness_on_each_backend(backend_harness: Harness) -> Harness:
    """Every test here runs on SQLite and on the real PostgreSQL server (the in-memory data
    plane), and on SQLite with the real TransferQueue."""
    return backend_harness


def _finalized(h: Harness, *group_ids: str) -> None:
    for gid in group_ids:
        h.reserve(gid, n=1)
        h.dispatch(gid)
        h.seal(gid, 0)
        h.finalize(gid)


def _rows(h: Harness, gid: str) -> list[str]:
    return next(list(e.canonical_row_ids) for e in h.ledger.replay.entries() if e.group_id == gid)


def test_replay_select_and_consume_async_share_commits_with_commands_on_groups(
    harness: Harness,
) -> None:
    h = harness
    _finalized(h, "g1")
    ready(h, "g2", "g3")
    rows = _rows(h, "g1")

    selected, commits = in_flight_together(
        h,
        lambda cut: h.ledger.replay.select_async(cut, ["g1"], step=1),
        seal_async(h, "g2", 0),
        submitting=2,
    )
    assert selected == [None, True]
    assert commits == 1
    assert [e.status for e in h.ledger.replay.entries()] == ["selected"]

    consumed, commits = in_flight_together(
        h,
        lambda cut: h.ledger.replay.consume_async(cut, ["g1"], step=1),
        seal_async(h, "g3", 1),
        submitting=2,
    )
    assert consumed == [["g1"], True]
    assert commits == 1
    assert h.ledger.replay.entries() == []
    cleared = [r.event for r in h.records(REPLAY_STREAM) if isinstance(r.event, RowsCleared)]
    assert [c.keys for c in cleared] == [rows]  # recorded in the consume's append ...
    assert not set(rows) & set(h.data_plane.list_keys(h.ledger.training_partition))  # deleted
    assert same_as_rebuilt(h)


def test_replay_commands_in_flight_take_turns_and_the_later_decides_again(
    harness: Harness,
) -> None:
    h = harness
    _finalized(h, "g1", "g2")
    h.run(lambda cut: h.ledger.replay.select(cut, ["g1", "g2"], step=1))

    removed, commits = in_flight_together(
        h,
        lambda cut: h.ledger.replay.consume_async(cut, ["g1", "g2"], step=1),
        lambda cut: h.ledger.replay.consume_async(cut, ["g2"], step=1),
    )

    # The second waited for the first (one replay stream) and then found g2 gone: nothing to
    # do, nothing appended (deciding on what it saw before the wait would consume g2 twice).
    assert removed == [["g1", "g2"], []]
    assert commits == 1
    consumed = [r.event for r in h.records(REPLAY_STREAM) if isinstance(r.event, ReplayConsumed)]
    assert [c.group_ids for c in consumed] == [["g1", "g2"]]
    assert same_as_rebuilt(h)


def test_a_waiting_command_runs_again_only_once_its_keys_are_free(
    harness: Harness,
) -> None:
    h = harness
    n = 6
    looked_up: Counter[str] = Counter()

    class Counted(dict[str, Any]):
        """A prompt that counts its reads of `prompt_id`: one per run of a reserve's body
        (its stream-version read, counted before, is now made once and kept)."""

        def get(self, key: str, default: Any = None) -> Any:
            if key == "prompt_id":
                looked_up[group_stream(self["prompt_id"].removeprefix("p-"))] += 1
            return super().get(key, default)

    def reserve(gid: str) -> Callable[[Cut], Awaitable[GroupState]]:
        prompt = Counted(make_prompt(gid))
        return lambda cut: h.ledger.reserve_async(
            cut,
            group_id=gid,
            prompt=prompt,
            prompt_ref=PromptRef(sample_id=gid, task_name="math"),
            expected_generations=2,
            start_weight_version=0,
            admitted=True,
            target_step=1,
            admission_id="a1",
            granularity="sibling",
        )

    gids = [f"g{i}" for i in range(n)]
    results, commits = in_flight_together(h, *(reserve(g) for g in gids))

    assert [r.group_id for r in results if isinstance(r, GroupState)] == gids
    assert commits == n  # one admission: one after the other
    once = looked_up[group_stream(gids[0])]  # the first never waited: one run
    runs = [looked_up[group_stream(g)] / once for g in gids]
    # Each waiting reserve runs once when submitted and once more when its turn comes;
    # running every waiting body again on each commit that lands, the last would run n times.
    assert runs == [1.0] + [2.0] * (n - 1)
    assert list(h.ledger.state.admissions["a1"]) == gids
    assert same_as_rebuilt(h)


class _ThreadNoting:
    """A data plane that notes which thread deletes rows (everything else passes through)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.deleted_in: list[threading.Thread] = []

    def delete_rows(self, partition: str, keys: Iterable[str]) -> None:
        self.deleted_in.append(threading.current_thread())
        self.inner.delete_rows(partition, keys)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_async_finalize_discard_and_consume_delete_rows_outside_the_loop_thread(
    harness: Harness,
) -> None:
    h = harness
    _finalized(h, "g0")
    h.run(lambda cut: h.ledger.replay.select(cut, ["g0"], step=1))
    for gid in ("g1", "g2"):
        h.reserve(gid, n=1)
        h.dispatch(gid)
        h.seal(gid, 0)
    h.run(lambda cut: h.ledger.start_finalization(cut, "g1", owner="f"))
    h.put_canonical_rows("g1")
    noting = _ThreadNoting(h.data_plane)
    ledger = RecoveryLedger.open(h.log, noting)  # the same log, deleting through `noting`

    async def main() -> threading.Thread:
        async with h.barrier.mutation("test") as cut:
            await ledger.finalize_async(cut, "g1", owner="f", min_weight_version=0)
            await ledger.discard_async(cut, "g2", reason="test")
            await ledger.replay.consume_async(cut, ["g0"], step=1)
        return threading.current_thread()

    loop_thread = asyncio.run(main())

    assert len(noting.deleted_in) == 3  # staging rows of g1 and g2, canonical rows of g0
    assert all(t is not loop_thread for t in noting.deleted_in)


def attempt_streams_finalize_reads(h: Harness, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Seal a 3-sibling group, then finalize it; the attempt streams finalize read."""
    h.reserve("g1", n=3)
    h.dispatch("g1")
    for index in range(3):
        h.seal("g1", index)
    h.run(lambda cut: h.ledger.start_finalization(cut, "g1", owner="f"))
    h.put_canonical_rows("g1")
    read: list[str] = []
    read_stream = h.log.read_stream

    def noted(stream: str, *args: Any, **kwargs: Any) -> Any:
        read.append(stream)
        return read_stream(stream, *args, **kwargs)

    monkeypatch.setattr(h.log, "read_stream", noted)
    h.run(lambda cut: h.ledger.finalize(cut, "g1", owner="f", min_weight_version=0))
    (finalized,) = [r.event for r in h.records(group_stream("g1")) if r.type == "GroupFinalized"]
    assert finalized.weight_versions == [[0], [0], [0]]  # what the staged rows carry
    assert same_as_rebuilt(h)
    return [s for s in read if s.startswith("attempt/")]


def test_finalize_reads_no_attempt_stream_its_seals_already_read(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert attempt_streams_finalize_reads(harness, monkeypatch) == []


def test_the_kept_staged_reads_are_bounded_and_a_forgotten_one_is_read_again(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempts that never finalize (refused, rolled back) must not grow the ledger for
    weeks: past STAGED_READS_KEPT the kept reads are dropped (the third seal finds two kept),
    and finalize reads them again."""
    monkeypatch.setattr(ledger_module, "STAGED_READS_KEPT", 2)
    read = attempt_streams_finalize_reads(harness, monkeypatch)
    assert {attempt_stream(f"g1_g{index}") for index in (0, 1)} <= set(read)


def test_a_receipt_naming_a_key_staged_after_a_refusal_is_checked_against_the_log_again(
    harness: Harness,
) -> None:
    h = harness
    h.reserve("g1", n=1)
    h.dispatch("g1")
    rid = h.start_generation("g1", 0)
    two = h.stage(rid, calls=2)
    early = Receipt(rollout_id=rid, staging_keys=[*two.staging_keys, f"{rid}/call-2"])

    def seal(receipt: Receipt) -> Callable[[Cut], bool]:
        return lambda cut: h.ledger.seal_sibling(
            cut, "g1", 0, rollout_id=rid, receipt=receipt, reward=1.0, mask_sample=False
        )

    with pytest.raises(LedgerRuleError, match="never staged"):
        h.run(seal(early))  # call-2 is not staged yet
    three = h.stage(rid, calls=3)  # now it is

    assert h.run(seal(three)) is True
    assert same_as_rebuilt(h)


def test_an_async_seal_reads_its_attempt_stream_outside_the_loop_thread(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    ready(h, "g1")
    seal = seal_async(h, "g1", 0)
    read_in: list[threading.Thread] = []
    read_stream = h.log.read_stream

    def noted(stream: str, *args: Any, **kwargs: Any) -> Any:
        if stream.startswith("attempt/"):
            read_in.append(threading.current_thread())
        return read_stream(stream, *args, **kwargs)

    monkeypatch.setattr(h.log, "read_stream", noted)

    async def main() -> tuple[bool, threading.Thread]:
        async with h.barrier.mutation("test") as cut:
            return await seal(cut), threading.current_thread()

    sealed, loop_thread = asyncio.run(main())

    assert sealed is True
    assert read_in and all(t is not loop_thread for t in read_in)
    assert same_as_rebuilt(h)


def test_a_seal_after_read_staged_async_reads_nothing_and_the_read_ran_off_the_loop(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller reads a result's attempt stream before it waits for the group's turn
    (issue 12: holding the group through each read made its siblings wait for all of them);
    the seal then finds the read kept."""
    h = harness
    h.reserve("g1", n=2)
    h.dispatch("g1")
    rid = h.rollout_id("g1", 0)
    h.start_generation("g1", 0)
    receipt = h.stage(rid)
    reads: list[tuple[str, bool]] = []
    read_stream = h.log.read_stream

    def noted(stream: str, *args: Any, **kwargs: Any) -> Any:
        reads.append((stream, threading.current_thread() is threading.main_thread()))
        return read_stream(stream, *args, **kwargs)

    monkeypatch.setattr(h.log, "read_stream", noted)

    async def main() -> list[tuple[str, bool]]:
        await h.ledger.read_staged_async(receipt)
        before_seal = list(reads)
        async with h.barrier.mutation("test") as cut:
            await h.ledger.seal_sibling_async(
                cut, "g1", 0, rollout_id=rid, receipt=receipt, reward=1.0, mask_sample=False
            )
        return before_seal

    before_seal = asyncio.run(main())

    assert before_seal == [(attempt_stream(rid), False)]
    assert reads == before_seal  # the seal read nothing more
    assert h.ledger.group("g1").siblings[0].current.status == "sealed"
    assert same_as_rebuilt(h)


def test_a_failed_read_staged_async_is_left_to_the_seal_which_reads_again(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read ahead of the group's turn is an optimisation: when it fails, nothing is kept
    and it raises nothing; the seal reads the attempt stream itself and seals."""
    h = harness
    h.reserve("g1", n=2)
    h.dispatch("g1")
    rid = h.rollout_id("g1", 0)
    h.start_generation("g1", 0)
    receipt = h.stage(rid)
    read_stream = h.log.read_stream
    reads: list[str] = []

    def first_fails(stream: str, *args: Any, **kwargs: Any) -> Any:
        reads.append(stream)
        if len(reads) == 1:
            raise OSError("the server went away")
        return read_stream(stream, *args, **kwargs)

    monkeypatch.setattr(h.log, "read_stream", first_fails)

    async def main() -> None:
        await h.ledger.read_staged_async(receipt)
        async with h.barrier.mutation("test") as cut:
            await h.ledger.seal_sibling_async(
                cut, "g1", 0, rollout_id=rid, receipt=receipt, reward=1.0, mask_sample=False
            )

    asyncio.run(main())

    assert reads == [attempt_stream(rid)] * 2  # the seal read it again
    assert h.ledger.group("g1").siblings[0].current.status == "sealed"
    assert same_as_rebuilt(h)
