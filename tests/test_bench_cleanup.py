"""The cleanup benchmark's command: what a clean block does that a keep block does not (its
smoke run is parametrized with fencing's in tests/test_bench_fencing.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import cleanup


def test_a_clean_command_lists_the_staging_rows_in_its_record_and_deletes_them(
    tmp_path: Path,
) -> None:
    """What the clean kind does is what finalize adds: the keys in its one record, the delete."""
    from eventlog import EventLog
    from eventlog.dataplane.memory import InMemoryDataPlane
    from eventlog.recovery.vocabulary import GroupFinalized

    plane = InMemoryDataPlane()
    with EventLog.open(tmp_path / "log.db") as log:
        step = cleanup.cleanup_step(log, plane)
        step(0, False)
        step(1, True)
        kept, cleaned = [r.event for r in log.read()]
    assert isinstance(kept, GroupFinalized) and isinstance(cleaned, GroupFinalized)
    assert (kept.staging_cleared, kept.staging_partition) == ([], None)
    assert [c.key for c in cleaned.staging_cleared] == [
        f"c1_g{s}/call-{c}" for s in range(cleanup.SIBLINGS) for c in range(cleanup.CALLS)
    ]
    assert cleaned.staging_partition == cleanup.STAGING
    assert plane.list_keys(cleanup.STAGING) == {}


def test_the_lifecycle_figures_time_real_group_lives_that_leave_no_staging_row(
    tmp_path: Path,
) -> None:
    """Beside the verdict, the difference is put against a real finalize command and a
    group's whole ledger life: those commands really run (each group finalized, its staging
    rows cleared and recorded), and the shares follow from the figures."""
    from eventlog import EventLog

    with EventLog.open(tmp_path / "log.db") as log:
        figures = cleanup.lifecycle_commands(log, 3, 0)
        types = [r.type for r in log.read()]
        staged = [r for r in log.read() if r.type == "TokensStaged"]
    assert types.count("GroupFinalized") == 3 and "StagingCleared" not in types
    assert len(staged) == 3 * cleanup.SIBLINGS * cleanup.CALLS
    assert 0 < figures["finalize"] < figures["group"]
    assert figures["command"] == pytest.approx(figures["group"] / len(cleanup.LIFECYCLE))
    row = cleanup.lifecycle_figures(10.0, [figures])
    assert row["delta_share_of_finalize_command"] == round(10.0 / (figures["finalize"] * 1e6), 4)
    assert row["delta_share_of_lifecycle"] == round(10.0 / (figures["group"] * 1e6), 4)
