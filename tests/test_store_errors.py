"""One error contract: a held lock, a lost connection or a refused write raise the same typed
error whether the append was alone or in a batch, within the busy timeout, and the CLI maps it
to exit 6 with one line and no traceback."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from eventlog import NO_STREAM, EventLog
from eventlog.cli.exits import ExitCode, exit_code_for
from eventlog.cli.main import main
from eventlog.errors import (
    ConcurrencyError,
    InvalidEventError,
    StorageDamagedError,
    StorageError,
    StorageIntegrityError,
    StorageUnavailableError,
)
from tests.reliability import calls_recorded, write_lock_held
from tests.vocabulary import LogNote

BUSY = 0.5
CALLERS = 16


def test_a_held_write_lock_fails_a_lone_append_typed_within_the_busy_timeout(
    log_target: str,
) -> None:
    with EventLog.open(log_target, busy_timeout=BUSY) as log:
        log.append("s", [LogNote(text="before")])
        with write_lock_held(log_target):
            started = time.monotonic()
            with pytest.raises(StorageUnavailableError) as caught:
                log.append("s", [LogNote(text="blocked")])
            elapsed = time.monotonic() - started
        assert BUSY * 0.8 <= elapsed < BUSY + 10.0  # (a busy machine oversleeps)
        assert exit_code_for(caught.value) == ExitCode.DATABASE
        assert log.head() == 1  # nothing of the failed append landed
        assert log.append("s", [LogNote(text="after")]).seqs == [2]  # and the log goes on


def test_a_busy_timeout_of_zero_fails_an_append_at_once_rather_than_never(
    log_target: str,
) -> None:
    """0 s means "do not wait": PostgreSQL's lock_timeout = 0 means the opposite (wait
    forever), so the store never sends it. The append runs in a thread: a wait without end
    cannot be interrupted in the driver, so the test gives up on it and lets the lock go."""
    outcome: list[object] = []

    def append(log: EventLog) -> None:
        try:
            outcome.append(log.append("s", [LogNote(text="blocked")]))
        except Exception as exc:
            outcome.append(exc)

    with EventLog.open(log_target, busy_timeout=0) as log:
        with write_lock_held(log_target):
            started = time.monotonic()
            appender = threading.Thread(target=append, args=(log,))
            appender.start()
            appender.join(timeout=10)
            elapsed = time.monotonic() - started
        appender.join(timeout=30)  # the lock is free: an append still waiting lands now
        assert elapsed < 5.0, f"an append with busy_timeout=0 waited {elapsed:.1f} s"
        assert len(outcome) == 1 and isinstance(outcome[0], StorageUnavailableError), outcome
        assert log.head() == 0
        assert log.append("s", [LogNote(text="after")]).seqs == [1]


def test_a_held_write_lock_fails_every_caller_of_a_batch_once_not_one_by_one(
    log_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """N concurrent callers hear back after about one busy timeout, never (N + 1) of them:
    counted as the transactions that waited for the lock (a busy machine oversleeps)."""
    began = calls_recorded(monkeypatch, "begin_write")

    async def appends(log: EventLog) -> list[BaseException | object]:
        tasks = [log.append_async(f"s{i}", [LogNote(text="x", n=i)]) for i in range(CALLERS)]
        return await asyncio.gather(*tasks, return_exceptions=True)

    with EventLog.open(log_target, busy_timeout=BUSY) as log:
        with write_lock_held(log_target):
            started = time.monotonic()
            outcomes = asyncio.run(appends(log))
            elapsed = time.monotonic() - started
        assert all(isinstance(o, StorageUnavailableError) for o in outcomes), outcomes
        # Batches form while the first waits: two or three waits at most, far below the
        # (CALLERS + 1) waits a one-by-one retry costs.
        assert len(began) <= 3, f"{CALLERS} callers waited in {len(began)} transactions"
        assert elapsed < 30, f"{CALLERS} callers took {elapsed:.2f} s"
        assert log.head() == 0


def test_cli_append_against_a_held_lock_exits_6_with_one_line(tmp_path: Path) -> None:
    target = str(tmp_path / "log.db")
    EventLog.open(target).close()
    line = '{"stream": "s", "type": "LogNote", "data": {"text": "x"}}\n'
    with write_lock_held(target):
        result = CliRunner().invoke(
            main,
            ["--events-module", "tests.vocabulary", "append", target],
            input=line,
            env={"EVENTLOG_BUSY_TIMEOUT": str(BUSY)},
            catch_exceptions=False,
        )
    assert result.exit_code == 6 == ExitCode.DATABASE.value
    assert result.stderr.startswith(f"error: {target}: database unavailable: database is locked")
    assert "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_cli_rejects_a_busy_timeout_that_is_not_seconds(tmp_path: Path) -> None:
    target = str(tmp_path / "log.db")
    EventLog.open(target).close()
    result = CliRunner().invoke(
        main, ["info", target], env={"EVENTLOG_BUSY_TIMEOUT": "soon"}, catch_exceptions=False
    )
    assert result.exit_code == ExitCode.USAGE
    assert "EVENTLOG_BUSY_TIMEOUT='soon'" in result.stderr


@pytest.mark.parametrize("value", [-1, float("nan"), "5", True, 10**9])
def test_open_rejects_a_busy_timeout_that_is_not_seconds(tmp_path: Path, value: object) -> None:
    with pytest.raises(InvalidEventError, match="busy_timeout"):
        EventLog.open(tmp_path / "log.db", busy_timeout=value)  # type: ignore[arg-type]
    assert not (tmp_path / "log.db").exists()


def test_a_file_that_is_not_a_database_is_a_typed_damaged_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"not a database " * 400)
    with pytest.raises(StorageDamagedError, match="not a database") as caught:
        EventLog.open(path)
    assert exit_code_for(caught.value) == ExitCode.DATABASE


def test_an_unreachable_server_is_storage_unavailable() -> None:
    with pytest.raises(StorageUnavailableError, match="database unavailable"):
        EventLog.open("postgresql://nobody@127.0.0.1:1/none", busy_timeout=1)


def test_storage_errors_are_one_family_under_exit_6() -> None:
    for cls in (StorageUnavailableError, StorageIntegrityError, StorageDamagedError):
        assert issubclass(cls, StorageError)
        assert exit_code_for(cls("x")) == ExitCode.DATABASE


def test_the_writer_does_not_log_a_traceback_for_a_typed_storage_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = str(tmp_path / "log.db")
    with (
        EventLog.open(target, busy_timeout=0.2) as log,
        write_lock_held(target),
        pytest.raises(StorageUnavailableError),
    ):
        asyncio.run(log.append_async("s", [LogNote(text="x")]))
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


@pytest.mark.postgres
def test_a_lost_listener_connection_is_a_typed_error_and_the_next_wait_listens_again(
    fresh_postgres_url: str,
) -> None:
    """After a server restart (here: the listener's backend terminated) a subscriber got the
    raw driver error, and every later wait failed at once on the dead connection."""
    import psycopg

    from eventlog.store.postgres import LISTENER_NAME
    from tests.reliability import libpq_url

    with EventLog.open(fresh_postgres_url) as log:
        log.wait_for_append(0, timeout=0.01)  # listening now
        with psycopg.connect(libpq_url(fresh_postgres_url), autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s AND pid <> pg_backend_pid()",
                [LISTENER_NAME],
            )
        with pytest.raises(StorageUnavailableError):
            log.wait_for_append(0, timeout=1.0)
        head = log.head()
        log.wait_for_append(head, timeout=0.01)  # the next wait: listening on a new connection
        log.append("s", [LogNote(text="x")])  # its notification waits on that connection
        started = time.monotonic()
        log.wait_for_append(head, timeout=30.0)
        assert time.monotonic() - started < 15.0  # notified, not timed out


@pytest.mark.postgres
def test_a_commit_just_before_the_first_wait_is_not_slept_through(
    fresh_postgres_url: str,
) -> None:
    """The listener starts at the first wait: a commit after a caller read the head and
    before that LISTEN notified no one, and the wait ran out its timeout with the head past
    `after_seq`, the first waiter's and any other's (several subscriptions share a log's
    listener). The head as of the LISTEN answers every one of them."""
    with EventLog.open(fresh_postgres_url) as writer, EventLog.open(fresh_postgres_url) as reader:
        writer.append("s", [LogNote(text="x")], NO_STREAM)
        first, second = reader.head(), reader.head()
        writer.append("s", [LogNote(text="y")], 0)  # before anyone listens
        for after_seq in (first, second):  # the first starts the listener, the second finds it
            started = time.monotonic()
            reader.wait_for_append(after_seq, timeout=30.0)
            assert time.monotonic() - started < 15.0
        started = time.monotonic()
        reader.wait_for_append(reader.head(), timeout=0.5)  # listening: nothing new, it waits
        assert time.monotonic() - started >= 0.4


@pytest.mark.postgres
def test_a_statement_refused_inside_the_writers_pipeline_logs_no_warning(
    fresh_postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A refusal inside the pipeline (another writer's row where this one guessed its own
    tail: normal traffic when several write) left it aborted, and psycopg logged "error
    ignored terminating <Pipeline>" at WARNING on leaving it, once per refusal; the error
    itself still reaches the caller."""
    import psycopg

    from eventlog.store.postgres import PostgresDialect
    from tests.reliability import libpq_url

    dialect = PostgresDialect(sa.make_url(fresh_postgres_url), "full")

    def refused_inside(pipeline: Any) -> None:
        with pytest.raises((RuntimeError, psycopg.Error)), pipeline:
            conn.execute("BEGIN")
            conn.execute("SELECT 1 / 0")  # refused: every reply after it is "aborted"
            conn.execute("COMMIT")
            raise RuntimeError("the block fails before the pipeline's replies are read")
        conn.rollback()  # as the writer does

    with psycopg.connect(libpq_url(fresh_postgres_url), autocommit=True) as conn:
        refused_inside(dialect.pipeline(conn))
        assert not [r for r in caplog.records if r.name == "psycopg"], caplog.text
        refused_inside(conn.pipeline())  # not the writer's: psycopg's warning stays
        assert [r for r in caplog.records if r.name == "psycopg"]


def test_a_stream_taken_to_be_new_that_exists_costs_no_connection_and_says_nothing(
    log_target: str, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Another writer made the stream: the insert's refusal is rolled back and planned
    again, an ordinary ConcurrencyError. It dropped the writer's connection (a new one per
    such race) and psycopg printed "error ignored terminating <Pipeline>" on stderr."""
    opened = calls_recorded(monkeypatch, "writer_connection")
    with EventLog.open(log_target) as mine, EventLog.open(log_target) as theirs:
        mine.append("mine", [LogNote(text="a")], NO_STREAM)
        theirs.append("s", [LogNote(text="b")], NO_STREAM)
        capfd.readouterr()
        before = len(opened)
        for _ in range(3):
            with pytest.raises(ConcurrencyError):
                mine.append("s", [LogNote(text="c")], NO_STREAM)
            mine.append("mine", [LogNote(text="d")])
        assert len(opened) == before
        assert capfd.readouterr().err == ""


@pytest.mark.postgres
def test_only_psycopg_s_pipeline_warning_is_dropped_from_a_refused_pipeline(
    fresh_postgres_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What else psycopg logs while the writer's refused pipeline ends still gets through:
    the filter drops one message, not the logger."""
    import logging

    import psycopg

    from eventlog.store.postgres import PostgresDialect
    from tests.reliability import libpq_url

    exit_pipeline = psycopg.Pipeline.__exit__

    def saying_more(self: Any, *exc_info: Any) -> Any:
        logging.getLogger("psycopg").warning("something else psycopg says")
        return exit_pipeline(self, *exc_info)

    monkeypatch.setattr(psycopg.Pipeline, "__exit__", saying_more)
    dialect = PostgresDialect(sa.make_url(fresh_postgres_url), "full")
    with psycopg.connect(libpq_url(fresh_postgres_url), autocommit=True) as conn:
        with pytest.raises((RuntimeError, psycopg.Error)), dialect.pipeline(conn):
            conn.execute("BEGIN")
            conn.execute("SELECT 1 / 0")
            conn.execute("COMMIT")
            raise RuntimeError("the block fails before the pipeline's replies are read")
        conn.rollback()
    said = [r.getMessage() for r in caplog.records if r.name == "psycopg"]
    assert said == ["something else psycopg says"]


@pytest.mark.postgres
def test_a_postgresql_backup_stopped_midway_leaves_no_partial_archive(
    fresh_postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only pg_dump's own failure removed the `.partial` it wrote; a Ctrl-C or SIGTERM while
    it ran left the half-written archive beside DEST."""
    import subprocess

    def stopped(argv: list[str], **kwargs: Any) -> Any:
        written = next(a.removeprefix("--file=") for a in argv if a.startswith("--file="))
        Path(written).write_bytes(b"PGDMP half")
        raise KeyboardInterrupt

    dest = tmp_path / "run.dump"
    with EventLog.open(fresh_postgres_url) as log:
        log.append("s", [LogNote(text="x")], NO_STREAM)
        monkeypatch.setattr(subprocess, "run", stopped)
        with pytest.raises(KeyboardInterrupt):
            log.backup(dest)
    assert list(tmp_path.iterdir()) == []
