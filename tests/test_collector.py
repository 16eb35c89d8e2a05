"""The collector's pause is counted across threads: overlapping pauses never end one another
early, never leave the collector off for good, and keep a caller's own `gc.disable()`."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eventlog import EventLog, collector
from eventlog.log import FEW_EVENTS
from tests.vocabulary import LogNote

MANY = [LogNote(text="x")] * (FEW_EVENTS + 1)
"""An append that pauses the collector (a few events leave it as it is)."""


@pytest.fixture(autouse=True)
def collector_on_around() -> Iterator[None]:
    assert gc.isenabled()
    yield
    gc.enable()


def test_overlapping_pauses_in_two_threads_keep_it_off_until_the_last_one_ends() -> None:
    """A commit in the writer thread and a restore in the caller's overlap, each ending while
    the other lasts: off throughout, on after the last."""
    seen: list[bool] = []
    restore_began, commit_ended = threading.Event(), threading.Event()

    def commit() -> None:
        collector.pause()
        restore_began.wait(5)
        collector.resume()
        commit_ended.set()

    writer = threading.Thread(target=commit)
    writer.start()
    with collector.paused():
        restore_began.set()
        assert commit_ended.wait(5)
        seen.append(gc.isenabled())  # the commit has ended; the restore still lasts
    writer.join()
    assert seen == [False]
    assert gc.isenabled()


def test_a_collector_switched_off_before_any_pause_stays_off() -> None:
    gc.disable()
    with collector.paused():
        collector.pause()
        collector.resume()
    assert not gc.isenabled()


def test_a_pause_ends_when_its_block_raises() -> None:
    with pytest.raises(RuntimeError), collector.paused():
        assert not gc.isenabled()
        raise RuntimeError("a rule broken mid-fold")
    assert gc.isenabled()


def test_a_stretch_of_overlapping_pauses_switches_it_on_again_after_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pauses that keep overlapping never all end: past MAX_OFF_S the next pause or resume
    switches the collector on, and it stays on until the stretch ends; the next stretch
    pauses afresh. Within the bound, overlapping pauses keep it off."""
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    collector.pause()
    collector.pause()
    collector.resume()
    assert not gc.isenabled()  # overlapping, within the bound
    now[0] += collector.MAX_OFF_S
    collector.pause()  # a third caller arrives after the bound: on
    assert gc.isenabled()
    collector.resume()
    collector.pause()
    assert gc.isenabled()  # still the same stretch: it stays on
    collector.resume()
    collector.resume()
    assert gc.isenabled()
    with collector.paused():  # a new stretch
        assert not gc.isenabled()


def recorded_switches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """The collector's calls to switch gc on and off from now on, each with whether a pause
    was in progress (on again while one is: the bound, not the pauses' end)."""
    calls: list[tuple[str, bool]] = []

    class Recorded:
        def __getattr__(self, name: str) -> Any:
            found = getattr(gc, name)
            if name not in ("enable", "disable"):
                return found

            def switch() -> None:
                calls.append((name, collector._pauses > 0))  # under the collector's lock
                found()

            return switch

    monkeypatch.setattr(collector, "gc", Recorded())
    return calls


