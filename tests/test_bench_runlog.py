"""The replay benchmark's run log is restored the way a real one is: from its snapshots."""

from __future__ import annotations

from pathlib import Path

from bench.runlog import (
    ADMISSION,
    CALLS,
    IN_FLIGHT,
    RECORDS_PER_STEP,
    SIBLINGS,
    TAIL,
    TRAIN_STEPS,
    checkpoint_positions,
    in_flight_for,
    records_per_step,
    run_log,
)
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


def test_long_run_logs_hold_the_same_work_in_flight_so_restores_differ_only_by_history(
    tmp_path: Path,
) -> None:
    """bench.replay's flatness compares restores of logs of different lengths: each must hold
    the same groups in flight at its head, or the shorter log is a lighter restore."""
    assert in_flight_for(100_000) == in_flight_for(2_000_000) == IN_FLIGHT
    run, _ = run_log(6000, cache_dir=tmp_path)
    assert run.manifest["in_flight"] == in_flight_for(6000) < IN_FLIGHT
    with EventLog.open(run.path) as log:
        held = fold_from_snapshot(log, log.head(), RolledBack()).state.groups
    assert in_flight_for(6000) <= len(held) <= in_flight_for(6000) + ADMISSION


def test_logs_of_every_length_end_with_the_same_tail_after_their_newest_checkpoint(
    tmp_path: Path,
) -> None:
    """A restore rolls back what follows the newest checkpoint: were that a tenth of each log,
    the longer log's restore would read more because its tail is longer, not its history."""
    assert 10**5 - checkpoint_positions(10**5)[-1] == TAIL
    assert 2 * 10**6 - checkpoint_positions(2 * 10**6)[-1] == TAIL
    assert checkpoint_positions(2 * 10**6)[:9] == [k * 2 * 10**5 for k in range(1, 10)]
    # ... and trains as often: the replay buffer a checkpoint holds does not grow with the log
    assert records_per_step(10**5) == records_per_step(2 * 10**6) == RECORDS_PER_STEP
    assert 6000 - checkpoint_positions(6000)[-1] == 600  # a short log: a tenth
    run, _ = run_log(6000, cache_dir=tmp_path)
    checkpoints = run.manifest["checkpoints"]
    assert len(checkpoints) == len(checkpoint_positions(6000))
    assert 5400 <= checkpoints[-1]["seq"] < 5400 + SIBLINGS * CALLS * ADMISSION
    assert run.manifest["train_steps"] == 6000 // records_per_step(6000) == TRAIN_STEPS
