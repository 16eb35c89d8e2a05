"""The cleanup benchmark's command: what a clean block does that a keep block does not (its
smoke run is parametrized with fencing's in tests/test_bench_fencing.py)."""

from __future__ import annotations

from pathlib import Path

from bench import cleanup


def test_a_clean_command_appends_the_staging_cleared_event_and_deletes_the_rows(
    tmp_path: Path,
) -> None:
    """What the clean kind does is what finalize adds: the event in the same append, the delete."""
    from eventlog import EventLog
    from eventlog.dataplane.memory import InMemoryDataPlane

    plane = InMemoryDataPlane()
    with EventLog.open(tmp_path / "log.db") as log:
        step = cleanup.cleanup_step(log, plane)
        step(0, False)
        step(1, True)
        types = [r.type for r in log.read()]
    assert types == ["StaleResultRejected", "StaleResultRejected", "StagingCleared"]
    assert plane.list_keys(cleanup.STAGING) == {}
