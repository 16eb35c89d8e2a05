"""A child of fork and the logs its parent had open: refused on SQLite, its own connections
on PostgreSQL; never a hang, and never the parent's connections."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import eventlog.ids
from eventlog import NO_STREAM, EventLog
from eventlog.errors import EventLogError
from eventlog.ids import new_event_id
from eventlog.store.sqlite import SqliteDialect
from tests.vocabulary import LogNote

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")

CHILD_DEADLINE_S = 30
"""A child still running then is taken to hang (SIGALRM ends it)."""


def in_child(work: Callable[[], Any]) -> Any:
    """What `work` returns in a forked child (JSON), or how the child ended."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        signal.alarm(CHILD_DEADLINE_S)
        try:
            os.write(write, json.dumps(work()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return json.loads(data) if data else "no answer"


def outcome(call: Callable[[], object]) -> str:
    try:
        call()
    except EventLogError as exc:
        return type(exc).__name__
    return "done"


def test_a_child_forked_mid_commit_is_refused_the_sqlite_log_and_the_parent_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child's append waited for good: it found the lead held (a parent thread was
    committing) and queued for a writer thread the child does not have. With a writer of
    its own it would use SQLite across the fork, whose locks the child copied as they were."""
    log = EventLog.open(tmp_path / "log.db")
    log.append("s", [LogNote(text="first")], NO_STREAM)
    inside, leave = threading.Event(), threading.Event()
    begin = SqliteDialect.begin_write

    def held_in_commit(self: SqliteDialect, cursor: Any) -> None:
        inside.set()
        leave.wait()
        begin(self, cursor)

    monkeypatch.setattr(SqliteDialect, "begin_write", held_in_commit)
    committing = threading.Thread(target=log.append, args=("s", [LogNote(text="parent")]))
    committing.start()
    assert inside.wait(60)
    try:
        child = in_child(
            lambda: [
                outcome(lambda: log.append("c", [LogNote(text="child")])),
                outcome(log.head),
                outcome(lambda: list(log.read())),
            ]
        )
    finally:
        leave.set()
        committing.join()
    assert child == ["LogClosedError"] * 3
    log.append("s", [LogNote(text="after")], 1)
    assert log.head() == 3 and log.verify().ok
    log.close()


@pytest.mark.postgres
def test_a_forked_child_appends_to_the_postgresql_log_on_connections_of_its_own(
    fresh_postgres_url: str,
) -> None:
    """Both processes append at once; on shared connections their statements would mix on
    one socket."""
    log = EventLog.open(fresh_postgres_url)
    log.append("s", [LogNote(text="first")], NO_STREAM)
    assert log.head() == 1  # a pooled read connection the child inherits too

    def appends(stream: str) -> int:
        for n in range(100):
            log.append(stream, [LogNote(text=stream, n=n)], NO_STREAM if n == 0 else n - 1)
            assert log.stream_version(stream) == n  # a read connection each, at once
        return log.stream_version(stream) or 0

    parent: list[int] = []
    appending = threading.Thread(target=lambda: parent.append(appends("parent")))
    appending.start()  # (the child has none of the parent's threads: it appends alone)
    child = in_child(lambda: appends("child"))
    appending.join()
    assert (child, parent) == (99, [99])
    assert log.head() == 201 and log.verify().ok
    log.close()


@pytest.mark.postgres
def test_a_forked_child_listens_for_appends_on_a_connection_of_its_own(
    fresh_postgres_url: str,
) -> None:
    """Parent and child wait for the next append at once, the parent on the LISTEN
    connection it had at the fork: both wake at the append. On one shared socket one of
    them read the NOTIFY and the other waited out its timeout (or hung on psycopg's lock)."""
    log = EventLog.open(fresh_postgres_url)
    log.append("s", [LogNote(text="first")], NO_STREAM)
    head = log.head()
    log.wait_for_append(head, 0.01)  # the parent's listener, made before the fork
    timeout = 20.0

    def waited() -> float:
        started = time.monotonic()
        log.wait_for_append(head, timeout)
        return time.monotonic() - started

    parent: list[float] = []
    waiting = threading.Thread(target=lambda: parent.append(waited()))
    waiting.start()
    done = threading.Event()

    def appends() -> None:  # again each second: a waiter that began listening late wakes too
        while not done.wait(2.0 if log.head() == head else 1.0):
            log.append("s", [LogNote(text="next")])

    appending = threading.Thread(target=appends)
    appending.start()
    try:
        child = in_child(waited)
        waiting.join()
    finally:
        done.set()
        appending.join()
    assert isinstance(child, float), child
    assert child < timeout / 2 and parent[0] < timeout / 2, (child, parent)
    log.close()


def test_a_child_forked_while_an_id_is_minted_mints_its_own() -> None:
    """A parent thread minting at the fork left the lock held in the child for good."""
    with eventlog.ids._lock:
        child = in_child(lambda: new_event_id().version)
    assert child == 7
