"""Logs written by earlier versions of eventlog stay readable by this one."""

from __future__ import annotations

import shutil
from pathlib import Path

from click.testing import CliRunner

from eventlog import EventLog
from eventlog.cli.main import main
from eventlog.recovery import vocabulary

# Written by eventlog 0.1.0 (before the recovery domain moved to eventlog.recovery), by the
# README's ledger example: a reservation, a dispatch, a seal, a checkpoint and a restore.
BEFORE_RECOVERY_MOVE = Path(__file__).parent / "data" / "log-0.1.0-before-recovery-move.sqlite"


def _upgraded_copy(tmp_path: Path) -> Path:
    """A copy of the old log, migrated the documented way (it predates migration 0003)."""
    copy = tmp_path / "old.db"
    shutil.copy(BEFORE_RECOVERY_MOVE, copy)
    upgraded = CliRunner().invoke(main, ["db", "upgrade", str(copy)])
    assert upgraded.exit_code == 0, upgraded.output
    return copy


def test_a_log_written_before_the_recovery_move_decodes_to_the_same_vocabulary(
    tmp_path: Path,
) -> None:
    copy = _upgraded_copy(tmp_path)
    with EventLog.open(copy) as log:
        records = list(log.read())
        assert log.verify().ok
    kinds = {type(r.event) for r in records}
    assert kinds == {
        vocabulary.GroupReserved,
        vocabulary.SiblingsDispatched,
        vocabulary.SiblingSealed,
        vocabulary.CheckpointCommitted,
        vocabulary.RestoreStarted,
        vocabulary.UnsealedAbandoned,
        vocabulary.RetryPrepared,
        vocabulary.RestoreCompleted,
    }


def test_the_cli_reads_a_log_written_before_the_recovery_move(tmp_path: Path) -> None:
    copy = _upgraded_copy(tmp_path)
    for args in (["replay", "X", "--group", "g7"], ["stats", "X"], ["inspect", "group", "X", "g7"]):
        result = CliRunner().invoke(main, [str(copy) if a == "X" else a for a in args])
        assert result.exit_code == 0, (args, result.output)
    replayed = CliRunner().invoke(main, ["replay", str(copy), "--group", "g7", "--json"])
    assert replayed.output.count("\n") == 5  # group/g7 only: its attempts wrote nothing
