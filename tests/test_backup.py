"""`eventlog backup`: a consistent copy taken while writers go on (SQLite's online backup API;
PostgreSQL's pg_dump recipe), and a restore from it checked by verify and a chain anchor."""

from __future__ import annotations

import re
import shutil
import sqlite3
import subprocess
import threading
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result

from eventlog import EventLog
from eventlog.cli.main import main
from eventlog.log import resolve_url
from eventlog.testing.postgres_server import PostgresServer, find_pg_bindir
from tests.reliability import drop_append_only, libpq_url
from tests.vocabulary import LogNote

ANCHOR = re.compile(r"anchor (\d+:[0-9a-f]{64})")


def cli(*args: str) -> Result:
    return CliRunner().invoke(
        main, ["--events-module", "tests.vocabulary", *args], catch_exceptions=False
    )


def _records(target: str) -> list[tuple[int, str, bytes]]:
    with EventLog.open(target, read_only=True) as log:
        return [(r.seq, r.stream, r.chain) for r in log.read_records()]


def test_a_sqlite_backup_taken_while_writers_append_restores_and_verifies(
    tmp_path: Path,
) -> None:
    source = str(tmp_path / "log.db")
    with EventLog.open(source) as log:
        log.append("s", [LogNote(text=f"n{i}") for i in range(500)])
    stop = threading.Event()

    def keep_appending() -> None:
        with EventLog.open(source) as writer:
            n = 0
            while not stop.is_set():
                writer.append(f"w{n % 7}", [LogNote(text="during", n=n)])
                n += 1

    appender = threading.Thread(target=keep_appending)
    appender.start()
    try:
        result = cli("backup", source, str(tmp_path / "copy.db"))
    finally:
        stop.set()
        appender.join()
    assert result.exit_code == 0, result.output
    anchor = ANCHOR.search(result.stdout)
    assert anchor is not None
    restored = tmp_path / "restored.db"  # a restore of a SQLite backup is a copy of the file
    shutil.copyfile(tmp_path / "copy.db", restored)
    checked = cli("verify", str(restored), "--anchor", anchor.group(1))
    assert checked.exit_code == 0, checked.output
    copied = _records(str(restored))
    assert copied == _records(source)[: len(copied)]  # one consistent prefix of the source
    assert len(copied) >= 500
    with EventLog.open(restored) as log:
        assert log.append("s", [LogNote(text="after restore")]).seqs == [len(copied) + 1]


def test_a_restore_that_lost_records_fails_the_anchor(tmp_path: Path) -> None:
    source = str(tmp_path / "log.db")
    with EventLog.open(source) as log:
        log.append("s", [LogNote(text=f"n{i}") for i in range(5)])
    result = cli("backup", source, str(tmp_path / "copy.db"))
    anchor = ANCHOR.search(result.stdout)
    assert anchor is not None
    with sqlite3.connect(tmp_path / "copy.db") as conn:
        drop_append_only(conn)
        conn.execute("DELETE FROM events WHERE seq = 5")
    conn.close()
    checked = cli("verify", str(tmp_path / "copy.db"), "--anchor", anchor.group(1))
    assert checked.exit_code == 1
    assert "seq 5 is gone" in checked.stdout


def test_backup_never_overwrites_and_never_changes_the_source(tmp_path: Path) -> None:
    source = tmp_path / "log.db"
    with EventLog.open(source) as log:
        log.append("s", [LogNote(text="x")])
    dest = tmp_path / "copy.db"
    dest.write_text("keep me")
    before = source.read_bytes()
    result = cli("backup", str(source), str(dest))
    assert result.exit_code == 2
    assert "already exists" in result.stderr
    assert dest.read_text() == "keep me"
    assert source.read_bytes() == before
    assert cli("backup", str(source), str(tmp_path / "no" / "copy.db")).exit_code == 2


def test_a_backup_of_a_tampered_log_says_so(tmp_path: Path) -> None:
    source = tmp_path / "log.db"
    with EventLog.open(source) as log:
        log.append("s", [LogNote(text=f"n{i}") for i in range(3)])
    with sqlite3.connect(source) as conn:
        drop_append_only(conn)
        conn.execute("UPDATE events SET payload = x'80' WHERE seq = 2")
    conn.close()
    result = cli("backup", str(source), str(tmp_path / "copy.db"))
    assert result.exit_code == 1
    assert "fails verify (first bad seq 2)" in result.stderr


@pytest.mark.postgres
def test_a_pg_dump_this_user_may_not_run_is_passed_over(
    fresh_postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EVENTLOG_PG_BINDIR holding a pg_dump that is not executable was exit 70
    (PermissionError from subprocess): it is passed over as a missing one is."""
    with EventLog.open(fresh_postgres_url) as log:
        log.append("s", [LogNote(text="n")])
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "pg_dump").write_text("not a program\n")
    monkeypatch.setenv("EVENTLOG_PG_BINDIR", str(fake))
    result = cli("backup", fresh_postgres_url, str(tmp_path / "log.dump"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "log.dump").stat().st_size > 0


@pytest.mark.postgres
def test_the_postgresql_pg_dump_recipe_restores_a_log_that_verifies(
    postgres_server: PostgresServer, fresh_postgres_url: str, tmp_path: Path
) -> None:
    with EventLog.open(fresh_postgres_url) as log:
        log.append("s", [LogNote(text=f"n{i}") for i in range(50)])
    archive = tmp_path / "log.dump"
    result = cli("backup", fresh_postgres_url, str(archive))
    assert result.exit_code == 0, result.output
    anchor = ANCHOR.search(result.stdout)
    assert anchor is not None
    with psycopg.connect(postgres_server.conninfo(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE restored_from_backup")
    restored = postgres_server.url("restored_from_backup")
    bindir = find_pg_bindir()
    assert bindir is not None
    subprocess.run(
        [str(bindir / "pg_restore"), "--no-owner", f"--dbname={libpq_url(restored)}", archive],
        check=True,
        capture_output=True,
    )
    try:
        checked = cli("verify", restored, "--anchor", anchor.group(1))
        assert checked.exit_code == 0, checked.output
        assert _records(restored) == _records(fresh_postgres_url)
        engine = sa.create_engine(resolve_url(restored))  # the restore is append-only too
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM events WHERE seq = 1")
        engine.dispose()
    finally:
        with psycopg.connect(postgres_server.conninfo(), autocommit=True) as conn:
            conn.execute("DROP DATABASE restored_from_backup WITH (FORCE)")
