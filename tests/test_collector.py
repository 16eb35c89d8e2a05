"""The collector's pause is counted across threads: overlapping pauses never end one another
early, never leave the collector off for good, and keep a caller's own `gc.disable()`."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlog import EventLog, collector
from tests.vocabulary import LogNote


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


def test_threads_appending_back_to_back_leave_the_collector_on_now_and_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four threads appending without a break (each often waiting for another's commit):
    the collector comes on again within the run (before the bound it stayed off from the
    first append to the last)."""
    monkeypatch.setattr(collector, "MAX_OFF_S", 0.05)
    seen: list[bool] = []
    stop = threading.Event()
    with EventLog.open(tmp_path / "run.db") as log:

        def append(i: int) -> None:
            while not stop.is_set():
                log.append(f"s{i}", [LogNote(text="x")])

        threads = [threading.Thread(target=append, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            seen.append(gc.isenabled())
            time.sleep(0.001)
        stop.set()
        for thread in threads:
            thread.join()
    assert any(seen) and not all(seen)
