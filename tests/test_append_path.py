"""How an append reaches the database: the work each one costs, pinned as behaviour.

Speed itself is measured in bench/ (ratios in one run); these tests pin the mechanisms the
figures rest on, so an optimisation cannot silently disappear.
"""

from __future__ import annotations

import gc
import select
import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from eventlog import NO_STREAM, EventLog, Proposed
from eventlog.store.postgres import PostgresDialect
from eventlog.store.sqlite import SqliteDialect
from tests.vocabulary import LogNote


@pytest.fixture
def log(log_target: str) -> Iterator[EventLog]:
    with EventLog.open(log_target) as opened:
        yield opened


def test_an_uncontended_append_commits_in_its_callers_thread(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Handing each append to the writer thread cost a thread wake-up per call."""
    threads: list[str] = []
    dialect = SqliteDialect if log.backend == "sqlite" else PostgresDialect
    begin = dialect.begin_write

    def recording(self: Any, cursor: Any) -> None:
        threads.append(threading.current_thread().name)
        begin(self, cursor)

    monkeypatch.setattr(dialect, "begin_write", recording)
    for index in range(30):
        log.append(f"s{index}", [LogNote(text="x")], NO_STREAM)
    assert threads == [threading.current_thread().name] * 30


class _SyncCountingProxy:
    """A TCP relay in front of the PostgreSQL server that reads the client's protocol
    messages and counts the points where it waits for the server: a Sync or Flush (extended
    protocol; the two back to back count once) or a Query (simple protocol)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.waits = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._relay, args=(client, server), daemon=True).start()

    def _relay(self, client: socket.socket, server: socket.socket) -> None:
        pending = b""
        marker = False
        started = False  # before the startup message, messages carry no type byte
        with client, server:
            while True:
                ready, _, _ = select.select([client, server], [], [])
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    (server if sock is client else client).sendall(data)
                    if sock is not client:
                        continue
                    pending += data
                    while True:
                        if not started:
                            if len(pending) < 8:
                                break
                            size = int.from_bytes(pending[:4], "big")
                            code = int.from_bytes(pending[4:8], "big")
                            started = code == 196608  # protocol 3.0 (not an SSL request)
                        else:
                            if len(pending) < 5:
                                break
                            size = 1 + int.from_bytes(pending[1:5], "big")
                            if len(pending) >= size:
                                kind = pending[:1]
                                # Sync and Flush sent back to back are one wait.
                                if kind == b"Q" or (kind in b"SH" and not marker):
                                    with self._lock:
                                        self.waits += 1
                                marker = kind in (b"S", b"H")
                        if len(pending) < size:
                            break
                        pending = pending[size:]

    def close(self) -> None:
        self.listener.close()


@pytest.mark.postgres
def test_a_postgresql_append_takes_two_round_trips(fresh_postgres_url: str) -> None:
    """Lock, tail, versions and chosen ids go out in one pipeline; rows, NOTIFY and COMMIT in
    one more (it was six: lock, tail, versions, insert, notify, commit)."""
    url = sa.make_url(fresh_postgres_url)
    assert url.host is not None and url.port is not None
    proxy = _SyncCountingProxy(url.host, url.port)
    try:
        with EventLog.open(url.set(port=proxy.port).render_as_string(False)) as log:
            log.append("warm", [LogNote(text="x")])  # connects the writer
            before = proxy.waits
            for index in range(10):  # new streams: their versions are read too
                log.append(f"s{index}", [LogNote(text="x")], NO_STREAM)
            for index in range(10):  # known streams, chosen ids: still two
                note = Proposed(LogNote(text="y"), uuid.uuid4())
                log.append(f"s{index}", [note], 0)
            assert proxy.waits - before == 2 * 20
    finally:
        proxy.close()


def test_append_results_are_not_tracked_by_the_garbage_collector(log: EventLog) -> None:
    """A batch returns one result per request: tracked, they were promoted and rescanned."""
    result = log.append("s", [LogNote(text="x")])
    assert not gc.is_tracked(result)
