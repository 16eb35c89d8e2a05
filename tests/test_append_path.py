"""How an append reaches the database: the work each one costs, pinned as behaviour.

Speed itself is measured in bench/ (ratios in one run); these tests pin the mechanisms the
figures rest on, so an optimisation cannot silently disappear.
"""

from __future__ import annotations

import asyncio
import gc
import os
import select
import shutil
import socket
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any, cast

import pytest
import sqlalchemy as sa

from eventlog import (
    NO_STREAM,
    AppendRequest,
    ConcurrencyError,
    EventLog,
    Proposed,
    StorageUnavailableError,
)
from eventlog.store.base import SqlStore
from eventlog.store.postgres import PostgresDialect
from eventlog.store.sqlite import SqliteDialect
from tests.vocabulary import LogNote


@pytest.fixture
def linked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many rows each `chain.link_rows` call linked (one-event requests link directly)."""
    import eventlog.chain

    counts: list[int] = []
    link_rows = eventlog.chain.link_rows

    def counting(previous: bytes, fields: Any, rows: Any) -> bytes:
        counts.append(len(fields))
        return link_rows(previous, fields, rows)

    monkeypatch.setattr(eventlog.chain, "link_rows", counting)
    return counts


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


def test_the_main_thread_leads_only_its_own_append_so_a_stop_there_fails_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (and SIGTERM, in the CLI) lands in the main thread. Leading a commit that held
    other callers' queued appends, it handed its KeyboardInterrupt to each of them, whether
    the commit landed or not, and a caller retrying its append stored it twice. The main
    thread commits only its own; the queued ones go with the next commit another leads. The
    writer thread is kept out of the way, so that only callers lead."""
    from eventlog.writer import GroupCommitWriter

    monkeypatch.setattr(GroupCommitWriter, "_run", lambda self: None)
    batches: list[tuple[str, int]] = []
    write = SqlStore.write

    def stopped_in_main(self: SqlStore, submissions: Any, **kwargs: Any) -> Any:
        batches.append((threading.current_thread().name, len(submissions)))
        if threading.current_thread() is threading.main_thread():
            raise KeyboardInterrupt  # Ctrl-C while the main thread's commit runs
        return write(self, submissions, **kwargs)

    with EventLog.open(tmp_path / "log.db") as log:
        monkeypatch.setattr(SqlStore, "write", stopped_in_main)

        async def queued_append(stream: str) -> Any:
            try:
                return await log.append_async(stream, [LogNote(text="y")])
            except KeyboardInterrupt as stop:  # the main thread's, handed on: the bug
                return stop

        async def main() -> list[Any]:
            queued = [asyncio.ensure_future(queued_append(f"q{i}")) for i in range(3)]
            await asyncio.sleep(0)  # encoded and queued; no writer thread takes them
            with pytest.raises(KeyboardInterrupt):
                log.append("main", [LogNote(text="x")])
            await asyncio.sleep(0)  # anything the commit settled is settled now
            assert not any(future.done() for future in queued)
            other = threading.Thread(
                target=log.append, args=("other", [LogNote(text="z")]), name="other"
            )
            other.start()  # leads, and takes the queued ones along
            other.join()
            return await asyncio.gather(*queued)

        results = asyncio.run(main())
        assert [r.stream for r in results] == ["q0", "q1", "q2"]
        assert log.head() == 4 and log.verify().ok
    assert batches == [(threading.main_thread().name, 1), ("other", 4)]


