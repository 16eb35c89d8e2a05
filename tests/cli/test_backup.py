"""`eventlog backup`: a DEST that cannot be written is named, and a failed copy leaves nothing."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from eventlog.errors import StorageUnavailableError
from eventlog.log import EventLog
from tests.cli.helpers import append_notes, cli


def _beside_the_log(folder: Path) -> set[str]:
    """The names in `folder` other than the log's (run.db and SQLite's files beside it)."""
    return {path.name for path in folder.iterdir() if not path.name.startswith("run.db")}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux's /proc")
def test_a_dest_that_cannot_be_written_is_a_usage_error_naming_dest(log_file: str) -> None:
    refused = cli("backup", log_file, "/proc/b.db")
    assert refused.exit_code == 2
    assert refused.stderr.splitlines() == [
        "error: /proc/b.db: cannot write it: No such file or directory"
    ]
    assert refused.stdout == ""


def test_an_empty_dest_is_named_as_empty(log_file: str) -> None:
    refused = cli("backup", log_file, "")
    assert refused.exit_code == 2
    assert refused.stderr.splitlines() == [
        "error: DEST is empty: name the new file to write the backup to"
    ]


def test_a_failed_backup_leaves_no_partial_file(
    log_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    append_notes(log_file, 3)

    def fails_halfway(self: EventLog, dest: str | Path) -> None:
        partial = Path(dest).with_name(Path(dest).name + ".partial")
        partial.write_bytes(b"half a copy")
        raise StorageUnavailableError(f"{dest}: the disk is full")

    monkeypatch.setattr(EventLog, "backup", fails_halfway)
    refused = cli("backup", log_file, str(tmp_path / "copy.db"))
    assert refused.exit_code == 6
    assert _beside_the_log(tmp_path) == set()


def test_an_sqlite_url_is_backed_up_and_verified_as_its_file_is(
    log_file: str, tmp_path: Path
) -> None:
    """It was taken for a PostgreSQL target: 'pg_dump archive', and the copy never verified."""
    append_notes(log_file, 2)
    result = cli("backup", f"sqlite:///{log_file}", str(tmp_path / "copy.db"))
    assert result.exit_code == 0, result.stderr
    assert "2 records, head seq 2, anchor 2:" in result.stdout


def test_a_dest_made_while_the_copy_ran_is_not_overwritten(
    log_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    append_notes(log_file, 1)
    dest = tmp_path / "copy.db"
    copy = EventLog.backup

    def someone_writes_dest_meanwhile(log: EventLog, to: Any) -> None:
        copy(log, to)
        dest.write_text("theirs")

    monkeypatch.setattr(EventLog, "backup", someone_writes_dest_meanwhile)
    result = cli("backup", log_file, str(dest))
    assert result.exit_code == 2 and "already exists" in result.stderr
    assert dest.read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_backup_takes_dest_and_leaves_nothing_else(log_file: str, tmp_path: Path) -> None:
    append_notes(log_file, 3)
    dest = tmp_path / "copy.db"
    done = cli("backup", log_file, str(dest))
    assert done.exit_code == 0
    assert done.stdout.startswith(f"{dest}: 3 records, head seq 3, anchor 3:")
    assert _beside_the_log(tmp_path) - {"copy.db-wal", "copy.db-shm"} == {"copy.db"}
    assert cli("verify", str(dest)).exit_code == 0


def test_a_backup_of_an_empty_log_suggests_no_anchor_verify_refuses(
    log_file: str, tmp_path: Path
) -> None:
    """It suggested `verify COPY --anchor 0:...`, which verify refuses (a seq of 1 or more)."""
    assert cli("init", log_file).exit_code == 0
    dest = tmp_path / "copy.db"
    done = cli("backup", log_file, str(dest))
    assert done.exit_code == 0, done.output
    assert (
        done.stdout == f"{dest}: 0 records (an empty log: no anchor to check a restore against)\n"
    )
    assert cli("verify", str(dest)).exit_code == 0


def test_a_backup_named_as_another_databases_journal_is_refused(tmp_path: Path) -> None:
    """`backup a.db other/run.db-journal` beside the log other/run.db made that log
    read-only to every command (SQLite read the copy as a hot journal)."""
    source, other = str(tmp_path / "a.db"), str(tmp_path / "run.db")
    for path in (source, other):
        assert cli("init", path).exit_code == 0
    refused = cli("backup", source, other + "-journal")
    assert refused.exit_code == 2
    assert "named as SQLite's -journal file of the database" in refused.stderr
    assert not Path(other + "-journal").exists()
    assert cli("info", other).exit_code == 0


def test_a_backup_stopped_while_it_is_verified_leaves_no_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the copy was verified left a complete DEST never checked, and the next
    try said "already exists": the copy is checked before it takes DEST's name."""
    source, dest = str(tmp_path / "run.db"), tmp_path / "copy.db"
    assert cli("init", source).exit_code == 0
    append_notes(source, 3)

    def stopped(self: EventLog) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(EventLog, "verify", stopped)
    result = cli("backup", source, str(dest))
    assert (result.exit_code, result.stderr) == (130, "interrupted\n")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("copy", ".event"))) == []
    monkeypatch.undo()
    again = cli("backup", source, str(dest))
    assert again.exit_code == 0, again.output
    assert "3 records" in again.stdout
