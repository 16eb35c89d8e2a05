"""Ctrl-C and SIGTERM stop a command alike (eventlog.cli.interrupts), and never while a worker
process is being handed its start: it printed a traceback of its own (EOFError)."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from eventlog.cli.interrupts import Interrupted, stop_on_signals, stops_deferred
from eventlog.cli.workers import Workers


@pytest.fixture
def handlers() -> Iterator[None]:
    """The command's handlers, in this process for the test; Python's own again after."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    stop_on_signals()
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


@pytest.mark.parametrize(
    ("signum", "line", "code"),
    [(signal.SIGTERM, "terminated", 143), (signal.SIGINT, "interrupted", 130)],
)
def test_a_stop_while_deferred_is_raised_when_the_block_ends(
    handlers: None, signum: int, line: str, code: int
) -> None:
    done = []
    with pytest.raises(Interrupted) as stopped, stops_deferred():
        os.kill(os.getpid(), signum)
        done.append("the block went on")
    assert done == ["the block went on"]
    assert (stopped.value.line(), stopped.value.exit_code) == (line, code)
    assert isinstance(stopped.value, KeyboardInterrupt)  # every Ctrl-C clean-up runs for it


def test_a_worker_is_handed_its_start_whole_before_a_stop_is_raised(
    handlers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed: list[str] = []

    def submit(self: object, *call: Any) -> concurrent.futures.Future[None]:
        os.kill(os.getpid(), signal.SIGTERM)  # the command is stopped mid-spawn
        time.sleep(0.2)  # the hand-over goes on (the handler runs within this, undeferred)
        handed.append("whole")
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        future.set_result(None)
        return future

    monkeypatch.setattr(concurrent.futures.ProcessPoolExecutor, "submit", submit)
    workers: Workers[None] = Workers(1, {}, object, lambda state, arg: None)
    # A thread that does not block the signal, as a command's writer thread: the kernel
    # hands it the signal, and Python runs the handler in the main thread at once.
    waiting = threading.Event()
    other = threading.Thread(target=waiting.wait)
    other.start()
    try:
        with pytest.raises(Interrupted) as stopped:
            workers.start()
    finally:
        waiting.set()
        other.join()
    assert handed == ["whole"] and stopped.value.signum == signal.SIGTERM
    monkeypatch.undo()
    workers.close()
