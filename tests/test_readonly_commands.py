"""Read commands never create, migrate or change the file they read: they open it read-only
(SQLite `mode=ro`, PostgreSQL read-only transactions), refused targets included."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result

from eventlog import EventLog
from eventlog.cli.main import main
from eventlog.errors import StorageUnavailableError
from eventlog.log import resolve_url
from eventlog.store import migrate
from tests.cli.helpers import EVENTLOG, REPO, as_nobody
from tests.vocabulary import LogNote

READ_COMMANDS = [
    ["replay"],
    ["replay", "--json", "--allow-unknown"],
    ["verify"],
    ["verify", "--anchor", "1:" + "0" * 64],
    ["info"],
    ["stats"],
    ["tail", "-n", "3"],
    ["inspect", "group", "{target}", "g1"],
]


def run(command: list[str], target: str) -> Result:
    args = [a.replace("{target}", target) for a in command]
    if "{target}" not in command:
        args.insert(1 if command[0] != "inspect" else 2, target)
    return CliRunner().invoke(
        main, ["--events-module", "tests.vocabulary", *args], catch_exceptions=False
    )


def _log(path: Path) -> None:
    with EventLog.open(path) as log:
        log.append("s", [LogNote(text=f"n{i}") for i in range(5)])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _foreign(path: Path) -> None:
    """Someone else's SQLite database with an `events` table, in rollback-journal mode."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, what TEXT)")
        conn.execute("INSERT INTO events (what) VALUES ('lunch')")
    conn.close()


def _old_revision(path: Path) -> None:
    engine = sa.create_engine(resolve_url(path))
    migrate.upgrade(engine, "0001")
    engine.dispose()


def _text(path: Path) -> None:
    path.write_text("not a database\n" * 300)


TARGETS: dict[str, tuple[Callable[[Path], None], set[int]]] = {
    "log": (_log, {0, 1, 2}),  # a made-up anchor is exit 1, a group not in the log 2
    "empty file": (_empty, {3}),
    "foreign database": (_foreign, {3}),
    "older revision": (_old_revision, {3}),
    "text file": (_text, {6}),
}


@pytest.mark.parametrize("kind", list(TARGETS))
@pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda c: "-".join(c[:2]))
def test_read_commands_leave_the_file_byte_for_byte_unchanged(
    tmp_path: Path, kind: str, command: list[str]
) -> None:
    path = tmp_path / "target.db"
    make, codes = TARGETS[kind]
    make(path)
    before = path.read_bytes()
    result = run(command, str(path))
    assert result.exit_code in codes, result.output
    assert result.exit_code != 70
    assert path.read_bytes() == before
    if kind != "log" and kind != "older revision":  # not WAL: not even a side file appears
        assert sorted(p.name for p in tmp_path.iterdir()) == ["target.db"]


def test_a_foreign_database_keeps_its_journal_mode(tmp_path: Path) -> None:
    path = tmp_path / "foreign.db"
    _foreign(path)
    assert run(["verify"], str(path)).exit_code == 3
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()


def test_a_log_opened_read_only_refuses_appends_and_never_migrates(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    _log(path)
    with EventLog.open(path, read_only=True) as log:
        assert log.head() == 5
        with pytest.raises(StorageUnavailableError, match="read-only"):
            log.append("s", [LogNote(text="no")])
    old = tmp_path / "old.db"
    _old_revision(old)
    before = old.read_bytes()
    with pytest.raises(Exception, match="schema revision 0001"):
        EventLog.open(old, read_only=True)
    assert old.read_bytes() == before


@pytest.mark.postgres
def test_read_commands_never_migrate_or_change_a_postgresql_log(fresh_postgres_url: str) -> None:
    engine = sa.create_engine(resolve_url(fresh_postgres_url))
    migrate.upgrade(engine, "0001")
    for command in READ_COMMANDS:
        result = run(command, fresh_postgres_url)
        assert result.exit_code == 3, (command, result.output)
    assert migrate.current_revision(engine) == "0001"
    engine.dispose()
    _log_url(fresh_postgres_url)  # now at head: read-only still refuses to write
    with (
        EventLog.open(fresh_postgres_url, read_only=True) as log,
        pytest.raises(StorageUnavailableError, match="read-only"),
    ):
        log.append("s", [LogNote(text="no")])


def _log_url(url: str) -> None:
    engine = sa.create_engine(resolve_url(url))
    migrate.upgrade(engine)
    engine.dispose()


def test_a_closed_wal_log_in_a_folder_the_reader_cannot_write_is_named_with_the_cause() -> None:
    """SQLite must create the -shm index to read a WAL log: with none beside a closed log and
    no right to write its folder, every read command failed with "the log is read-only here
    (attempt to write a readonly database)", naming no cause. It says which file it needs."""
    prefix = as_nobody()
    if prefix is None:
        pytest.skip("no way to run a process without write access to a folder here")
    folder = Path(tempfile.mkdtemp(prefix="eventlog-ro-"))  # not under a private tmp_path
    try:
        _log(folder / "run.db")
        assert not (folder / "run.db-shm").exists()  # a closed log leaves no index
        folder.chmod(0o555)
        (folder / "run.db").chmod(0o444)
        before = (folder / "run.db").read_bytes()
        result = subprocess.run(
            [*prefix, str(EVENTLOG), "info", str(folder / "run.db")],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=120,
        )
        assert result.returncode == 6, result.stderr
        assert "run.db-shm, which is not there" in result.stderr
        assert "Traceback" not in result.stderr
        assert (folder / "run.db").read_bytes() == before
    finally:
        folder.chmod(0o755)
        shutil.rmtree(folder)
