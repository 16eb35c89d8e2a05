"""Many runs per database: each run's log lives in a schema of its own, and a run's log can
neither read nor write another run's records (on the real PostgreSQL server)."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from eventlog import EventLog
from eventlog.cli.main import main
from eventlog.errors import InvalidEventError, StorageUnavailableError
from eventlog.log import resolve_url
from eventlog.records import NO_STREAM, Proposed
from eventlog.store import migrate
from eventlog.store.postgres import LOCK_KEY
from eventlog.store.runs import find_runs, lock_key, schema_for
from eventlog.testing.postgres_server import PostgresServer, find_pg_bindir
from tests.reliability import libpq_url
from tests.vocabulary import LogNote

pytestmark = pytest.mark.postgres


def _texts(log: EventLog) -> list[str]:
    return [r.event.text for r in log.read()]  # type: ignore[attr-defined]


def test_runs_in_one_database_see_only_their_own_records(fresh_postgres_url: str) -> None:
    with (
        EventLog.open(fresh_postgres_url, run="a") as a,
        EventLog.open(fresh_postgres_url + "?run=b") as b,
        EventLog.open(fresh_postgres_url) as default,
    ):
        a.append("s", [LogNote(text="a1"), LogNote(text="a2")], NO_STREAM)
        b.append("s", [LogNote(text="b1")], NO_STREAM)  # same stream name, own versions
        default.append("s", [LogNote(text="d1")], NO_STREAM)
        assert _texts(a) == ["a1", "a2"] and _texts(b) == ["b1"] and _texts(default) == ["d1"]
        assert [r.event.text for r in b.read_stream("s")] == ["b1"]  # type: ignore[attr-defined]
        assert (a.head(), b.head(), default.head()) == (2, 1, 1)  # seq and chain per run
        assert (a.stream_version("s"), b.stream_version("s")) == (1, 0)
        for log in (a, b, default):
            assert log.verify().ok
        assert a.info()["run"] == "a" and b.info()["run"] == "b"
        assert default.info()["run"] == "default"
        assert a.info()["log_id"] != b.info()["log_id"]


def test_a_run_of_the_longest_name_appends_and_wakes_its_readers(fresh_postgres_url: str) -> None:
    """A run name of 42 to 48 letters made a notification channel longer than PostgreSQL's
    63 bytes: the log opened, and every append failed ("channel name too long")."""
    longest, neighbour = "r" * 48, "r" * 47 + "s"
    with (
        EventLog.open(fresh_postgres_url, run=longest) as log,
        EventLog.open(fresh_postgres_url, run=longest) as reader,
        EventLog.open(fresh_postgres_url, run=neighbour) as other,
    ):
        reader.wait_for_append(0, timeout=0.01)  # listening now
        other.append("s", [LogNote(text="not ours")], NO_STREAM)
        assert log.append("s", [LogNote(text="x")], NO_STREAM).seqs == [1]
        started = time.monotonic()
        reader.wait_for_append(0, timeout=30.0)  # its own run's commit wakes it
        assert time.monotonic() - started < 15.0
        assert _texts(reader) == ["x"] and reader.verify().ok


def test_an_event_id_stored_in_one_run_is_new_in_another(fresh_postgres_url: str) -> None:
    """Idempotency is per run: a retry is recognised in its own run only."""
    chosen = uuid.uuid4()
    with (
        EventLog.open(fresh_postgres_url, run="a") as a,
        EventLog.open(fresh_postgres_url, run="b") as b,
    ):
        first = a.append("s", [Proposed(LogNote(text="x"), chosen)])
        assert a.append("s", [Proposed(LogNote(text="x"), chosen)]) == first  # a retry
        b.append("s", [Proposed(LogNote(text="x"), chosen)])
        assert (a.head(), b.head()) == (1, 1)


def test_runs_are_listed_and_a_run_name_is_checked(fresh_postgres_url: str) -> None:
    for run in ("a", "zeta_2"):
        EventLog.open(fresh_postgres_url, run=run).close()
    EventLog.open(fresh_postgres_url).close()
    engine = sa.create_engine(resolve_url(fresh_postgres_url))
    try:
        assert find_runs(engine) == ["default", "a", "zeta_2"]
    finally:
        engine.dispose()
    for bad in ("A", "1a", "a-b", "", "x" * 49):
        with pytest.raises(InvalidEventError, match="run name"):
            EventLog.open(fresh_postgres_url, run=bad)
    with pytest.raises(InvalidEventError, match="names run 'b'"):
        EventLog.open(fresh_postgres_url + "?run=b", run="a")


def test_a_run_on_sqlite_is_refused_one_file_per_run(tmp_path: object) -> None:
    with pytest.raises(InvalidEventError, match="each run is a file"):
        EventLog.open(f"sqlite:///{tmp_path}/x.db?run=a")


def test_runs_write_without_waiting_for_one_another(fresh_postgres_url: str) -> None:
    """Each run has its own write lock: a writer stuck in run a does not hold up run b."""
    with (
        EventLog.open(fresh_postgres_url, run="a", busy_timeout=0.5) as a,
        EventLog.open(fresh_postgres_url, run="b", busy_timeout=0.5) as b,
    ):
        engine = sa.create_engine(resolve_url(fresh_postgres_url))
        try:
            with engine.connect() as holder:
                holder.exec_driver_sql(f"SELECT pg_advisory_lock({lock_key(LOCK_KEY, 'run_a')})")
                b.append("s", [LogNote(text="b1")])
                with pytest.raises(StorageUnavailableError):
                    a.append("s", [LogNote(text="a1")])
                holder.exec_driver_sql("SELECT pg_advisory_unlock_all()")
        finally:
            engine.dispose()
        assert (a.head(), b.head()) == (0, 1)


def test_a_log_made_before_runs_is_upgraded_to_the_default_run(fresh_postgres_url: str) -> None:
    engine = sa.create_engine(resolve_url(fresh_postgres_url))
    try:
        migrate.upgrade(engine, "0003")
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO events VALUES (1, 's', 0, '\\x00000000000000000000000000000001',"
                " 'LogNote', 1, 1, '\\x00', '\\x00')"
            )
        migrate.upgrade(engine)
        with engine.connect() as conn:
            run = conn.exec_driver_sql("SELECT value FROM log_meta WHERE key = 'run'").scalar()
            kept = conn.exec_driver_sql("SELECT count(*) FROM events").scalar()
        assert (run, kept) == ("default", 1)
        migrate.downgrade(engine, "0003")
        with engine.connect() as conn:
            assert (
                conn.exec_driver_sql("SELECT count(*) FROM log_meta WHERE key = 'run'").scalar()
                == 0
            )
    finally:
        engine.dispose()
    assert schema_for("default") is None and schema_for("a") == "run_a"


def test_a_runs_backup_holds_that_run_alone_and_restores(
    postgres_server: PostgresServer, fresh_postgres_url: str, tmp_path: Path
) -> None:
    with (
        EventLog.open(fresh_postgres_url, run="a") as a,
        EventLog.open(fresh_postgres_url, run="b") as b,
    ):
        a.append("s", [LogNote(text=f"a{i}") for i in range(5)])
        b.append("s", [LogNote(text="b")])
    archive = tmp_path / "a.dump"
    done = CliRunner().invoke(main, ["--run", "a", "backup", fresh_postgres_url, str(archive)])
    assert done.exit_code == 0, done.output
    with psycopg.connect(postgres_server.conninfo(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE restored_run_a")
    restored = postgres_server.url("restored_run_a")
    bindir = find_pg_bindir()
    assert bindir is not None
    try:
        subprocess.run(
            [str(bindir / "pg_restore"), "--no-owner", f"--dbname={libpq_url(restored)}", archive],
            check=True,
            capture_output=True,
        )
        engine = sa.create_engine(resolve_url(restored))
        try:
            assert find_runs(engine) == ["a"]
        finally:
            engine.dispose()
        with EventLog.open(restored, run="a", read_only=True) as copy:
            assert _texts(copy) == [f"a{i}" for i in range(5)] and copy.verify().ok
    finally:
        with psycopg.connect(postgres_server.conninfo(), autocommit=True) as conn:
            conn.execute("DROP DATABASE restored_run_a WITH (FORCE)")
