"""The ledger's async commands: they await the group commit instead of blocking the loop.

What is pinned: commands on different groups are in flight together and share one commit;
commands on one group are serialized (the second validates against the first's result); a
command adopts only the groups it changed (the live state is updated in place, so a group no
command touched is the very object it was). Commit counts come from `EventLog.commits`; to
make "in flight together" deterministic the log's writer is held behind its write lock, taken
by another process while the commands are submitted. Every test runs on SQLite, on
PostgreSQL and on SQLite with the real TransferQueue.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from eventlog.recovery.barrier import Cut
from eventlog.recovery.errors import LedgerRuleError
from eventlog.recovery.ledger import RecoveryLedger
from eventlog.recovery.vocabulary import (
    GenerationStarted,
    PromptRef,
    SiblingSealed,
    attempt_stream,
    group_stream,
)
from tests.fixtures.ledger import Harness, backend_harness_fixture, make_prompt  # noqa: F401
from tests.reliability import signal_at_begin, until, write_lock_held

T = TypeVar("T")


@pytest.fixture(name="harness")
def _harness_on_each_backend(backend_harness: Harness) -> Harness:
    """Every test here runs on SQLite and on the real PostgreSQL server (the in-memory data
    plane), and on SQLite with the real TransferQueue."""
    return backend_harness


def in_flight_together(
    h: Harness, *commands: Callable[[Cut], Awaitable[T]], submitting: int = 1
) -> tuple[list[T | BaseException], int]:
    """Submit `commands` while the writer is stuck on a blocker append; (results, commits).

    The blocker is an append of its own whose transaction waits for the lock another
    process holds, so everything the commands submit meanwhile queues behind it and is
    drained together once the lock goes. The lock goes once `submitting` appends were
    queued (the commands that do not wait for another's commit), not after a pause: a busy
    machine let a command read its attempt stream for longer than any pause.
    """
    blocker_began = threading.Event()  # the writer thread took the blocker, alone
    submitted = 0

    async def main() -> tuple[list[T | BaseException], int]:
        nonlocal submitted
        with contextlib.ExitStack() as lock, pytest.MonkeyPatch.context() as patches:
            lock.enter_context(write_lock_held(h.location))  # another process holds it
            signal_at_begin(patches, blocker_began)
            blocker = asyncio.ensure_future(
                h.log.append_async(attempt_stream("blocker_g0"), [blocker_event()])
            )
            await until(blocker_began.is_set)
            patches.undo()
            append_batch_async = h.log.append_batch_async

            async def counted(requests: Any) -> Any:
                nonlocal submitted
                submitted += 1  # queued in this same step, before the first await returns
                return await append_batch_async(requests)

            patches.setattr(h.log, "append_batch_async", counted)
            before = h.log.commits
            async with h.barrier.mutation("test") as cut:
                tasks = [asyncio.ensure_future(command(cut)) for command in commands]
                await until(lambda: submitted >= submitting)
                await asyncio.sleep(0.2)  # the waiting commands have run their first pass
                lock.close()  # the holder lets go
                results = await asyncio.gather(*tasks, return_exceptions=True)
            await blocker
            return list(results), h.log.commits - before - 1

    return asyncio.run(main())


def blocker_event() -> GenerationStarted:
    """Any event the ledger does not fold will do for the blocker."""
    return GenerationStarted(
        rollout_id="blocker_g0",
        group_id="blocker",
        generation_index=0,
        attempt=0,
        worker="w",
        model="m",
        weight_version=0,
    )


def seal_async(h: Harness, group_id: str, index: int) -> Callable[[Cut], Awaitable[bool]]:
    rid = h.rollout_id(group_id, index)
    receipt = h.stage(rid)
    return lambda cut: h.ledger.seal_sibling_async(
        cut, group_id, index, rollout_id=rid, receipt=receipt, reward=1.0, mask_sample=False
    )


def ready(h: Harness, *groups: str) -> None:
    for group_id in groups:
        h.reserve(group_id, n=2)
        h.dispatch(group_id)
        for index in range(2):
            h.start_generation(group_id, index)


def same_as_rebuilt(h: Harness) -> bool:
    return RecoveryLedger.open(h.log, h.data_plane).digest() == h.ledger.digest()


def test_commands_on_different_groups_are_in_flight_together_and_share_one_commit(
    harness: Harness,
) -> None:
    h = harness
    ready(h, "g1", "g2", "g3")

    results, commits = in_flight_together(
        h,
        seal_async(h, "g1", 0),
        seal_async(h, "g2", 0),
        seal_async(h, "g3", 1),
        submitting=3,
    )

    assert results == [True, True, True]
    assert commits == 1
    sealed = [(g, i) for g, i in (("g1", 0), ("g2", 0), ("g3", 1))]
    assert all(h.ledger.group(g).siblings[i].current.status == "sealed" for g, i in sealed)
    assert same_as_rebuilt(h)


def test_commands_on_one_group_are_serialized_and_the_second_sees_the_first(
    harness: Harness,
) -> None:
    h = harness
    ready(h, "g1")

    results, commits = in_flight_together(h, seal_async(h, "g1", 0), seal_async(h, "g1", 1))

    assert results == [True, True]
    assert commits == 2  # one after the other: the second waited for the first's commit
    statuses = [s.current.status for s in h.ledger.group("g1").siblings]
    assert statuses == ["sealed", "sealed"]
    assert h.ledger.group("g1").status == "ready_to_finalize"
    assert same_as_rebuilt(h)


def test_a_repeat_in_flight_with_its_original_appends_nothing(harness: Harness) -> None:
    h = harness
    ready(h, "g1")
    seal = seal_async(h, "g1", 0)

    results, _ = in_flight_together(h, seal, seal)

    # Whichever lands second is an identical repeat: a no-op. (Which one lands first is not
    # the submission order: each reads its attempt stream in a thread before it folds.)
    assert sorted(results, key=bool) == [False, True]
    sealed = [r for r in h.records(group_stream("g1")) if isinstance(r.event, SiblingSealed)]
    assert len(sealed) == 1


def test_a_command_adopts_only_the_groups_it_changed(harness: Harness) -> None:
    h = harness
    ready(h, "g1", "g2")
    view = h.ledger.groups
    untouched = view["g2"]

    (result,), _ = in_flight_together(h, seal_async(h, "g1", 0))

    assert result is True
    assert view["g1"] is h.ledger.group("g1")  # the live mapping, updated in place
    assert view["g1"].siblings[0].current.status == "sealed"
    assert view["g2"] is untouched
    h.seal("g2", 1)  # the sync form adopts the same way
    assert view["g2"] is h.ledger.group("g2")
    assert view["g1"].siblings[0].current.status == "sealed"
    assert same_as_rebuilt(h)


def test_a_rejected_async_command_appends_nothing_and_changes_nothing(harness: Harness) -> None:
    h = harness
    ready(h, "g1")
    head, digest = h.log.head(), h.ledger.digest()

    async def main() -> BaseException | None:
        async with h.barrier.mutation("test") as cut:
            try:
                await h.ledger.seal_sibling_async(
                    cut, "g1", 0, rollout_id="g1_g0-a7", receipt=None, reward=1.0,
                    mask_sample=False,
                )  # fmt: skip
            except Exception as exc:
                return exc
        return None

    error = asyncio.run(main())

    assert error is not None and "g1" in str(error)
    assert (h.log.head(), h.ledger.digest()) == (head, digest)


def test_an_admit_and_a_reserve_into_that_admission_are_serialized_and_the_log_still_folds(
    harness: Harness,
) -> None:
    """The admit changes only its members' groups and the reserve only its own group and the
    admission, but each fold checks the other's entity (the reserve, the admission's first
    group; the admit, its members): in flight together, each validated against the state
    before the other and both landed, and the log no longer folded at all."""
    h = harness
    h.reserve("g1", admitted=False, target_step=None, admission_id="a")
    prompt = make_prompt("g2")
    h.dataset.prompts["g2"] = prompt

    def reserve_g2(cut: Cut) -> Awaitable[object]:
        return h.ledger.reserve_async(
            cut, group_id="g2", prompt=prompt,
            prompt_ref=PromptRef(sample_id="g2", task_name="math"), expected_generations=2,
            start_weight_version=0, admitted=False, target_step=None, admission_id="a",
            granularity="sibling",
        )  # fmt: skip

    results, _ = in_flight_together(
        h,
        lambda cut: h.ledger.admit_async(cut, "a", target_step=5, start_weight_version=0),
        reserve_g2,
    )

    assert results[0] == ["g1"]
    refused = results[1]  # it waited for the admit and validated again: no longer agrees
    assert isinstance(refused, LedgerRuleError) and "groups of one admission must agree" in str(
        refused
    )
    assert "g2" not in h.ledger.state.groups
    assert same_as_rebuilt(h)  # the log folds, to the live state


def test_a_fresh_group_id_and_its_reserve_read_the_log_once_and_off_the_loop(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL each stream-version read on the loop was a server round trip that stalled
    every task (issue 12: three per reserved group); the id's absence is read once, in a
    thread, and the reserve that follows knows it."""
    h = harness
    h.reserve("g1")  # a used id: its version is known from its own append
    reads: list[tuple[str, bool]] = []
    real = h.log.stream_version

    def spy(stream: str) -> int | None:
        reads.append((stream, threading.current_thread() is threading.main_thread()))
        return real(stream)

    monkeypatch.setattr(h.log, "stream_version", spy)
    prompt = make_prompt("s2")

    async def main() -> tuple[str, str]:
        async with h.barrier.mutation("test") as cut:
            group_id = await h.ledger.unused_group_id_async("g1")
            await h.ledger.reserve_async(
                cut,
                group_id=group_id,
                prompt=prompt,
                prompt_ref=PromptRef(sample_id="s2", task_name="math"),
                expected_generations=2,
                start_weight_version=0,
                admitted=True,
                target_step=0,
                granularity="sibling",
            )
            return group_id, await h.ledger.unused_group_id_async("g1")

    first, after = asyncio.run(main())

    assert (first, after) == ("g1-r1", "g1-r2")
    assert reads == [(group_stream("g1-r1"), False), (group_stream("g1-r2"), False)]
    assert h.ledger.prompt("g1-r1") == prompt
    assert same_as_rebuilt(h)


