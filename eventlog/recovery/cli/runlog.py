"""What every recovery audit command reads first: the controller stream, and from it which
records a restore rolled back (and which restore), the effective checkpoints and the steps.

The controller stream is small (checkpoints, restores, staging clean-ups), so one read of it
up front lets every command stream the rest of the log once, in seq order, with flat memory.
Which records count is `projections.history.rolled_back`'s answer; this module only asks it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

import msgspec

from eventlog import codec, collector
from eventlog.cli.exits import CliUsageError
from eventlog.cli.numbers import whole_number
from eventlog.cli.output import nearest, nearest_numbers, seq_progress
from eventlog.cli.replay import Selection
from eventlog.cli.views import Mark
from eventlog.errors import FutureSchemaError, SchemaError, UnknownEventTypeError
from eventlog.log import EventLog, decode_record
from eventlog.records import Record, RecordedEvent
from eventlog.recovery.vocabulary import (
    CONTROLLER_STREAM,
    REPLAY_STREAM,
    CheckpointCommitted,
    ReplayConsumed,
    RestoreCompleted,
    RestoreStarted,
    attempt_stream,
    group_stream,
)
from projections.audit_stats import AuditState, TimeBins, Watch, fold_rows
from projections.history import RolledBack, effective_checkpoints, rolled_back


def decoded(record: Record) -> RecordedEvent | None:
    """The record decoded, or None for an unknown type or a newer schema (counted, not
    audited). A known type whose payload does not decode fails closed, naming its seq: a
    group view that skipped it showed the group without its reservation, exit 0."""
    try:
        return decode_record(record)
    except (UnknownEventTypeError, FutureSchemaError):
        return None


def stored_event(type_name: str, schema: int, payload: bytes, seq: int) -> object | None:
    """A stored record's event, or None when it does not decode (`fold_rows`' decoder)."""
    try:
        return codec.decode(type_name, schema, payload, seq=seq)
    except (msgspec.DecodeError, msgspec.ValidationError, SchemaError):
        return None


def audit_pass(
    log: EventLog,
    state: AuditState,
    head: int,
    command: str,
    *,
    seen: set[str] | None = None,
    watch: dict[type, Watch] | None = None,
    times: TimeBins | None = None,
) -> None:
    """Fold records 1..head into `state` in one `fold_rows` pass, with progress (`stats` and
    `report`). The cyclic collector rests meanwhile: the pass keeps an object per attempt
    alive until its group leaves, and collections only rescanned them."""
    with seq_progress(command, 1, head) as advance, collector.paused(long=True):
        rows = log.read_payloads(1, head)
        fold_rows(state, rows, stored_event, seen=seen, watch=watch, times=times, advance=advance)


def decoded_all(records: Iterable[Record]) -> Iterator[RecordedEvent]:
    for record in records:
        found = decoded(record)
        if found is not None:
            yield found


class RunLog:
    """The controller stream of a log, read once: rolled-back ranges, restores, checkpoints."""

    def __init__(self, log: EventLog, *, until_seq: int | None = None) -> None:
        self.log = log
        self.head = log.head() if until_seq is None else min(until_seq, log.head())
        self.controller = list(
            decoded_all(log.read_records(1, self.head, streams=[CONTROLLER_STREAM]))
        )
        self.skipped: RolledBack = rolled_back(self.controller)
        self.restores: list[tuple[RecordedEvent, RolledBack]] = [
            (r, rolled_back([r])) for r in self.controller if isinstance(r.event, RestoreStarted)
        ]
        self.checkpoints: list[tuple[int, CheckpointCommitted]] = effective_checkpoints(
            self.controller, self.skipped
        )
        self._restore_seqs = [r.seq for r, _ in self.restores]

    # -- rolled back --------------------------------------------------------------------------

    def rolled_back_by(self, seq: int) -> int | None:
        """The seq of the RestoreStarted that first rolled this record back, if any did."""
        if seq not in self.skipped:
            return None
        at = bisect.bisect_right(self._restore_seqs, seq)
        for record, ranges in self.restores[at:]:
            if seq in ranges:
                return record.seq
        return None  # pragma: no cover - every skipped seq lies in some restore's range

    def mark(self, seq: int) -> Mark | None:
        by = self.rolled_back_by(seq)
        if by is None:
            return None
        return Mark(text=str(by), fields={"rolled_back": True, "rolled_back_by": by})

    # -- steps and checkpoints ----------------------------------------------------------------

    def checkpoint_seq(self, step: int) -> int:
        """The seq of the effective checkpoint of `step` (the newest when several)."""
        found = [seq for seq, ev in self.checkpoints if ev.step == step]
        if not found:
            raise CliUsageError(
                f"checkpoint {step}: the log has no effective checkpoint of step {step} ("
                + nearest_numbers(step, [ev.step for _, ev in self.checkpoints])
                + ")"
            )
        return found[-1]

    def step_ends(self) -> list[tuple[int, int]]:
        """(seq, step) where each step's work ends, in seq order: its effective training
        (ReplayConsumed) or its effective checkpoint, whichever is later."""
        ends: dict[int, int] = {}
        for seq, ev in self.checkpoints:
            ends[ev.step] = max(ends.get(ev.step, 0), seq)
        for rec in decoded_all(self.log.read_records(1, self.head, streams=[REPLAY_STREAM])):
            if rec.seq not in self.skipped and isinstance(rec.event, ReplayConsumed):
                ends[rec.event.step] = max(ends.get(rec.event.step, 0), rec.seq)
        ordered: list[tuple[int, int]] = []
        for step, seq in sorted(ends.items()):
            if not ordered or seq > ordered[-1][0]:  # a step ends after the one before it
                ordered.append((seq, step))
        return ordered

    def steps(self) -> list[int]:
        """Steps that ended (trained or checkpointed), plus the one in progress after them."""
        ends = self.step_ends()
        done = [step for _, step in ends]
        if self.head > (ends[-1][0] if ends else 0):
            done.append(done[-1] + 1 if done else 0)
        return done

    def step_range(self, step: int) -> tuple[int, int | None]:
        """The seqs of step N's work: after step N-1's end, up to step N's end (inclusive).

        The step in progress (not yet trained nor checkpointed) runs to the head.
        """
        steps = self.steps()
        if step not in steps:
            raise CliUsageError(f"step {step}: not in the log ({nearest_numbers(step, steps)})")
        ends = self.step_ends()
        before = [seq for seq, s in ends if s < step]
        low = before[-1] + 1 if before else 1
        own = [seq for seq, s in ends if s == step]
        return low, (own[0] if own else None)


# -- a group and every record about it --------------------------------------------------------


def _collect(value: object, key: str, found: set[str]) -> None:
    """Every string under `key` (or in a list under it) anywhere in a raw payload."""
    if isinstance(value, dict):
        for k, item in value.items():
            if k == key and isinstance(item, str) and item:
                found.add(item)
            elif k == key and isinstance(item, list):
                found.update(i for i in item if isinstance(i, str))
            else:
                _collect(item, key, found)
    elif isinstance(value, list):
        for item in value:
            _collect(item, key, found)


def _raw(record: Record) -> object:
    try:
        return codec.raw_fields(record.payload)
    except msgspec.DecodeError:
        return None  # a corrupt payload: replay itself will report it


def group_ids(log: EventLog) -> list[str]:
    """Every group id ever reserved (for error messages: it scans the log by type)."""
    return [
        r.stream.removeprefix("group/")
        for r in log.read_records(types=["GroupReserved"])
        if r.stream.startswith("group/")
    ]


def require_group(log: EventLog, group_id: str) -> None:
    if log.stream_version(group_stream(group_id)) is None:
        raise CliUsageError(
            f"group {group_id!r}: the log has no stream {group_stream(group_id)!r} ("
            + nearest(group_id, group_ids(log))
            + ")",
            hint="`eventlog inspect step TARGET N` lists the groups of a step",
        )


def group_selection(log: EventLog, group_id: str, run: RunLog) -> Selection:
    """Every record about group G wherever it lives, as a replay selection, as of the run's
    head.

    Its stream; the attempt streams of every rollout id it named; the replay stream's records
    naming it (selected, released, consumed = trained, evicted); the controller's records
    that cleared its attempts' rows or rolled back any of its records.
    """
    require_group(log, group_id)
    stream = group_stream(group_id)
    head = run.head
    rollout_ids: set[str] = set()
    for record in log.read_records(1, head, streams=[stream]):
        _collect(_raw(record), "rollout_id", rollout_ids)
    streams = [stream, *(attempt_stream(rid) for rid in sorted(rollout_ids))]
    single: dict[str, set[int]] = {}
    for raw in log.read_records(1, head, streams=[REPLAY_STREAM]):
        groups: set[str] = set()
        _collect(_raw(raw), "group_ids", groups)
        if group_id in groups:
            single.setdefault(REPLAY_STREAM, set()).add(raw.seq)
    own_seqs = [r.seq for r in log.read_records(1, head, streams=streams)]
    controller: set[int] = set()
    restored_from: set[int] = set()
    for rec in run.controller:
        event = rec.event
        if isinstance(event, RestoreStarted):
            ranges = rolled_back([rec])
            if any(seq in ranges for seq in own_seqs):
                controller.add(rec.seq)
                restored_from.add(event.rolled_back_from_seq)
        elif isinstance(event, RestoreCompleted):  # goes with its RestoreStarted
            if event.rolled_back_from_seq in restored_from:
                controller.add(rec.seq)
        else:
            named: set[str] = set()
            _collect(codec.to_builtins(event), "rollout_id", named)
            if named & rollout_ids:
                controller.add(rec.seq)
    if controller:
        single[CONTROLLER_STREAM] = controller
    return Selection(streams=streams, seqs=single)


def about_group(log: EventLog, group_id: str, run: RunLog) -> list[RecordedEvent]:
    """The records of `group_selection`, decoded, in seq order."""
    selection = group_selection(log, group_id, run)
    wanted = sorted({*selection.streams, *selection.seqs})
    whole = set(selection.streams)
    return [
        rec
        for rec in decoded_all(log.read_records(1, run.head, streams=wanted))
        if rec.stream in whole or rec.seq in selection.seqs.get(rec.stream, ())
    ]


def _prompt_of(record: Record) -> tuple[str | None, str | None]:
    raw = _raw(record)
    if not isinstance(raw, dict):
        return None, None
    ref = raw.get("prompt_ref")
    sample = ref.get("sample_id") if isinstance(ref, dict) else None
    prompt_id = raw.get("prompt_id")
    return sample, prompt_id if isinstance(prompt_id, str) else None


def incarnations(
    log: EventLog, run: RunLog, group_id: str
) -> tuple[list[tuple[str, int, bool]], list[tuple[str, int, bool]]]:
    """Other groups reserved for the same prompt: (group id, seq, rolled back), earlier and
    later. Only the windows a rollback could link are read: the rolled-back ranges before
    the group's reservation, and the log after the restore that rolled it back."""
    own = list(
        log.read_records(1, run.head, streams=[group_stream(group_id)], types=["GroupReserved"])
    )
    if not own:
        return [], []
    prompt = _prompt_of(own[-1])
    seq = own[-1].seq
    windows_before: list[tuple[int, int | None]] = [
        (low, high) for low, high in run.skipped.ranges if high < seq
    ]
    by = run.rolled_back_by(seq)
    windows_after: list[tuple[int, int | None]] = [(by, run.head)] if by is not None else []

    def scan(windows: list[tuple[int, int | None]]) -> list[tuple[str, int, bool]]:
        found = []
        for low, high in windows:
            for rec in log.read_records(low, high, types=["GroupReserved"]):
                other = rec.stream.removeprefix("group/")
                if other != group_id and _prompt_of(rec) == prompt:
                    found.append((other, rec.seq, rec.seq in run.skipped))
        return found

    return scan(windows_before), scan(windows_after)


def point_seq(run: RunLog, text: str) -> int:
    """A point in the log as of the run's head: a seq, `step:N` (the end of step N),
    `checkpoint:N` or `head`."""
    kind, _, number = text.partition(":")
    if text == "head":
        return run.head
    if not number:
        kind, number = "seq", text
    value = whole_number(number)
    if value is None:
        raise CliUsageError(f"point {text!r}: expected a seq, step:N, checkpoint:N or head")
    if kind == "seq":
        if not 0 <= value <= run.head:
            raise CliUsageError(f"seq {value}: not in the log (valid: 0..{run.head})")
        return value
    if kind == "step":
        _, end = run.step_range(value)
        return run.head if end is None else end
    if kind == "checkpoint":
        return run.checkpoint_seq(value)
    raise CliUsageError(f"point {text!r}: expected a seq, step:N, checkpoint:N or head")
