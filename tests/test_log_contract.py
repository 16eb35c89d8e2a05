"""The log's contract, run against every backend (SQLite file, real PostgreSQL server)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from eventlog import (
    ANY,
    NO_STREAM,
    AppendRequest,
    AppendResult,
    ConcurrencyError,
    DuplicateEventError,
    EventLog,
    EventLogError,
    InvalidEventError,
    LogRevisionError,
    Proposed,
    codec,
)
from eventlog.events import Event
from eventlog.log import open_store, resolve_url
from eventlog.store import migrate
from eventlog.store.base import EXPECT_ANY, PreparedEvent, PreparedRequest, SqlStore
from eventlog.store.postgres import LOCK_KEY
from eventlog.writer import GroupCommitWriter
from tests.reliability import drop_append_only, signal_at_begin, until, wait_until
from tests.vocabulary import LogNote


def notes(*texts: str) -> list[LogNote]:
    return [LogNote(text=t) for t in texts]


def raw_engine(target: str) -> sa.Engine:
    return sa.create_engine(resolve_url(target))


@contextlib.contextmanager
def write_lock_held(target: str) -> Iterator[None]:
    """Hold the log's write lock from outside, the way another writer process would."""
    url = resolve_url(target)
    if url.get_backend_name() == "sqlite":
        locker = sqlite3.connect(url.database or "", isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            locker.execute("ROLLBACK")
            locker.close()
    else:
        engine = raw_engine(target)
        with engine.connect() as conn:
            conn.exec_driver_sql(f"SELECT pg_advisory_lock({LOCK_KEY})")
            conn.commit()
            try:
                yield
            finally:
                conn.exec_driver_sql(f"SELECT pg_advisory_unlock({LOCK_KEY})")
                conn.commit()
        engine.dispose()


# -- append and read ---------------------------------------------------------------------


def test_append_assigns_gapless_seqs_and_per_stream_versions(log: EventLog) -> None:
    first = log.append("a", notes("1", "2"), NO_STREAM)
    second = log.append("b", notes("3"), NO_STREAM)
    third = log.append("a", notes("4"), 1)
    assert (first.seqs, first.versions) == ([1, 2], [0, 1])
    assert (second.seqs, second.versions) == ([3], [0])
    assert (third.seqs, third.versions) == ([4], [2])
    assert log.head() == 4
    assert [(r.seq, r.stream, r.version, r.event) for r in log.read()] == [
        (1, "a", 0, LogNote(text="1")),
        (2, "a", 1, LogNote(text="2")),
        (3, "b", 0, LogNote(text="3")),
        (4, "a", 2, LogNote(text="4")),
    ]
    assert [r.event.text for r in log.read_stream("a")] == ["1", "2", "4"]  # type: ignore[attr-defined]
    assert log.stream_version("a") == 2
    assert log.stream_version("missing") is None


def test_read_filters_by_range_stream_and_type(log: EventLog) -> None:
    for i in range(30):
        log.append(f"s{i % 3}", notes(str(i)))
    assert [r.seq for r in log.read(from_seq=5, until_seq=9)] == [5, 6, 7, 8, 9]
    assert [r.seq for r in log.read(streams=["s1"])] == list(range(2, 31, 3))
    assert list(log.read(types=["Unknown"])) == []
    assert len(list(log.read(types=["LogNote"]))) == 30


def test_read_pages_through_more_records_than_one_page(log: EventLog) -> None:
    log.append("big", [LogNote(text="x", n=i) for i in range(2500)])
    seen = [r.event.n for r in log.read()]  # type: ignore[attr-defined]
    assert seen == list(range(2500))
    assert [r.version for r in log.read_stream("big", from_version=2400)] == list(range(2400, 2500))


# -- concurrency control -----------------------------------------------------------------


def test_expected_version_mismatch_names_stream_expected_and_actual_and_writes_nothing(
    log: EventLog,
) -> None:
    log.append("g", notes("a", "b"), NO_STREAM)
    with pytest.raises(ConcurrencyError) as caught:
        log.append("g", notes("c"), 0)
    assert (caught.value.stream, caught.value.actual) == ("g", 1)
    assert "'g'" in str(caught.value) and "version 0" in str(caught.value)
    with pytest.raises(ConcurrencyError, match="no stream"):
        log.append("g", notes("c"), NO_STREAM)
    with pytest.raises(ConcurrencyError, match="found no stream"):
        log.append("fresh", notes("c"), 0)
    assert log.head() == 2
    assert log.append("g", notes("c"), ANY).versions == [2]


def test_failing_request_in_a_batch_leaves_nothing(log: EventLog) -> None:
    log.append("taken", notes("x"), NO_STREAM)
    with pytest.raises(ConcurrencyError):
        log.append_batch(
            [
                AppendRequest("new", notes("1", "2"), NO_STREAM),
                AppendRequest("taken", notes("3"), NO_STREAM),
            ]
        )
    assert log.head() == 1
    assert log.stream_version("new") is None


def test_a_request_without_events_asserts_a_version_and_appends_nothing(log: EventLog) -> None:
    """ "Append nothing, but require stream S at version v": a fence for the rest of a batch."""
    log.append("fence", notes("epoch 1"), NO_STREAM)
    landed = log.append_batch(
        [AppendRequest("fence", [], 0), AppendRequest("work", notes("a"), NO_STREAM)]
    )
    assert [(r.stream, r.seqs, r.versions) for r in landed] == [
        ("fence", [], []),
        ("work", [2], [0]),
    ]
    assert log.append("absent", [], NO_STREAM).seqs == []
    log.append("fence", notes("epoch 2"), 0)
    for expected in (0, NO_STREAM):
        with pytest.raises(ConcurrencyError, match="'fence': expected") as caught:
            log.append_batch(
                [AppendRequest("fence", [], expected), AppendRequest("work", notes("b"), 0)]
            )
        assert (caught.value.stream, caught.value.actual) == ("fence", 1)
    with pytest.raises(ConcurrencyError, match="found no stream"):
        log.append("absent", [], 0)
    assert log.head() == 3
    assert log.stream_version("work") == 0
    assert log.stream_version("absent") is None


def test_an_async_request_without_events_asserts_a_version_too(log: EventLog) -> None:
    log.append("fence", notes("epoch 1"), NO_STREAM)

    async def main() -> None:
        await log.append_batch_async([AppendRequest("fence", [], 0)])
        with pytest.raises(ConcurrencyError):
            await log.append_batch_async(
                [AppendRequest("fence", [], NO_STREAM), AppendRequest("w", notes("x"), NO_STREAM)]
            )

    asyncio.run(main())
    assert log.head() == 1


def test_invalid_items_are_rejected_before_anything_is_written(log: EventLog) -> None:
    with pytest.raises(InvalidEventError, match="item 1 is a dict"):
        log.append("s", [LogNote(text="ok"), {"text": "not an event"}])  # type: ignore[list-item]
    with pytest.raises(InvalidEventError, match="stream must be"):
        log.append("", notes("x"))
    with pytest.raises(InvalidEventError, match="expected_version"):
        log.append("s", notes("x"), -1)
    for flag in (False, True):  # bools are ints to Python, not versions
        with pytest.raises(InvalidEventError, match="expected_version"):
            log.append("s", notes("x"), flag)
    request = AppendRequest("s", notes("x"))
    with pytest.raises(InvalidEventError, match="takes AppendRequests, found tuple"):
        log.append_batch([request, ("s", notes("y"))])  # type: ignore[list-item]
    with pytest.raises(InvalidEventError, match="takes AppendRequests, found AppendRequest"):
        log.append_batch(request)  # type: ignore[arg-type]
    for events in (LogNote(text="x"), None):  # one event, not a list of them; none at all
        with pytest.raises(InvalidEventError, match="events must be a list of events, found"):
            log.append("s", events)  # type: ignore[arg-type]
    assert log.head() == 0


def test_any_iterable_of_requests_or_events_is_appended(log: EventLog) -> None:
    """A generator of requests, or of events, is taken as a list of them, sync and async."""
    log.append_batch(AppendRequest(f"s{i}", notes("x")) for i in range(2))  # type: ignore[arg-type]
    log.append("t", (note for note in notes("a", "b")))  # type: ignore[arg-type]

    async def queued() -> None:
        await log.append_batch_async(iter([AppendRequest("u", notes("y"))]))  # type: ignore[arg-type]

    asyncio.run(queued())
    assert [r.stream for r in log.read()] == ["s0", "s1", "t", "t", "u"]


# -- idempotency -------------------------------------------------------------------------


def test_retry_with_same_ids_and_content_returns_original_positions(log: EventLog) -> None:
    ids = [uuid.uuid4(), uuid.uuid4()]
    proposed = [Proposed(LogNote(text=t), i) for t, i in zip("ab", ids, strict=True)]
    first = log.append("r", proposed, NO_STREAM)
    log.append("other", notes("between"))
    again = log.append("r", proposed, NO_STREAM)  # expected version no longer holds: a retry
    assert again.seqs == first.seqs == [1, 2]
    assert again.event_ids == ids
    assert log.head() == 3


def test_a_retry_of_an_append_with_a_minted_id_says_why_it_cannot_be_retried(
    log: EventLog,
) -> None:
    """Its minted id is new on every try, so the exact repeat is no retry: said as "a retry
    must repeat the original append exactly", which it did."""
    request: list[Event | Proposed] = [Proposed(LogNote(text="a"), uuid.uuid4()), LogNote(text="b")]
    log.append("m", request)
    with pytest.raises(InvalidEventError) as caught:
        log.append("m", request)
    assert str(caught.value) == (
        "stream 'm': 1 of 2 event ids are already stored, and 1 of its events have no chosen "
        "id; an append is retried by its ids only when every event's id is chosen"
    )
    assert log.head() == 2


def test_same_event_id_with_different_content_is_a_duplicate_error(log: EventLog) -> None:
    event_id = uuid.uuid4()
    log.append("d", [Proposed(LogNote(text="original"), event_id)])
    with pytest.raises(DuplicateEventError) as caught:
        log.append("d", [Proposed(LogNote(text="changed"), event_id)])
    assert caught.value.seq == 1 and str(event_id) in str(caught.value)
    with pytest.raises(DuplicateEventError):
        log.append("elsewhere", [Proposed(LogNote(text="original"), event_id)])
    assert log.head() == 1


def test_seq_of_says_where_an_event_id_is_stored_and_none_where_it_is_not(log: EventLog) -> None:
    """What a caller whose append lost its answer (an interrupt, a connection lost at
    commit) asks: did it land? One id answers for its whole batch."""
    chosen = uuid.uuid4()
    log.append("a", notes("before"))
    assert log.seq_of(chosen) is None
    log.append("b", [Proposed(LogNote(text="x"), chosen), LogNote(text="y")])
    assert log.seq_of(chosen) == 2
    assert log.seq_of(uuid.uuid4()) is None


def test_a_commit_stopped_by_ctrl_c_logs_no_traceback(
    log: EventLog, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Only an error no caller reports is logged with its traceback: a KeyboardInterrupt in
    the commit printed one beside the CLI's "interrupted"."""

    def stopped(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(SqlStore, "write", stopped)
    with caplog.at_level(logging.DEBUG, logger="eventlog.writer"), pytest.raises(KeyboardInterrupt):
        log.append("s", notes("a"))
    assert [r.levelname for r in caplog.records if r.exc_info] == []


# -- group commit ------------------------------------------------------------------------


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The submissions queued for the writer thread from now on (by threads that found a
    commit in progress, and by asyncio callers)."""
    found: list[object] = []

    def counted(queue: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def counting(self: GroupCommitWriter, submission: Any) -> Any:
            found.append(submission)
            return queue(self, submission)

        return counting

    for name in ("submit", "submit_async"):
        monkeypatch.setattr(GroupCommitWriter, name, counted(getattr(GroupCommitWriter, name)))
    return found


def test_concurrent_appenders_share_commits_and_a_bad_one_fails_alone(
    log: EventLog, log_target: str, queued: list[object]
) -> None:
    log.append("conflict", notes("x"), NO_STREAM)
    results: dict[int, object] = {}

    def appender(i: int) -> None:
        try:
            if i == 7:
                log.append("conflict", notes("bad"), NO_STREAM)
            else:
                results[i] = log.append(f"t{i}", notes(str(i)), NO_STREAM)
        except ConcurrencyError as exc:
            results[i] = exc

    commits_before = log.commits
    with write_lock_held(log_target):
        threads = [threading.Thread(target=appender, args=(i,)) for i in range(64)]
        for thread in threads:
            thread.start()
        wait_until(lambda: len(queued) == 63)  # all but the one leading its own commit
    for thread in threads:
        thread.join()
    assert isinstance(results[7], ConcurrencyError)
    landed = [i for i in range(64) if i != 7]
    assert all(log.stream_version(f"t{i}") == 0 for i in landed)
    assert log.head() == 64
    assert log.commits - commits_before <= 3  # 63 appends, at most a few transactions
    assert log.verify().ok


def test_a_chosen_id_that_is_not_a_uuid_is_refused_before_queueing_and_fails_alone(
    log: EventLog, log_target: str
) -> None:
    """A Proposed id must be a uuid.UUID: anything else is the caller's mistake, named by
    stream and item, and never reaches the writer, so a batch it would share lands."""
    text_id = str(uuid.uuid4())
    with pytest.raises(InvalidEventError, match=r"stream 'bad': item 1: .*uuid\.UUID, found str"):
        log.append("bad", [LogNote(text="a"), Proposed(LogNote(text="b"), text_id)])  # type: ignore[arg-type]

    appends: list[tuple[str, list[LogNote | Proposed]]] = [
        (f"ok{i}", [LogNote(text="x")]) for i in range(10)
    ]
    appends.insert(5, ("bad", [Proposed(LogNote(text="b"), text_id)]))  # type: ignore[arg-type]

    async def main() -> list[object]:
        with write_lock_held(log_target):  # all of them queue for one commit
            tasks = [asyncio.create_task(log.append_async(s, events)) for s, events in appends]
            await asyncio.sleep(0.3)
        return await asyncio.gather(*tasks, return_exceptions=True)

    outcomes = asyncio.run(main())
    assert isinstance(outcomes.pop(5), InvalidEventError)
    assert all(isinstance(o, AppendResult) for o in outcomes), outcomes
    assert log.head() == 10 and log.stream_version("bad") is None
    assert log.verify().ok


def test_a_submission_failing_its_batch_untranslated_is_isolated_not_shared(
    log_target: str,
) -> None:
    """The store isolates a culprit whatever it fails with: a batch whose transaction fails
    with an error that is no database refusal (here a chosen id that is not a UUID, which
    EventLog refuses before the store sees it) is retried one submission at a time, so the
    others land once each and only the culprit fails, typed."""
    EventLog.open(log_target).close()
    store = open_store(log_target)
    type_name, schema, payload = codec.encode(LogNote(text="x"))

    def submission(stream: str, chosen: object = None) -> list[PreparedRequest]:
        event = PreparedEvent(type_name, schema, payload, chosen)  # type: ignore[arg-type]
        return [PreparedRequest(stream, EXPECT_ANY, (event,), chosen is not None)]

    try:
        outcomes = store.write(
            [submission("a"), submission("bad", str(uuid.uuid4())), submission("b")]
        )
    finally:
        store.close()
    assert isinstance(outcomes[1], EventLogError)
    landed = [o for o in outcomes if not isinstance(o, EventLogError)]
    assert [result.seqs for results in landed for result in results] == [[1], [2]]
    with EventLog.open(log_target) as log:
        assert [r.stream for r in log.read_records()] == ["a", "b"]
        assert log.verify().ok


def test_asyncio_appenders_each_get_their_own_result(log: EventLog, log_target: str) -> None:
    async def main() -> list[object]:
        async def one(i: int) -> object:
            try:
                expected = NO_STREAM if i % 10 else 5  # every tenth expects a version it lacks
                return await log.append_async(f"a{i}", notes(str(i)), expected)
            except ConcurrencyError as exc:
                return exc

        return await asyncio.gather(*(one(i) for i in range(50)))

    outcomes = asyncio.run(main())
    failed = [i for i, o in enumerate(outcomes) if isinstance(o, ConcurrencyError)]
    assert failed == list(range(0, 50, 10))
    assert log.head() == 45
    assert sorted(o.seqs[0] for o in outcomes if not isinstance(o, Exception)) == list(  # type: ignore[attr-defined]
        range(1, 46)
    )


# -- readers never skip ------------------------------------------------------------------


def test_readers_tailing_concurrent_writers_never_see_a_hole(log_target: str) -> None:
    backend = resolve_url(log_target).get_backend_name()
    writers, per_writer = (8, 1250) if backend == "sqlite" else (5, 100)
    total = writers * per_writer
    with EventLog.open(log_target, durability="normal") as log:
        stop = threading.Event()
        holes: list[str] = []

        def reader() -> None:
            last = 0
            while last < total and not stop.is_set():
                for record in log.read_records(from_seq=last + 1):
                    if record.seq != last + 1:
                        holes.append(f"after seq {last} read seq {record.seq}")
                        return
                    last = record.seq

        def writer(w: int) -> None:
            for i in range(per_writer):
                log.append(f"w{w}", [LogNote(text="x", n=i)])

        readers = [threading.Thread(target=reader) for _ in range(2)]
        threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
        for thread in readers + threads:
            thread.start()
        for thread in threads:
            thread.join()
        for thread in readers:
            thread.join(timeout=60)
        stop.set()
        assert holes == []
        assert log.head() == total
        assert all(log.stream_version(f"w{w}") == per_writer - 1 for w in range(writers))


async def _collect(log: EventLog, count: int) -> list[int]:
    seen: list[int] = []
    async for record in log.subscribe(from_seq=1, poll_interval=0.2):
        seen.append(record.seq)
        if len(seen) == count:
            break
    return seen


def test_subscribe_catches_up_then_follows_new_appends(log: EventLog) -> None:
    log.append("s", notes("1", "2", "3"))

    async def main() -> list[int]:
        follower = asyncio.create_task(_collect(log, 6))
        await asyncio.sleep(0.3)
        for text in "456":
            await log.append_async("s", notes(text))
        return await asyncio.wait_for(follower, timeout=20)

    assert asyncio.run(main()) == [1, 2, 3, 4, 5, 6]


# -- several processes on one SQLite file ------------------------------------------------

_CHILD = """
import sys
from eventlog import EventLog
from tests.vocabulary import LogNote
with EventLog.open(sys.argv[1]) as log:
    for i in range(int(sys.argv[3])):
        log.append(sys.argv[2], [LogNote(text="p", n=i)])
"""


def test_several_processes_append_to_one_sqlite_file(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.db")
    EventLog.open(path).close()
    root = Path(__file__).resolve().parents[1]
    children = [
        subprocess.Popen([sys.executable, "-c", _CHILD, path, f"proc{p}", "150"], cwd=root)
        for p in range(3)
    ]
    assert [child.wait(timeout=120) for child in children] == [0, 0, 0]
    with EventLog.open(path) as log:
        assert log.head() == 450
        for p in range(3):
            assert [r.event.n for r in log.read_stream(f"proc{p}")] == list(range(150))  # type: ignore[attr-defined]
        assert log.verify().ok


# -- tamper evidence ---------------------------------------------------------------------


def _fill(target: str) -> None:
    with EventLog.open(target) as log:
        for i in range(10):
            log.append(f"s{i % 2}", [LogNote(text=f"note {i}", n=i)])


def _verify_first_bad(target: str) -> tuple[int | None, list[str]]:
    with EventLog.open(target) as log:
        report = log.verify()
    return report.first_bad_seq, [p.kind for p in report.problems]


def test_intact_log_verifies_and_reports_its_anchor(log: EventLog) -> None:
    log.append("s", notes("a", "b"))
    report = log.verify()
    assert report.ok and report.records == 2 and report.head == 2
    assert report.last_chain == log.tail_chain()[1].hex()


def test_edited_payload_is_named_by_seq(log_target: str) -> None:
    _fill(log_target)
    with raw_engine(log_target).begin() as conn:
        drop_append_only(conn)
        payload = conn.execute(sa.text("SELECT payload FROM events WHERE seq = 6")).scalar_one()
        tampered = bytes(payload).replace(b"note 5", b"note X")
        conn.execute(sa.text("UPDATE events SET payload = :p WHERE seq = 6"), {"p": tampered})
    assert _verify_first_bad(log_target) == (6, ["chain"])


def test_deleted_row_is_named_by_seq(log_target: str) -> None:
    _fill(log_target)
    with raw_engine(log_target).begin() as conn:
        drop_append_only(conn)
        conn.execute(sa.text("DELETE FROM events WHERE seq = 4"))
    first, kinds = _verify_first_bad(log_target)
    assert first == 4 and kinds[0] == "gap"


def test_swapped_rows_are_named_by_seq(log_target: str) -> None:
    _fill(log_target)
    with raw_engine(log_target).begin() as conn:
        drop_append_only(conn)
        conn.execute(sa.text("UPDATE events SET seq = -1 WHERE seq = 3"))
        conn.execute(sa.text("UPDATE events SET seq = 3 WHERE seq = 8"))
        conn.execute(sa.text("UPDATE events SET seq = 8 WHERE seq = -1"))
    first, kinds = _verify_first_bad(log_target)
    assert first == 3 and "chain" in kinds


# -- schema revisions --------------------------------------------------------------------


def test_migrations_round_trip_down_to_base_and_up_again(log_target: str) -> None:
    _fill(log_target)
    engine = raw_engine(log_target)
    head = migrate.head_revision(engine)
    assert migrate.current_revision(engine) == head
    migrate.downgrade(engine, "base")
    assert migrate.current_revision(engine) is None
    assert "events" not in sa.inspect(engine).get_table_names()
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == head
    engine.dispose()
    with EventLog.open(log_target) as log:
        assert log.head() == 0
        log.append("s", notes("after"))
        log.save_snapshot("p", 1, b"state")
        assert log.load_snapshot("p") == (1, b"state")


def test_log_at_older_revision_is_refused_with_the_upgrade_command(log_target: str) -> None:
    _fill(log_target)
    engine = raw_engine(log_target)
    migrate.downgrade(engine, "0001")
    engine.dispose()
    with pytest.raises(LogRevisionError) as caught:
        EventLog.open(log_target)
    assert "0001" in str(caught.value)
    assert caught.value.hint is not None and "eventlog db upgrade" in caught.value.hint


def test_log_at_newer_revision_is_refused(log_target: str) -> None:
    _fill(log_target)
    with raw_engine(log_target).begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'f00d'"))
    with pytest.raises(LogRevisionError, match="newer than this eventlog"):
        EventLog.open(log_target)


def test_new_log_records_its_identity_and_hash_algorithm(log: EventLog) -> None:
    info = log.info()
    assert uuid.UUID(info["log_id"])
    assert info["hash_algorithm"] == "sha256"
    assert int(info["created_at_ns"]) > 0
    assert info["head"] == "0"


def test_missing_log_is_not_created_when_create_is_false(tmp_path: Path) -> None:
    with pytest.raises(LogRevisionError, match="no eventlog log here"):
        EventLog.open(tmp_path / "absent.db", create=False)


# -- snapshots and durability modes ------------------------------------------------------


def test_snapshots_are_found_at_or_before_a_seq(log: EventLog) -> None:
    log.append("s", notes(*["x"] * 20))  # a snapshot is of a seq the log has reached
    log.save_snapshot("siblings", 10, b"ten")
    log.save_snapshot("siblings", 20, b"twenty")
    assert log.load_snapshot("siblings") == (20, b"twenty")
    assert log.load_snapshot("siblings", 15) == (10, b"ten")
    assert log.load_snapshot("siblings", 5) is None
    assert log.load_snapshot("other") is None


def test_normal_durability_appends_and_reads_the_same(log_target: str) -> None:
    with EventLog.open(log_target, durability="normal") as log:
        log.append("s", notes("a"))
        assert [r.event for r in log.read()] == [LogNote(text="a")]
    with pytest.raises(InvalidEventError, match="durability"):
        EventLog.open(log_target, durability="paranoid")  # type: ignore[arg-type]


def test_a_second_writer_on_the_same_log_is_seen_by_the_first(log_target: str) -> None:
    with EventLog.open(log_target) as first, EventLog.open(log_target) as second:
        first.append("shared", notes("a"), NO_STREAM)
        second.append("shared", notes("b"), 0)
        with pytest.raises(ConcurrencyError) as caught:
            first.append("shared", notes("stale"), 0)  # first's own last write said version 0
        assert caught.value.actual == 1
        assert first.append("shared", notes("c"), 1).seqs == [3]
        assert first.verify().ok


def test_cancelling_an_awaiting_append_neither_withdraws_it_nor_breaks_the_writer(
    log: EventLog, log_target: str
) -> None:
    async def main() -> int:
        with write_lock_held(log_target):
            waiting = asyncio.create_task(log.append_async("c", notes("queued")))
            await asyncio.sleep(0.3)
            waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return (await log.append_async("c", notes("after"))).seqs[0]

    assert asyncio.run(main()) == 2  # the queued append was already handed to the writer
    assert [r.event.text for r in log.read_stream("c")] == ["queued", "after"]  # type: ignore[attr-defined]


def test_one_chosen_id_twice_in_one_append_is_refused_and_writes_nothing(log: EventLog) -> None:
    event_id = uuid.uuid4()
    twice = [Proposed(LogNote(text="a"), event_id), Proposed(LogNote(text="a"), event_id)]
    with pytest.raises(InvalidEventError, match="appears twice in one append"):
        log.append("s", twice)
    assert log.head() == 0


def test_a_retry_racing_its_original_in_one_commit_gets_the_same_positions(
    log: EventLog, log_target: str, queued: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    proposed = [Proposed(LogNote(text="once"), uuid.uuid4())]
    taken = threading.Event()
    signal_at_begin(monkeypatch, taken)

    async def main() -> list[list[int]]:
        with write_lock_held(log_target):
            blocker = asyncio.create_task(log.append_async("blocker", notes("b")))
            await until(taken.is_set)  # the writer took the blocker alone and waits
            both = [asyncio.create_task(log.append_async("r", proposed)) for _ in range(2)]
            await until(lambda: len(queued) >= 3)  # both behind it: one batch once it commits
        await blocker
        return [result.seqs for result in await asyncio.gather(*both)]

    commits = log.commits
    assert asyncio.run(main()) == [[2], [2]]
    assert log.head() == 2
    assert log.commits - commits == 2  # the blocker's, then the pair's