def test_threads_appending_back_to_back_leave_the_collector_on_now_and_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four threads appending without a break (each often waiting for another's commit):
    the collector comes on again within the run (before the bound it stayed off from the
    first append to the last). Seen as the calls the collector's pause makes, not by
    sampling: a busy machine could let a sampler miss the short stretch it was off."""
    monkeypatch.setattr(collector, "MAX_OFF_S", 0.05)
    calls = recorded_switches(monkeypatch)
    stop = threading.Event()
    with EventLog.open(tmp_path / "run.db") as log:

        def append(i: int) -> None:
            while not stop.is_set():
                log.append(f"s{i}", MANY)

        threads = [threading.Thread(target=append, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while ("enable", True) not in calls and time.monotonic() < deadline:
            time.sleep(0.01)  # on again while pauses last: the bound, not their end
        stop.set()
        for thread in threads:
            thread.join()
    assert ("disable", False) in calls  # the first pause of a stretch switched it off
    assert ("enable", True) in calls


def test_one_pause_that_outlasts_the_bound_switches_it_on_again_by_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An append waiting up to its busy timeout for another process's write lock holds one
    pause, with no pause or resume to apply the bound: the collector came on only when the
    wait ended (seen off for 3 s of a 3 s wait). The watchdog thread applies the bound."""
    monkeypatch.setattr(collector, "MAX_OFF_S", 0.1)
    with collector.paused():
        assert not gc.isenabled()
        deadline = time.monotonic() + 30
        while not gc.isenabled() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gc.isenabled()


def test_an_append_waiting_for_another_process_s_lock_leaves_the_collector_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.reliability import write_lock_held

    monkeypatch.setattr(collector, "MAX_OFF_S", 0.1)
    path = tmp_path / "run.db"
    with EventLog.open(path, busy_timeout=60) as log:
        log.append("s", [LogNote(text="first")])
        calls = recorded_switches(monkeypatch)
        with write_lock_held(str(path)):
            waiting = threading.Thread(target=log.append, args=("s", MANY))
            waiting.start()
            deadline = time.monotonic() + 30
            while ("enable", True) not in calls and time.monotonic() < deadline:
                time.sleep(0.01)
            on = ("enable", True) in calls and gc.isenabled() and waiting.is_alive()
        waiting.join(timeout=60)
        assert on and not waiting.is_alive()  # on while the append still waited
        assert log.head() == 1 + len(MANY)


def test_a_pause_long_by_its_own_work_is_left_alone_by_the_watchdog(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restore or a rebuild fold pauses for its whole length on purpose (collections
    rescanning the heap were most of a restore's time): the watchdog does not end it."""
    monkeypatch.setattr(collector, "MAX_OFF_S", 0.05)
    with collector.paused(long=True):
        time.sleep(0.5)
        assert not gc.isenabled()
    assert gc.isenabled()


@pytest.mark.parametrize("long", [False, True])
def test_a_child_forked_while_a_thread_paused_has_the_collector_on(long: bool) -> None:
    """The parent's pausing thread does not exist in the child, so its pause would never
    end there: the child drops it (the collector on), and its own pauses count afresh."""
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        with collector.paused(long=long):
            holding.set()
            done.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    holding.wait(5)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's cleanup
        seen = [gc.isenabled()]
        with collector.paused():
            seen.append(gc.isenabled())
        seen.append(gc.isenabled())
        os.write(write_end, bytes(seen))
        os._exit(0)
    os.close(write_end)
    seen_in_child = list(os.read(read_end, 3))
    os.close(read_end)
    os.waitpid(pid, 0)
    done.set()
    thread.join()
    assert seen_in_child == [1, 0, 1]


def test_an_append_of_a_few_events_leaves_the_collector_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pausing it costs a lock and two switches, more than a few events' objects could cost
    a collection: a single append spent ~4 % of its CPU on it. More events pause it, in
    the caller and in the loop (the writer thread's commit pauses it whatever it holds)."""
    with EventLog.open(tmp_path / "run.db") as log:
        calls = recorded_switches(monkeypatch)
        log.append("few", [LogNote(text="x")] * FEW_EVENTS)
        assert calls == []
        log.append("many", MANY)
        assert calls and calls[0] == ("disable", False)
        calls.clear()

        async def queued(events: list[LogNote]) -> None:
            await log.append_async("queued", events)

        paused_by: list[tuple[str, int]] = []
        pause = collector.pause
        for events in ([LogNote(text="y")], MANY):
            with monkeypatch.context() as patched:

                def noted(count: int = len(events)) -> None:
                    paused_by.append((threading.current_thread().name, count))
                    pause()

                patched.setattr(collector, "pause", noted)
                asyncio.run(queued(events))
        here = threading.current_thread().name  # (the writer thread pauses for its commits)
        assert [count for name, count in paused_by if name == here] == [len(MANY)]


def test_a_caller_of_a_few_events_leading_others_queued_events_pauses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A single append that finds an asyncio caller's many events queued commits them too:
    that commit rests the collector (the asyncio caller's pause ended once it queued, and
    the single append took none). The writer thread is kept out of the way so that the
    caller, not it, leads the queued events (a caller other than the main thread, which
    leads only its own append)."""
    from eventlog.store.sqlite import SqliteDialect
    from eventlog.writer import GroupCommitWriter

    monkeypatch.setattr(GroupCommitWriter, "_run", lambda self: None)  # no writer thread
    enabled_in: list[bool] = []
    begin = SqliteDialect.begin_write

    def noting(self: Any, cursor: Any) -> None:
        enabled_in.append(gc.isenabled())
        begin(self, cursor)

    with EventLog.open(tmp_path / "run.db") as log:
        monkeypatch.setattr(SqliteDialect, "begin_write", noting)

        async def main() -> None:
            queued = asyncio.ensure_future(log.append_async("many", MANY))
            await asyncio.sleep(0)  # encoded and queued; no writer thread takes it
            few = threading.Thread(target=log.append, args=("few", [LogNote(text="x")]))
            few.start()  # leads, and takes the queued ones along
            few.join()
            await queued

        asyncio.run(main())
        assert log.head() == 1 + len(MANY)
    assert enabled_in == [False]  # one commit, the collector at rest


def test_a_batch_of_several_requests_pauses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only one request of a few events leaves the collector as it is: several requests, or
    requests not handed as a list, pause it like any bigger append."""
    from eventlog import AppendRequest

    with EventLog.open(tmp_path / "run.db") as log:
        calls = recorded_switches(monkeypatch)
        one = [LogNote(text="x")]
        log.append_batch([AppendRequest("a", one), AppendRequest("b", one)])
        assert calls[:1] == [("disable", False)]
        calls.clear()
        log.append_batch(iter([AppendRequest("c", one)]))  # type: ignore[arg-type]
        assert calls[:1] == [("disable", False)]
