"""`eventlog init`: create a log, and print its id."""

from __future__ import annotations

import uuid
from pathlib import Path

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
