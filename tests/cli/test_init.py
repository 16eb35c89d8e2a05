"""`eventlog init`: create a log, and print its id."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.cli.helpers import append_notes, cli, count, query


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
