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


def _onto_the_log(db: Path, how: str) -> list[str]:
    """A `report` or `export` whose output is one of the log's own files."""
    if how == "report onto -wal":
        return ["report", str(db), "-o", str(db.with_name(db.name + "-wal"))]
    if how == "export into -journal":  # a folder of that name: SQLite failed every command
        return ["export", str(db), "-o", str(db.with_name(db.name + "-journal"))]
    if how == "backup onto -journal":
        return ["backup", str(db), str(db.with_name(db.name + "-journal"))]
    if how == "report onto a hard link":
        link = db.with_name("copy.html")
        link.hardlink_to(db)
        return ["report", str(db), "-o", str(link)]
    # export: a log whose name is a table's, exported into its own folder
    named = db.with_name("GroupReserved.jsonl")
    db.rename(named)
    return ["export", str(named), "-o", str(db.parent), "--format", "jsonl"]


@pytest.mark.parametrize(
    "how",
    [
        "report onto -wal",
        "report onto a hard link",
        "export onto a table's name",
        "export into -journal",
        "backup onto -journal",
    ],
)
def test_report_export_and_backup_refuse_to_write_over_the_log_they_read(
    run: AuditedRun, how: str
) -> None:
    """A report written over `run.db-wal` lost every record committed in the WAL, one over a
    hard link of the log replaced it with HTML, an export table named like the log overwrote
    it while reading it."""
    run.h.log.close()
    db = Path(run.path)
    argv = _onto_the_log(db, how)
    log = Path(argv[1])
    before = fingerprint(log)
    result = cli(*argv)
    assert result.exit_code == 2, result.stderr
    assert "a read command never writes to the log it reads" in result.stderr
    after = fingerprint(log)
    assert {name: after[name] for name in before} == before  # (an empty -wal may appear)
    assert not log.with_name(log.name + "-journal").exists()
    assert cli("verify", str(log)).exit_code == 0
