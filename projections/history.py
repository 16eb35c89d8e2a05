"""Which records count: rolled-back ranges, effective checkpoints and rebuilding the state.

A restore to checkpoint C appends `RestoreStarted(rolled_back_from_seq=C+1)`; every record from
there up to the RestoreStarted record itself is rolled back: kept for audits, skipped by every
rebuild. The end of the range is the RestoreStarted record's own seq, not a number inside it,
so a record that slipped in while the restore was starting is rolled back too. Ranges of later
restores may cover earlier ones; only their union matters.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from typing import Protocol, TypeVar

from eventlog.events import Event
from eventlog.recovery.vocabulary import (
    CONTROLLER_STREAM,
    CheckpointCommitted,
    CheckpointRetired,
    RestoreCompleted,
    RestoreStarted,
)
from projections.siblings import LedgerState, fold_all


class RecordLike(Protocol):
    """What the fold needs of a stored record: its position and its event."""

    @property
    def seq(self) -> int: ...

    @property
    def event(self) -> Event: ...


class RolledBack:
    """A set of seq ranges (inclusive), merged; membership is a binary search."""

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        merged: list[tuple[int, int]] = []
        for low, high in sorted(r for r in ranges if r[0] <= r[1]):
            if merged and low <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], high))
            else:
                merged.append((low, high))
        self.ranges: tuple[tuple[int, int], ...] = tuple(merged)
        self._lows = [low for low, _ in merged]

    def __contains__(self, seq: object) -> bool:
        if not isinstance(seq, int):
            return False
        at = bisect.bisect_right(self._lows, seq) - 1
        return at >= 0 and seq <= self.ranges[at][1]

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def __repr__(self) -> str:
        return f"RolledBack({list(self.ranges)})"


def rolled_back_range(started: RestoreStarted, started_seq: int) -> tuple[int, int]:
    """The seqs one restore rolls back (inclusive): from its checkpoint up to its own record."""
    return (started.rolled_back_from_seq, started_seq - 1)


def rolled_back(controller_records: Iterable[RecordLike]) -> RolledBack:
    """The rolled-back ranges marked by the RestoreStarted records of the controller stream."""
    ranges = []
    for rec in controller_records:
        if isinstance(rec.event, RestoreStarted):
            ranges.append(rolled_back_range(rec.event, rec.seq))
    return RolledBack(ranges)


R = TypeVar("R", bound=RecordLike, covariant=True)
Rec = TypeVar("Rec", bound=RecordLike)


class StreamReader(Protocol[R]):
    """What `controller_history` needs of a log (eventlog's EventLog has it)."""

    def read_stream(self, stream: str) -> Iterable[R]: ...


def controller_history(
    log: StreamReader[Rec], until_seq: int | None = None
) -> tuple[list[Rec], RolledBack]:
    """The controller stream up to `until_seq` (all of it when None) and its rolled-back ranges.

    The one answer to "which records count" for every reader: the ledger, a restore, the CLI
    and the demo's checks.
    """
    records = [
        r for r in log.read_stream(CONTROLLER_STREAM) if until_seq is None or r.seq <= until_seq
    ]
    return records, rolled_back(records)


def effective(records: Iterable[RecordLike], skipped: RolledBack) -> Iterator[RecordLike]:
    """The records that count: every record outside the rolled-back ranges."""
    if not skipped:
        yield from records
        return
    for rec in records:
        if rec.seq not in skipped:
            yield rec


def effective_checkpoints(
    controller_records: Iterable[RecordLike], skipped: RolledBack
) -> list[tuple[int, CheckpointCommitted]]:
    """Checkpoints a restore may go back to, oldest first, as (seq, event).

    A retired checkpoint is never one, even when its CheckpointRetired was rolled back:
    its data-plane checkpoint may be deleted already.
    """
    records = list(controller_records)
    retired = retired_checkpoints(records)
    return [
        (rec.seq, rec.event)
        for rec in effective(records, skipped)
        if isinstance(rec.event, CheckpointCommitted) and rec.seq not in retired
    ]


def retired_checkpoints(controller_records: Iterable[RecordLike]) -> set[int]:
    """The seqs of every retired checkpoint, rolled-back retirements included."""
    return {
        rec.event.checkpoint_seq
        for rec in controller_records
        if isinstance(rec.event, CheckpointRetired)
    }


def unfinished_restore(controller_records: Iterable[Rec]) -> Rec | None:
    """The last RestoreStarted with no RestoreCompleted after it: a restore its process died
    in. The log then folds to the checkpoint's state, but attempts ran after it (rolled back)
    that only a restore's restart events give up and number past."""
    unfinished = None
    for rec in controller_records:
        if isinstance(rec.event, RestoreStarted):
            unfinished = rec
        elif isinstance(rec.event, RestoreCompleted):
            unfinished = None
    return unfinished


def rebuild(
    records: Iterable[RecordLike], skipped: RolledBack, state: LedgerState | None = None
) -> LedgerState:
    """Fold the effective records into `state` (a fresh one when None) and return it."""
    state = LedgerState() if state is None else state
    return fold_all(state, (rec.event for rec in effective(records, skipped)))
