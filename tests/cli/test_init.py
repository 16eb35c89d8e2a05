"""`eventlog init`: create a log, and print its id."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from eventlog.errors import LogRevisionError
from eventlog.log import EventLog
from tests.cli.helpers import append_notes, cli, count, query, sql


def test_init_prints_the_log_id_and_a_second_init_keeps_it(tmp_path: Path) -> None:
    path = str(tmp_path / "run.db")
    first = cli("init", path)
    assert first.exit_code == 0
    log_id = first.stdout.strip()
    assert uuid.UUID(log_id)
    assert query(path, "SELECT value FROM log_meta WHERE key = 'log_id'") == [(log_id,)]
    append_notes(path, 2)
    again = cli("init", path)
    assert again.stdout.strip() == log_id
    assert "2 records" in again.stderr
    assert count(path) == 2


def test_init_refuses_a_folder_that_does_not_exist(tmp_path: Path) -> None:
    result = cli("init", str(tmp_path / "nope" / "run.db"))
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and "does not exist" in result.stderr


def test_init_adds_no_table_to_another_programs_database(tmp_path: Path) -> None:
    """`eventlog init app.db` on an application's SQLite file added eventlog's four tables
    and two triggers to it, exit 0: a typo for run.db changed someone else's database."""
    path = str(tmp_path / "app.db")
    sql(path, "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    sql(path, "CREATE VIEW named AS SELECT name FROM users")
    before = Path(path).read_bytes()
    refused = cli("init", path)
    assert refused.exit_code == 3
    assert refused.stderr.splitlines() == [
        f"error: {path}: another program's database (it holds named, users); "
        "eventlog adds its tables to no database but its own",
        "hint: give the log a file of its own",
    ]
    assert Path(path).read_bytes() == before
    with pytest.raises(LogRevisionError, match="another program's database"):
        EventLog.open(path)
    assert query(path, "SELECT name FROM sqlite_master ORDER BY name") == [("named",), ("users",)]


@pytest.mark.parametrize("name", ["y%20y.db", "q?.db", "h#x.db", "a%b.db"])
def test_a_log_path_is_that_file_whatever_url_syntax_its_name_holds(
    tmp_path: Path, name: str
) -> None:
    """A path is not a URL: `y%20y.db` opened `y y.db`, `q?.db` created `q`, and a `%` or
    `#` failed the schema migration (exit 70)."""
    path = str(tmp_path / name)
    assert cli("init", path).exit_code == 0
    append_notes(path, 2)
    assert {p.name for p in tmp_path.iterdir()} <= {name, f"{name}-wal", f"{name}-shm"}
    shown = cli("replay", path, "--json")
    assert shown.exit_code == 0 and len(shown.stdout.splitlines()) == 2, shown.stderr
    assert count(path) == 2


@pytest.mark.parametrize("suffix", ["-wal", "-journal", "-shm"])
def test_init_refuses_a_name_sqlite_takes_for_another_databases_own_file(
    tmp_path: Path, suffix: str
) -> None:
    """`init run.db-wal` beside the log run.db made a log there, and SQLite deleted it as
    run.db's WAL the next time run.db was opened."""
    beside = str(tmp_path / "run.db")
    assert cli("init", beside).exit_code == 0
    refused = cli("init", beside + suffix)
    assert refused.exit_code == 2
    assert refused.stderr.splitlines()[0] == (
        f"error: {beside}{suffix}: named as SQLite's {suffix} file of the database {beside}, "
        "which SQLite would take it for"
    )
    assert not Path(beside + suffix).exists() or suffix == "-shm"