def _held_first_read(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> tuple[threading.Event, threading.Event]:
    """The log's first stream-version read off the loop (a fresh id's, in a thread) holds its
    result until `release` is set; `entered` says it has read. Later reads go through."""
    real = h.log.stream_version
    entered, release = threading.Event(), threading.Event()

    def slow_off_loop(stream: str) -> int | None:
        found = real(stream)
        if not entered.is_set() and threading.current_thread() is not threading.main_thread():
            entered.set()
            assert release.wait(60)
        return found

    monkeypatch.setattr(h.log, "stream_version", slow_off_loop)
    return entered, release


def test_an_absence_read_in_a_thread_is_not_kept_once_an_append_of_ours_landed_there(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh id's absence is read in a thread; a reserve of that id on the loop may land
    meanwhile. The read's late 'absent' must not be kept over the append: after a restore
    rolled the reservation back (the stream stays), the id would be offered again and its
    reserve fail on NO_STREAM."""
    h = harness
    h.checkpoint(0)
    real = h.log.stream_version
    entered, release = _held_first_read(h, monkeypatch)

    async def main() -> str:
        offered = asyncio.create_task(h.ledger.unused_group_id_async("g9"))
        assert await asyncio.to_thread(entered.wait, 10)  # read absent, not returned yet
        async with h.barrier.mutation("test") as cut:
            await h.ledger.reserve_async(
                cut,
                group_id="g9",
                prompt=make_prompt("s9"),
                prompt_ref=PromptRef(sample_id="s9", task_name="math"),
                expected_generations=2,
                start_weight_version=0,
                admitted=True,
                target_step=1,
                granularity="sibling",
            )
        release.set()
        return await offered

    assert asyncio.run(main()) == "g9-r1"  # the append landed first: g9 is taken
    monkeypatch.setattr(h.log, "stream_version", real)
    h.run(lambda cut: h.ledger.restore(cut, h.dataset), kind="recovery_restore")
    assert h.ledger.unused_group_id("g9") == "g9-r1"


def test_an_absence_read_in_a_thread_across_a_restore_is_not_kept(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh id's absence is read in a thread; meanwhile a newer controller reserves that id
    and this ledger restores (fencing the newer one). The late 'absent' is of the view before
    the restore: kept, the id would be offered again and its reserve fence this ledger."""
    h = harness
    h.reserve("g1")
    h.checkpoint(1)
    newer = h.newer_controller()
    entered, release = _held_first_read(h, monkeypatch)

    async def main() -> str:
        offered = asyncio.create_task(h.ledger.unused_group_id_async("g7"))
        assert await asyncio.to_thread(entered.wait, 10)  # read absent, not returned yet
        await asyncio.to_thread(newer.reserve, "g7")
        async with h.barrier.mutation("recovery_restore") as cut:
            h.ledger.restore(cut, h.dataset)
        release.set()
        return await offered

    assert asyncio.run(main()) == "g7-r1"
    h.reserve("g7-r1")
    assert same_as_rebuilt(h)
