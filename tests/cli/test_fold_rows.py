"""`fold_rows`, the one loop `stats` and `report` fold the stored rows in: the same figures
as folding record by record (`fold_event` of each whole event), decoding only what the fold
reads, and what `report` takes beside it (the Gantt's events, every record's time)."""

from __future__ import annotations

from typing import Any

from eventlog.recovery.cli.runlog import RunLog, stored_event
from eventlog.recovery.vocabulary import (
    GenerationStarted,
    GroupReserved,
    RestoreStarted,
    TokensStaged,
)
from projections.audit_stats import (
    STATS_TYPES,
    VIEWS,
    AuditState,
    StartedView,
    TimeBins,
    fold_event,
    fold_rows,
    report,
)
from tests.cli.audited_run import AuditedRun


def _state(run: AuditedRun) -> AuditState:
    log = run.h.log
    runlog = RunLog(log)
    return AuditState(skipped=runlog.skipped, step_ends=runlog.step_ends())


def test_fold_rows_gives_the_figures_of_folding_record_by_record(run: AuditedRun) -> None:
    log = run.h.log
    one_by_one = _state(run)
    for seq, type_name, schema, at, payload in log.read_payloads(1, log.head()):
        fold_event(one_by_one, seq, at, stored_event(type_name, schema, payload, seq))
    in_one_loop = _state(run)
    fold_rows(in_one_loop, log.read_payloads(1, log.head()), stored_event)

    assert report(in_one_loop) == report(one_by_one)
    # and the counts are the log's: every record, the restore's range rolled back
    records = run.h.records()
    (restore,) = [r for r in records if isinstance(r.event, RestoreStarted)]
    assert isinstance(restore.event, RestoreStarted)
    low, high = restore.event.rolled_back_from_seq, restore.seq - 1
    assert in_one_loop.records == len(records)
    assert in_one_loop.rolled_back_records == sum(low <= r.seq <= high for r in records) > 0
    assert in_one_loop.seq == records[-1].seq
    # a restore counts what it reused: only right when rolled-back records are told apart
    assert report(in_one_loop).total.reused_after_restore > 0


def test_fold_rows_decodes_only_what_the_fold_reads_and_the_frequent_types_as_views(
    run: AuditedRun,
) -> None:
    log = run.h.log
    asked: list[str] = []

    def decode(type_name: str, schema: int, payload: bytes, seq: int) -> object | None:
        asked.append(type_name)
        return stored_event(type_name, schema, payload, seq)

    seen: set[str] = set()
    fold_rows(_state(run), log.read_payloads(1, log.head()), decode, seen=seen)
    stored = {r.type for r in run.h.records()}
    assert stored - STATS_TYPES, "the run holds types the fold does not read"
    assert set(asked) <= STATS_TYPES  # nothing else decoded
    assert not set(asked) & set(VIEWS)  # the frequent types only as their views
    assert GroupReserved.__name__ in asked
    assert seen == set(asked)


def test_fold_rows_hands_the_watched_classes_over_and_bins_every_record_time(
    run: AuditedRun,
) -> None:
    log = run.h.log
    records = run.h.records()
    got: list[tuple[str, int, bool]] = []

    def started(ev: Any, at: int, effective: bool) -> None:
        got.append((ev.rollout_id, at, effective))

    first, last = records[0].recorded_at, records[-1].recorded_at
    times = TimeBins(first, last - first, [0] * 7)
    fold_rows(
        _state(run),
        log.read_payloads(1, log.head()),
        stored_event,
        watch={StartedView: started},
        times=times,
    )
    (restore,) = [r for r in records if isinstance(r.event, RestoreStarted)]
    assert isinstance(restore.event, RestoreStarted)
    low, high = restore.event.rolled_back_from_seq, restore.seq - 1
    assert got == [
        (r.event.rollout_id, r.recorded_at, not low <= r.seq <= high)
        for r in records
        if isinstance(r.event, GenerationStarted)
    ]
    assert any(not effective for _, _, effective in got)
    expected = [0] * 7
    for r in records:
        expected[max(min((r.recorded_at - first) * 7 // (last - first), 6), 0)] += 1
    assert times.bins == expected
    assert sum(times.bins) == len(records)
    assert any(isinstance(r.event, TokensStaged) for r in records)


def test_times_outside_the_span_land_in_the_first_or_last_bin(run: AuditedRun) -> None:
    """A record recorded before the span's start (a clock set back) counts in the first bin,
    one recorded after its end in the last: every record is counted once."""
    log = run.h.log
    records = run.h.records()
    middle = sorted(r.recorded_at for r in records)[len(records) // 2]
    first, span = middle, max(records[-1].recorded_at - middle, 1) // 2
    times = TimeBins(first, span, [0] * 5)
    fold_rows(_state(run), log.read_payloads(1, log.head()), stored_event, times=times)
    place = [(r.recorded_at - first) * 5 // span for r in records]
    assert any(p < 0 for p in place) and any(p > 4 for p in place)
    assert times.bins == [sum(1 for p in place if min(max(p, 0), 4) == b) for b in range(5)]