def _commit_held(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> tuple[threading.Event, threading.Thread]:
    """A thread's append whose commit has begun and waits until the event returned is set
    (join the thread after setting it)."""
    dialect = SqliteDialect if log.backend == "sqlite" else PostgresDialect
    begin = dialect.begin_write
    release, leading = threading.Event(), threading.Event()

    def held(self: Any, cursor: Any) -> None:
        if threading.current_thread().name == "held":
            leading.set()
            assert release.wait(30)
        begin(self, cursor)

    monkeypatch.setattr(dialect, "begin_write", held)
    first = threading.Thread(target=log.append, args=("first", [LogNote(text="x")]), name="held")
    first.start()
    assert leading.wait(30)
    return release, first


def test_a_stop_while_the_main_thread_waits_for_another_commit_leaves_nothing_queued(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waiting for another caller's commit, the main thread had queued its append: a Ctrl-C
    there ended the call, and the writer thread committed the append a moment later, after
    `seq_of` had said it was not in the log. It waits for the leader lock instead, so a stop
    leaves nothing behind to land."""
    import signal

    release, first = _commit_held(log, monkeypatch)
    main = threading.main_thread().ident
    assert main is not None
    stop = threading.Timer(0.3, signal.pthread_kill, args=(main, signal.SIGINT))
    stop.start()
    note = Proposed(LogNote(text="stopped"), uuid.uuid4())
    with pytest.raises(KeyboardInterrupt):
        log.append("main", [note])  # waits for the held commit: stopped meanwhile
    release.set()
    first.join()
    log.append("after", [LogNote(text="y")])  # the writer has nothing of the stopped one
    assert log.seq_of(note.event_id) is None and log.head() == 2


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
def test_a_postgresql_append_with_nothing_to_read_takes_one_round_trip(
    fresh_postgres_url: str,
) -> None:
    """A writer alone on its log links to its own last commit without reading the tail, so
    an append of minted ids to a stream it knows or takes to be new sends BEGIN, lock, rows,
    NOTIFY (in the last row's statement) and COMMIT in one pipeline: one round trip (it was
    two: the tail read's reply came first). Chosen ids are read first: two."""
    url = sa.make_url(fresh_postgres_url)
    assert url.host is not None and url.port is not None
    proxy = _SyncCountingProxy(url.host, url.port)
    try:
        with EventLog.open(url.set(port=proxy.port).render_as_string(False)) as log:
            log.append("warm", [LogNote(text="x")], NO_STREAM)  # connects, reads the tail
            log.append("warm", [LogNote(text="x")], 0)  # reads it again: its own from here on
            before = proxy.waits
            for index in range(10):  # new streams, taken to be new
                log.append(f"s{index}", [LogNote(text="x")], NO_STREAM)
            for index in range(10):  # streams it knows
                log.append(f"s{index}", [LogNote(text="x")], 0)
            assert proxy.waits - before == 20
            before = proxy.waits
            for index in range(10):  # chosen ids: whether they are stored is read first
                note = Proposed(LogNote(text="y"), uuid.uuid4())
                log.append(f"s{index}", [note], 1)
            assert proxy.waits - before == 2 * 10
            assert log.verify().ok and log.head() == 32
    finally:
        proxy.close()


def test_another_writer_behind_the_unread_tail_is_found_on_each_backend(
    log_target: str,
) -> None:
    """Another writer (another host, on PostgreSQL) appended since this writer's last
    commit: the insert of seq head + 1 is refused, the transaction rolled back and the batch
    planned again with the tail and versions read. A stale cached version then fails with
    the version the log holds, nothing of it stored; the next append lands after the other
    writer's records on an unbroken chain, and NOTIFY still wakes a waiting reader."""
    with EventLog.open(log_target) as log, EventLog.open(log_target) as other:
        log.append("warm", [LogNote(text="x")], NO_STREAM)
        log.append("a", [LogNote(text="x")], NO_STREAM)  # the tail is its own from here on
        other.append("a", [LogNote(text="theirs")], 0)
        other.append("b", [LogNote(text="theirs")], NO_STREAM)
        with pytest.raises(ConcurrencyError) as refused:
            log.append("a", [LogNote(text="mine")], 0)  # version 0 is what it last wrote
        assert (refused.value.stream, refused.value.actual) == ("a", 1)
        assert log.head() == 4
        landed = log.append("b", [LogNote(text="mine")], 0)
        assert (landed.seqs, landed.versions) == ([5], [1])
        other.append("c", [LogNote(text="theirs")], NO_STREAM)
        other.wait_for_append(other.head(), timeout=0.01)  # listening now (PostgreSQL)
        landed_c, landed_d = log.append_batch(  # behind the tail again, two rows
            [
                AppendRequest("c", [LogNote(text="mine")], 0),
                AppendRequest("d", [LogNote(text="mine")], NO_STREAM),
            ]
        )
        assert (landed_c.seqs, landed_d.seqs) == ([7], [8])
        started = time.monotonic()
        other.wait_for_append(6, timeout=30.0)  # the replanned commit's NOTIFY wakes it
        assert time.monotonic() - started < 15.0
        assert [r.event.text for r in log.read_stream("c")] == ["theirs", "mine"]  # type: ignore[attr-defined]
        assert log.verify().ok and log.head() == 8


def test_append_results_are_not_tracked_by_the_garbage_collector(log: EventLog) -> None:
    """A batch returns one result per request: tracked, they were promoted and rescanned."""
    result = log.append("s", [LogNote(text="x")])
    assert not gc.is_tracked(result)


def test_a_group_commit_mints_its_ids_and_reads_the_clock_once(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten single-event appends committed together: one minting and one recorded_at for the
    transaction (minting and the clock per submission cost a call each per event)."""
    from eventlog.ids import mint_event_ids as mint

    minted: list[int] = []

    def counting(count: int) -> Any:
        minted.append(count)
        return mint(count)

    monkeypatch.setattr("eventlog.store.base.mint_event_ids", counting)
    release, first = _commit_held(log, monkeypatch)  # it leads alone: the ten queue behind it

    async def queued() -> list[Any]:
        tasks = [
            asyncio.ensure_future(log.append_async(f"s{i}", [LogNote(text="y")], NO_STREAM))
            for i in range(10)
        ]
        for _ in range(3):
            await asyncio.sleep(0)  # each task runs up to its wait: all ten are queued
        release.set()
        return await asyncio.gather(*tasks)

    results = asyncio.run(queued())
    first.join()
    assert log.commits == 2 and minted == [1, 10]
    stored = list(log.read(from_seq=2))
    assert [r.event_id for r in stored] == [r.event_ids[0] for r in results]
    assert len({r.recorded_at for r in stored}) == 1


def test_single_event_requests_are_linked_without_building_a_request_row_list(
    log: EventLog, linked: list[int]
) -> None:
    """A batch of one-event requests (what a batch over many streams mostly holds) and a
    one-event append link each row directly; only longer requests go through link_rows."""
    log.append("a", [LogNote(text="x")])
    log.append_batch([AppendRequest(f"s{i}", [LogNote(text="x")]) for i in range(20)])
    log.append_batch([AppendRequest("t", [LogNote(text="x"), LogNote(text="y")])])
    assert linked == [2]
    assert log.verify().ok and log.head() == 23


@pytest.fixture
def short_plans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The stream of every submission `_plan_one` plans, from now on."""
    planned: list[str] = []
    plan_one = SqlStore._plan_one

    def counting(self: SqlStore, batch: Any, stream: str, expected: int, event: Any) -> Any:
        planned.append(stream)
        return plan_one(self, batch, stream, expected, event)

    monkeypatch.setattr(SqlStore, "_plan_one", counting)
    return planned


def test_a_one_event_submission_is_planned_by_the_short_path(
    log: EventLog, short_plans: list[str]
) -> None:
    """An append of one event with a minted id (the commonest submission) is planned without
    the general path's undo state (`_plan_one`), a refused one too; a batch of several
    requests, a chosen id or a longer request takes the general path."""
    planned = short_plans
    assert log.append("a", [LogNote(text="x")], NO_STREAM).versions == [0]
    with pytest.raises(ConcurrencyError):
        log.append("a", [LogNote(text="y")], NO_STREAM)
    log.append_batch([AppendRequest(s, [LogNote(text="x")]) for s in ("b", "c")])
    log.append("d", [Proposed(LogNote(text="x"), uuid.uuid4())])
    log.append("e", [LogNote(text="x"), LogNote(text="y")])
    assert planned == ["a", "a"]
    assert log.head() == 6 and log.verify().ok


def test_an_assertion_in_front_of_one_event_is_planned_by_the_short_path_too(
    log: EventLog, short_plans: list[str]
) -> None:
    """A fenced ledger command's shape (an eventless assertion, then one event with a minted
    id) takes `_plan_one` after the assertion is checked; a refused assertion or a refused
    event appends nothing and names its own stream; an assertion in front of a longer
    request, a chosen id or a second assertion takes the general path."""
    log.append("fence", [LogNote(text="epoch")], NO_STREAM)  # the fence stream at version 0
    planned = short_plans
    planned.clear()
    fence = AppendRequest("fence", [], 0)
    held, landed = log.append_batch([fence, AppendRequest("a", [LogNote(text="x")], NO_STREAM)])
    assert (held.stream, held.seqs, held.versions) == ("fence", [], [])
    assert (landed.stream, landed.seqs, landed.versions) == ("a", [2], [0])
    with pytest.raises(ConcurrencyError) as superseded:
        log.append_batch([AppendRequest("fence", [], 1), AppendRequest("a", [LogNote(text="y")])])
    assert superseded.value.stream == "fence"
    with pytest.raises(ConcurrencyError) as stale:
        log.append_batch([fence, AppendRequest("a", [LogNote(text="y")], NO_STREAM)])
    assert stale.value.stream == "a"
    assert planned == ["a", "a"] and log.head() == 2
    log.append_batch([fence, AppendRequest("b", [LogNote(text="x"), LogNote(text="y")])])
    log.append_batch([fence, AppendRequest("c", [Proposed(LogNote(text="x"), uuid.uuid4())])])
    log.append_batch([fence, AppendRequest("fence", [], 0)])
    assert planned == ["a", "a"]
    assert log.head() == 5 and log.verify().ok


def test_minted_ids_follow_seq_order_when_a_request_mixes_chosen_and_minted_ids(
    log: EventLog,
) -> None:
    """The ids a transaction mints are taken in seq order, also by the events without a
    chosen id of a request that has some (they were minted last, after the ids of later
    requests: ids no longer grew with seq, and the id index not at its end)."""
    chosen = uuid.uuid4()
    log.append_batch(
        [
            AppendRequest("a", [Proposed(LogNote(text="x"), chosen), LogNote(text="y")]),
            AppendRequest("b", [LogNote(text="z")]),
        ]
    )
    minted = [r.event_id for r in log.read() if r.event_id != chosen]
    assert len(minted) == 2 and minted == sorted(minted, key=lambda i: i.bytes)
    # A retry of the same request lands nothing again and gives back the same ids.
    again = log.append("a", [Proposed(LogNote(text="x"), chosen)], 0)
    assert again.seqs == [1] and log.head() == 3


def test_an_append_runs_no_garbage_collection_and_leaves_the_collector_as_it_was(
    log: EventLog, log_target: str
) -> None:
    """A batch of 3000 one-event requests allocates far past the collector's threshold: no
    collection runs inside the call (one used to scan and promote every row and result),
    whether the caller commits or the writer thread does; the collector is on afterwards,
    and stays off for a caller who had turned it off."""
    collections: list[str] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(threading.current_thread().name)

    requests = [AppendRequest(f"s{i}", [LogNote(text="x", n=i)]) for i in range(3000)]
    gc.collect()
    gc.callbacks.append(seen)
    try:
        log.append_batch(requests[:1500])
        assert collections == [] and gc.isenabled()
        gc.disable()
        try:
            log.append("off", [LogNote(text="x")])
            assert not gc.isenabled()
        finally:
            gc.enable()

        async def in_the_writer_thread() -> None:
            await log.append_batch_async(requests[1500:])

        asyncio.run(in_the_writer_thread())
        log.close()  # the writer thread has finished
        assert "eventlog-writer" not in collections and gc.isenabled()
    finally:
        gc.callbacks.remove(seen)
    with EventLog.open(log_target) as reopened:
        assert reopened.head() == 3001


def test_append_async_queues_its_append_without_a_second_coroutine(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One coroutine per awaited append (it went through append_batch_async: two), and the
    result is the one request's."""

    def refused(self: EventLog, requests: Any) -> Any:
        raise AssertionError("append_async went through append_batch_async")

    monkeypatch.setattr(EventLog, "append_batch_async", refused)

    async def both() -> list[Any]:
        return list(
            await asyncio.gather(
                log.append_async("a", [LogNote(text="x")], NO_STREAM),
                log.append_async("a", [LogNote(text="y")], 0),
            )
        )

    first, second = asyncio.run(both())
    assert (first.stream, first.versions, second.versions) == ("a", [0], [1])


def _traced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The SQL the SQLite writer sends, from each transaction's BEGIN on."""
    statements: list[str] = []
    begin = SqliteDialect.begin_write

    def tracing(self: SqliteDialect, cursor: Any) -> None:
        cursor.connection.set_trace_callback(statements.append)
        begin(self, cursor)

    monkeypatch.setattr(SqliteDialect, "begin_write", tracing)
    return statements


def test_a_new_stream_appended_with_no_stream_costs_no_version_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream the writer has not seen, named once in the batch with NO_STREAM and events,
    is taken to be new: its version-0 row is the check. An assertion without events, or a
    stream named twice, is still read."""
    statements = _traced(monkeypatch)
    with EventLog.open(tmp_path / "log.db") as log:
        log.append("a", [LogNote(text="x")], NO_STREAM)
        log.append_batch([AppendRequest(f"s{i}", [LogNote(text="x")], NO_STREAM) for i in range(5)])
        assert not any("max(version)" in s for s in statements)
        log.append_batch([AppendRequest("empty", [], NO_STREAM)])
        assert sum("max(version)" in s for s in statements) == 1
        log.append_batch(
            [
                AppendRequest("twice", [], NO_STREAM),
                AppendRequest("twice", [LogNote(text="y")], NO_STREAM),
            ]
        )
        assert sum("max(version)" in s for s in statements) == 2
        assert log.head() == 7 and log.verify().ok


def _tail_reads(statements: list[str]) -> int:
    return sum("ORDER BY seq DESC LIMIT 1" in s for s in statements)


def test_the_writer_links_to_its_own_last_commit_without_reading_the_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On SQLite the tail this writer committed last is not read again: inserting seq
    head + 1 is what checks that nobody appended since. The first append reads it, and so
    does a batch that adds no row (nothing else would check it)."""
    statements = _traced(monkeypatch)
    with EventLog.open(tmp_path / "log.db") as log:
        log.append("a", [LogNote(text="x")], NO_STREAM)
        log.append("a", [LogNote(text="x")], 0)  # the tail is as it left it: no other writer
        assert _tail_reads(statements) == 2
        statements.clear()
        for version in range(1, 4):
            log.append("a", [LogNote(text="y")], version)
        log.append_batch([AppendRequest(f"s{i}", [LogNote(text="z")]) for i in range(3)])
        assert _tail_reads(statements) == 0
        with pytest.raises(ConcurrencyError):
            log.append("a", [LogNote(text="late")], 0)
        assert _tail_reads(statements) == 1
        assert log.head() == 8 and log.verify().ok


def test_another_writers_append_fails_the_unread_tail_and_the_batch_is_planned_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer appended behind this one's back: the row of seq head + 1 exists, so
    the insert fails, and the batch is planned again with tail and versions read. A request
    whose cached version was stale then fails with the version the log holds; the next one
    lands after the other writer's records, on an unbroken chain."""
    path = tmp_path / "log.db"
    statements = _traced(monkeypatch)
    with EventLog.open(path) as log, EventLog.open(path) as other:
        log.append("warm", [LogNote(text="x")], NO_STREAM)
        log.append("a", [LogNote(text="x")], NO_STREAM)  # the second: the tail is its own
        other.append("a", [LogNote(text="theirs")], 0)
        other.append("b", [LogNote(text="theirs")], NO_STREAM)
        statements.clear()
        with pytest.raises(ConcurrencyError) as refused:
            log.append("a", [LogNote(text="mine")], 0)  # version 0 is what it last wrote
        assert (refused.value.stream, refused.value.actual) == ("a", 1)
        assert _tail_reads(statements) == 1
        assert sum(s.startswith("INSERT") for s in statements) == 1  # the failed guess
        log.append("warm", [LogNote(text="y")], 0)  # the tail is its own again
        landed = log.append("b", [LogNote(text="mine")], 0)
        assert (landed.seqs, landed.versions) == ([6], [1])
        # A stale cached version refuses a request that is right, and a refusal adds no row
        # to check the tail: the batch reads it, finds it moved, and plans again.
        other.append("a", [LogNote(text="theirs")], 1)
        landed = log.append("a", [LogNote(text="mine")], 2)
        assert (landed.seqs, landed.versions) == ([8], [3])
        assert log.verify().ok and log.head() == 8


def test_writers_taking_turns_read_the_tail_instead_of_failing_inserts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writers appending in turn (processes sharing one SQLite file) each find the
    other's records at every commit: once a tail read has shown another writer, the tail is
    read, not guessed, so no transaction fails an insert; a writer alone again guesses."""
    path = tmp_path / "log.db"
    statements = _traced(monkeypatch)
    with EventLog.open(path) as log, EventLog.open(path) as other:
        for turn in range(5):
            log.append("mine", [LogNote(text="x")], turn - 1 if turn else NO_STREAM)
            other.append("theirs", [LogNote(text="x")], turn - 1 if turn else NO_STREAM)
        assert not any(s.startswith("ROLLBACK") for s in statements)
        assert _tail_reads(statements) == 10
        statements.clear()
        for turn in range(5, 8):
            log.append("mine", [LogNote(text="x")], turn - 1)
        # The first finds the other's last record, the second its own: the third guesses.
        assert _tail_reads(statements) == 2
        assert log.verify().ok and log.head() == 13


def test_a_stream_taken_to_be_new_that_exists_fails_alone_with_its_concurrency_error(
    log_target: str,
) -> None:
    """Another writer created the stream behind this writer's back: the guess is refused by
    the unique index, the batch is planned again with the versions read, and only the
    request that expected no stream fails; a rejected guess is not remembered as new."""
    with EventLog.open(log_target) as log, EventLog.open(log_target) as other:
        log.append("warm", [LogNote(text="x")])
        other.append("taken", [LogNote(text="theirs")], NO_STREAM)
        with pytest.raises(ConcurrencyError) as refused:
            log.append("taken", [LogNote(text="mine")], NO_STREAM)
        assert (refused.value.stream, refused.value.actual) == ("taken", 0)

        async def together() -> list[Any]:
            return list(
                await asyncio.gather(
                    log.append_async("taken", [LogNote(text="again")], NO_STREAM),
                    log.append_async("fresh", [LogNote(text="new")], NO_STREAM),
                    return_exceptions=True,
                )
            )

        other.append("taken", [LogNote(text="theirs 2")], 0)
        again, fresh = asyncio.run(together())
        assert isinstance(again, ConcurrencyError) and again.actual == 1
        assert fresh.versions == [0]
        assert log.append("taken", [LogNote(text="mine")], 1).versions == [2]
        assert [r.event for r in log.read_stream("taken")] == [
            LogNote(text="theirs"),
            LogNote(text="theirs 2"),
            LogNote(text="mine"),
        ]
        # A guess whose submission failed for another reason was never checked: the next
        # append to that stream does not take it as known to be new. (The stream is older
        # than this writer's last commit, so the tail it assumes is still the log's.)
        other.append("hidden", [LogNote(text="theirs")], NO_STREAM)
        log.append("warm", [LogNote(text="x")])
        with pytest.raises(ConcurrencyError) as refused:
            log.append_batch(
                [
                    AppendRequest("hidden", [LogNote(text="mine")], NO_STREAM),
                    AppendRequest("warm", [LogNote(text="x")], 99),
                ]
            )
        assert refused.value.stream == "warm"
        with pytest.raises(ConcurrencyError) as refused:
            log.append("hidden", [LogNote(text="mine")], NO_STREAM)
        assert (refused.value.stream, refused.value.actual) == ("hidden", 0)
        assert log.verify().ok


# A request without events (an assertion: a fenced command's epoch check, issue 8) is checked
# like any expected version and adds no row, no link and no statement.


def test_an_assertion_in_front_of_a_request_links_nothing_and_still_fails_the_batch(
    log: EventLog, linked: list[int]
) -> None:
    """A fenced finalize-shaped append (assertion + one request of two events): only the
    two events are linked; with the assertion's version wrong, nothing is appended."""
    log.append("epoch", [LogNote(text="epoch 1")], NO_STREAM)
    del linked[:]
    two = [LogNote(text="finalized"), LogNote(text="cleared")]
    fence, request = AppendRequest("epoch", [], 0), AppendRequest("group/g1", two, NO_STREAM)
    results = log.append_batch([fence, request])
    assert linked == [2]
    assert [(r.stream, r.seqs, r.versions) for r in results] == [
        ("epoch", [], []),
        ("group/g1", [2, 3], [0, 1]),
    ]
    with pytest.raises(ConcurrencyError) as refused:
        log.append_batch([AppendRequest("epoch", [], 1), AppendRequest("group/g1", two, 1)])
    assert refused.value.stream == "epoch"
    assert log.head() == 3 and log.verify().ok


def test_an_assertion_on_a_stream_the_writer_knows_adds_no_statement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer knows the versions its own commits left, so the epoch check of a fenced
    command is a comparison in memory: the fenced append sends exactly the statements of
    the unfenced one (no version read for the asserted stream)."""
    statements = _traced(monkeypatch)
    with EventLog.open(tmp_path / "log.db") as log:
        log.append("epoch", [LogNote(text="epoch 1")], NO_STREAM)
        log.append("group/g1", [LogNote(text="first")], NO_STREAM)
        statements.clear()
        log.append("group/g1", [LogNote(text="unfenced")], 0)
        unfenced = list(statements)
        statements.clear()
        log.append_batch(
            [AppendRequest("epoch", [], 0), AppendRequest("group/g1", [LogNote(text="f")], 1)]
        )
        fenced = list(statements)
    assert not any("max(version)" in s for s in fenced)
    assert [s.split()[0] for s in fenced] == [s.split()[0] for s in unfenced]
    assert len(fenced) == len(unfenced)


def test_cpu_seconds_counts_every_append_once(log_target: str) -> None:
    """`EventLog.cpu_seconds` (what the rollout benchmark charges the log): a synchronous
    caller's time covers its encoding and the commit it leads, the writer thread's covers
    the commits it leads for `append_async`; none is counted twice, so the total stays
    within the process's own CPU time."""
    with EventLog.open(log_target, count_cpu=True) as log:
        process, before = time.process_time(), log.cpu_seconds
        assert before is not None
        for index in range(200):
            log.append(f"sync/{index}", [LogNote(text="x")], NO_STREAM)
        synchronous = cast(float, log.cpu_seconds) - before

        async def appends() -> None:
            await asyncio.gather(
                *(
                    log.append_async(f"async/{i}", [LogNote(text="y")], NO_STREAM)
                    for i in range(200)
                )
            )

        asyncio.run(appends())
        spent = cast(float, log.cpu_seconds) - before
    assert 0 < synchronous < spent <= time.process_time() - process


def test_a_caller_s_cpu_is_read_only_where_asked_for(
    log_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread's CPU clock is a system call: an append read it twice, on every append, for
    a number only the benchmarks use. Without `count_cpu` no caller reads it (the writer
    thread still counts its commits, once per batch) and `cpu_seconds` says so."""
    read_by: list[str] = []
    clock = time.thread_time

    def reading() -> float:
        read_by.append(threading.current_thread().name)
        return clock()

    monkeypatch.setattr(time, "thread_time", reading)
    with EventLog.open(log_target) as log:
        log.append("sync", [LogNote(text="x")])

        async def one() -> None:
            await log.append_async("async", [LogNote(text="y")])

        asyncio.run(one())
        assert log.cpu_seconds is None
    assert threading.main_thread().name not in read_by
    with EventLog.open(log_target, count_cpu=True) as log:
        log.append("sync", [LogNote(text="x")])
    assert read_by.count(threading.main_thread().name) == 2


def test_a_writer_that_reconnected_reads_the_tail_of_the_file_it_now_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed append drops the writer's connection; the file may be another by the next
    one (a backup copied back in the meantime, a shorter log): the new connection reads the
    tail instead of guessing the one it knew, so the append lands at the file's own head + 1
    on an unbroken chain, not after seqs the file no longer holds."""
    path, saved = tmp_path / "log.db", tmp_path / "backup.db"
    with EventLog.open(path) as log:
        for version in range(3):
            log.append("s", [LogNote(text="x")], version - 1 if version else NO_STREAM)
        log.backup(saved)  # head 3
        for version in range(3, 6):
            log.append("s", [LogNote(text="x")], version - 1)  # head 6, the tail guessed
        begin = SqliteDialect.begin_write

        def failing(self: Any, cursor: Any) -> None:
            raise sqlite3.OperationalError("disk I/O error")

        monkeypatch.setattr(SqliteDialect, "begin_write", failing)
        with pytest.raises(StorageUnavailableError):  # the writer drops its connection
            log.append("s", [LogNote(text="lost")], 5)
        monkeypatch.setattr(SqliteDialect, "begin_write", begin)
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        copy = tmp_path / "restored.db"
        shutil.copyfile(saved, copy)
        os.replace(copy, path)  # the backup restored in place
        landed = log.append("t", [LogNote(text="after the restore")], NO_STREAM)
    assert landed.seqs == [4]
    with EventLog.open(path) as reopened:
        assert reopened.verify().ok and reopened.head() == 4


def test_a_lone_request_on_the_writers_own_tail_is_planned_with_nothing_to_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commonest append on SQLite, one request with minted ids from a writer alone on its
    file, opens its batch without sorting the batch's streams into read and guessed ones
    (`_assumable` is not asked), whether the writer knows the stream or takes it to be new;
    a wrong guess is still refused by the unique index and fails with its own error."""
    import eventlog.store.base as base

    asked: list[list[str]] = []
    assumable = base._assumable

    def asking(submissions: Any, missing: list[str]) -> tuple[list[str], list[str]]:
        asked.append(sorted(missing))
        return assumable(submissions, missing)

    monkeypatch.setattr(base, "_assumable", asking)
    path = tmp_path / "log.db"
    with EventLog.open(path) as log, EventLog.open(path) as other:
        other.append("older", [LogNote(text="theirs")], NO_STREAM)
        log.append("warm", [LogNote(text="x")], NO_STREAM)
        log.append("warm", [LogNote(text="x")], 0)  # its own tail from here on
        asked.clear()
        log.append("new", [LogNote(text="x")], NO_STREAM)
        log.append("new", [LogNote(text="y")], 0)
        assert asked == []
        log.append_batch([AppendRequest(s, [LogNote(text="x")], NO_STREAM) for s in "pq"])
        assert asked == [["p", "q"]]
        with pytest.raises(ConcurrencyError) as refused:  # older than its last commit
            log.append("older", [LogNote(text="mine")], NO_STREAM)
        assert (refused.value.stream, refused.value.actual) == ("older", 0)
        assert log.append("new", [LogNote(text="z")], 1).seqs == [8]
        assert log.verify().ok


def test_a_refusal_planned_again_after_the_tail_moved_keeps_the_writers_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch that adds no row and finds the tail moved is rolled back and planned again;
    nothing failed, so the writer keeps its connection (only a failed transaction drops it)."""
    opened: list[int] = []
    setup = SqliteDialect.writer_connection

    def counting(self: SqliteDialect, dbapi: Any) -> None:
        opened.append(id(dbapi))
        setup(self, dbapi)

    monkeypatch.setattr(SqliteDialect, "writer_connection", counting)
    path = tmp_path / "log.db"
    with EventLog.open(path) as log, EventLog.open(path) as other:
        log.append("a", [LogNote(text="x")], NO_STREAM)
        log.append("a", [LogNote(text="x")], 0)  # its own tail from here on
        mine = list(opened)
        other.append("a", [LogNote(text="theirs")], 1)
        assert log.append("a", [LogNote(text="mine")], 2).versions == [3]  # refused, replanned
        assert len(opened) == len(mine) + 1  # the other writer's connection, no new one
        assert log.verify().ok
