"""`eventlog backup`: a DEST that cannot be written is named, and a failed copy leaves nothing."""

from __future__ import annotations

import sys
from pathlib import Path

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


def test_a_backup_takes_dest_and_leaves_nothing_else(log_file: str, tmp_path: Path) -> None:
    append_notes(log_file, 3)
    dest = tmp_path / "copy.db"
    done = cli("backup", log_file, str(dest))
    assert done.exit_code == 0
    assert done.stdout.startswith(f"{dest}: 3 records, head seq 3, anchor 3:")
    assert _beside_the_log(tmp_path) - {"copy.db-wal", "copy.db-shm"} == {"copy.db"}
    assert cli("verify", str(dest)).exit_code == 0
