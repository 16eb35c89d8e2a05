"""The replay benchmark's run log is restored the way a real one is: from its snapshots."""

from __future__ import annotations

from pathlib import Path

from bench.runlog import run_log
from eventlog import EventLog
from eventlog.recovery.checkpoint import fold_from_snapshot
from projections.history import RolledBack


def test_the_run_logs_latest_snapshot_is_trusted_so_a_restore_folds_nothing(
    tmp_path: Path,
) -> None:
    """A snapshot without this code's projection version is passed over (the restore then
    folds the whole run, and the benchmark would time the fallback, not the restore)."""
    run, _ = run_log(6000, cache_dir=tmp_path)
    last = run.manifest["checkpoints"][-1]["seq"]
    with EventLog.open(run.path) as log:
        folded = fold_from_snapshot(log, last, RolledBack())
    assert (folded.snapshot_seq, folded.records_folded, folded.untrusted) == (last, 0, [])
