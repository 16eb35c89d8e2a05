"""The collector's pause is counted across threads: overlapping pauses never end one another
early, never leave the collector off for good, and keep a caller's own `gc.disable()`."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from eventlog import collector


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
