"""No audit command writes to the log it audits: the file's bytes are the same before and
after each command (the log is opened read-only). A WAL reader may leave SQLite's shared
memory index (-shm) and an empty -wal next to it; never a frame of log data."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.cli.audited_run import AuditedRun
from tests.cli.helpers import cli

COMMANDS = [
    ["replay", "{db}", "--json"],
    ["replay", "{db}", "--group", "g1", "--effective"],
    ["replay", "{db}", "--step", "2"],
    ["stats", "{db}", "--json"],
    ["inspect", "group", "{db}", "g1"],
    ["inspect", "rollout", "{db}", "g1_g1"],
    ["inspect", "step", "{db}", "2"],
    ["state", "{db}", "--checkpoint", "1"],
    ["diff", "{db}", "checkpoint:1", "head"],
    ["export", "{db}", "-o", "{out}/export", "--format", "parquet"],
    ["report", "{db}", "-o", "{out}/run.html"],
    ["verify", "{db}"],
    ["info", "{db}"],
]


def fingerprint(db: Path) -> dict[str, str]:
    """The log file and its companions (-wal, -shm, -journal), by content."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(db.parent.glob(db.name + "*"))
    }


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]).replace("{db}", ""))
def test_audit_commands_leave_the_log_byte_for_byte_unchanged(
    run: AuditedRun, tmp_path_factory: pytest.TempPathFactory, command: list[str]
) -> None:
    run.h.log.close()  # the writer is gone: what is on disk is the whole log
    db = Path(run.path)
    out = tmp_path_factory.mktemp("out")
    before = fingerprint(db)
    assert list(before) == [db.name]
    args = [arg.format(db=db, out=out) for arg in command]
    result = cli(*args)
    assert result.exit_code == 0, result.stderr
    after = fingerprint(db)
    assert after[db.name] == before[db.name]
    wal = db.with_name(db.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0
