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


class _TimedPlane:
    """The in-memory plane, noting whether each delete ran inside the step's timing (between
    the two clock reads of the step)."""

    def __init__(self) -> None:
        from eventlog.dataplane.memory import InMemoryDataPlane

        self.plane = InMemoryDataPlane()
        self.clock_reads = 0
        self.deletes_at: list[int] = []

    def put_rows(self, partition: str, rows: dict[str, object]) -> None:
        self.plane.put_rows(partition, rows)  # type: ignore[arg-type]

    def delete_rows(self, partition: str, keys: list[str]) -> None:
        self.deletes_at.append(self.clock_reads)
        self.plane.delete_rows(partition, keys)


@pytest.mark.parametrize(("delete_timed", "inside"), [(True, True), (False, False)])
def test_a_bare_command_deletes_the_same_rows_timed_when_untracked_untimed_when_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, delete_timed: bool, inside: bool
) -> None:
    """The verdict's baseline (untracked: the controller before issue 8, which deleted the
    rows after finalizing and recorded nothing) times the delete; the keep baseline (a
    leaking ledger) does not. Both leave the plane empty and list no key."""
    import time

    from eventlog import EventLog

    timed = _TimedPlane()
    real = time.perf_counter_ns

    def counted() -> int:
        timed.clock_reads += 1
        return real()

    monkeypatch.setattr(time, "perf_counter_ns", counted)
    with EventLog.open(tmp_path / "log.db") as log:
        step = cleanup.cleanup_step(log, timed, delete_timed=delete_timed)  # type: ignore[arg-type]
        step(0, False)
        (bare,) = [r.event for r in log.read()]
    assert timed.deletes_at == [1 if inside else 2]  # after the first clock read, or the second
    assert bare.staging_cleared == []  # type: ignore[attr-defined]
    assert timed.plane.list_keys(cleanup.STAGING) == {}


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
