"""Recovery statistics per agent and task, and per step: "how much work did recovery cost,
what did each step train, how stale, and how much was thrown away?".

Folded record by record (`fold_audit`, records in seq order), then `report`. Steps are told
apart by where each step ends (its training or its checkpoint, whichever is later), given up
front like the rolled-back ranges: step N's records lie after step N-1's end, up to N's.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Annotated, Any

import msgspec

from eventlog.recovery.vocabulary import (
    AttemptFailed,
    CheckpointCommitted,
    GenerationFinished,
    GenerationStarted,
    GroupAbandoned,
    GroupDiscarded,
    GroupFinalized,
    GroupReserved,
    GroupSealed,
    Index,
    NonEmpty,
    ReplayConsumed,
    ReplayEvicted,
    RestoreCompleted,
    RestoreStarted,
    RetryPrepared,
    SiblingsDispatched,
    SiblingSealed,
    StaleResultRejected,
    TokensStaged,
    UnsealedAbandoned,
    rollout_id_for,
)
from projections.audit import AUDIT_TYPES, AuditRecord, group_of_rollout
from projections.history import RolledBack

STATS_TYPES = AUDIT_TYPES | {ReplayConsumed.__name__, ReplayEvicted.__name__}
"""Record types `fold_audit` reads (the per-step figures also need training)."""

Key = tuple[str | None, str | None]
"""(agent_name, task_name) of a group, as its GroupReserved recorded them."""

UNKNOWN_KEY: Key = ("?", "?")
"""Where records of a group no GroupReserved names are counted."""


# -- what the fold reads of the most frequent records ------------------------------------------
#
# A run log is mostly worker records (GenerationStarted, TokensStaged, GenerationFinished) and
# seals; the fold reads three or four fields of each. These views decode just those fields
# (same tag, same constraints on what they hold), a third of the cost of the whole event.


class StartedView(msgspec.Struct, frozen=True, tag="GenerationStarted", tag_field="type"):
    rollout_id: NonEmpty
    group_id: NonEmpty
    generation_index: Index
    weight_version: int


class StagedView(msgspec.Struct, frozen=True, tag="TokensStaged", tag_field="type"):
    rollout_id: NonEmpty
    token_count: Annotated[int, msgspec.Meta(ge=0)]


class FinishedView(msgspec.Struct, frozen=True, tag="GenerationFinished", tag_field="type"):
    rollout_id: NonEmpty


class SealedView(msgspec.Struct, frozen=True, tag="SiblingSealed", tag_field="type"):
    group_id: NonEmpty
    generation_index: Index
    rollout_id: NonEmpty


VIEWS: dict[str, tuple[int, type[msgspec.Struct]]] = {
    full.__name__: (full.schema, view)
    for full, view in (
        (GenerationStarted, StartedView),
        (TokensStaged, StagedView),
        (GenerationFinished, FinishedView),
        (SiblingSealed, SealedView),
    )
}
"""Type name -> (the schema version a view reads, the view): a reader decodes a record of
that version into the view instead of the event, and `fold_event` takes either."""


@dataclass(slots=True)
class KeyStats:
    """The counters of one (agent, task)."""

    groups: int = 0
    """Groups reserved (effective reservations)."""
    finalized: int = 0
    discarded: int = 0
    dispatched: int = 0
    """Attempts dispatched to workers (SiblingsDispatched), rolled back or not."""
    started: int = 0
    """Attempts a worker started (GenerationStarted), rolled back or not (real work)."""
    retries: int = 0
    """Attempts minted by RetryPrepared (after a failure, an abandon or a restore)."""
    failed: int = 0
    abandoned: int = 0
    stale_rejected: int = 0
    reused_after_restore: int = 0
    """Sealed siblings a restore kept (they did not run again)."""
    redispatched_after_restore: int = 0
    """Attempts a restore minted for siblings that were not sealed at its checkpoint."""
    rows_staged: int = 0
    tokens_staged: int = 0
    rows_kept: int = 0
    """Staged rows of attempts the effective history sealed (finalized or still owned)."""
    tokens_kept: int = 0
    rows_discarded: int = 0
    """Staged rows no kept seal owns: failed, abandoned, superseded or rolled-back attempts,
    and discarded groups."""
    tokens_discarded: int = 0
    rows_open: int = 0
    """Staged rows of attempts still in flight at the end of the log."""
    tokens_open: int = 0
    latencies_ns: list[int] = field(default_factory=list)
    """GenerationStarted -> GenerationFinished, by recorded_at, of every finished attempt."""


@dataclass(slots=True)
class _Attempt:
    group_id: str
    index: int
    rows: int = 0
    tokens: int = 0
    started_ns: int | None = None
    weight_version: int | None = None
    sealed: bool = False
    dead: bool = False
    tokens_by_step: dict[int, int] = field(default_factory=dict)
    """Tokens staged, by the step whose records staged them."""


@dataclass
class StepStats:
    """The counters of one step."""

    groups_trained: int = 0
    """Groups the trainer consumed at this step (ReplayConsumed, effective)."""
    siblings_trained: int = 0
    staleness: Counter[int] = field(default_factory=Counter)
    """Trained step - weight version the sibling was generated with, per trained sibling."""
    tokens_trained: int = 0
    """Tokens of the sealed attempts of the groups trained at this step."""
    tokens_thrown_away: int = 0
    """Tokens staged during this step by attempts no kept seal owns (failed, abandoned,
    superseded, rolled back, discarded)."""
    retries: int = 0
    """Attempts minted by RetryPrepared during this step, rolled back or not."""
    failed: int = 0
    restores: int = 0
    rolled_back_records: int = 0
    """Records the restores of this step rolled back."""
    siblings_reused: int = 0
    siblings_redispatched: int = 0
    rows_cleared: int = 0


@dataclass
class _Group:
    key: Key
    current: dict[int, str] = field(default_factory=dict)
    """Generation index -> rollout id of its current attempt (effective history)."""
    sealed: dict[int, str] = field(default_factory=dict)
    attempts: list[str] = field(default_factory=list)


@dataclass
class AuditState:
    """Everything `fold_audit` accumulates; `report` turns it into figures."""

    skipped: RolledBack = field(default_factory=RolledBack)
    by_key: dict[Key, KeyStats] = field(default_factory=dict)
    restores: int = 0
    checkpoints: int = 0
    records: int = 0
    rolled_back_records: int = 0
    keys: dict[str, Key] = field(default_factory=dict)
    """Every group id ever reserved -> its key (late records of a group that left still count)."""
    groups: dict[str, _Group] = field(default_factory=dict)
    """Groups in the ledger (effective history)."""
    attempts: dict[str, _Attempt] = field(default_factory=dict)
    """Attempts of groups that have not left the ledger, by rollout id."""
    orphans: dict[str, list[str]] = field(default_factory=dict)
    """Attempts named while their group was not in the ledger (a rolled-back reservation)."""
    in_restore: bool = False
    step_ends: list[tuple[int, int]] = field(default_factory=list)
    """(seq, step) of each step's last record, in seq order: the step boundaries."""
    by_step: dict[int, StepStats] = field(default_factory=dict)
    trainable: dict[str, list[tuple[int | None, int]]] = field(default_factory=dict)
    """Finalized groups not yet trained: (weight version, tokens) of each sealed sibling."""
    seq: int = 0
    """The seq of the record being folded."""
    _skip_window: tuple[int, int, bool] = field(default=(1, 0, False), init=False, repr=False)
    """(low, high, rolled back): seqs known to be all rolled back or all not (records come in
    seq order, so most lookups land in the window of the one before)."""
    _step_window: tuple[int, int, int] = field(default=(1, 0, 0), init=False, repr=False)
    """(low, high, step): seqs known to belong to one step."""
    _stats_of: dict[str | None, KeyStats] = field(default_factory=dict, init=False, repr=False)
    """Group id -> its KeyStats, as `stats(key_of(group))` answers (reset on a reservation)."""

    def step_of(self, seq: int) -> int:
        """The step whose records include `seq`: the first step ending at or after it, or the
        step after the last one."""
        low, high, step = self._step_window
        if low <= seq <= high:
            return step
        at = bisect.bisect_left(self.step_ends, (seq, -(10**18)))
        low = self.step_ends[at - 1][0] + 1 if at > 0 else -(10**18)
        if at < len(self.step_ends):
            high, step = self.step_ends[at]
        else:
            high = 10**18
            step = self.step_ends[-1][1] + 1 if self.step_ends else 0
        self._step_window = (low, high, step)
        return step

    def rolled_back(self, seq: int) -> bool:
        """Whether a restore rolled `seq` back (`seq in skipped`, remembered by window)."""
        return self.skip_window(seq)[2]

    def skip_window(self, seq: int) -> tuple[int, int, bool]:
        """(low, high, rolled back) of the seqs around `seq` that are all rolled back or all
        not: a reader in seq order asks again only once it leaves the window."""
        low, high, _ = self._skip_window
        if low <= seq <= high:
            return self._skip_window
        ranges = self.skipped.ranges
        at = bisect.bisect_right(ranges, (seq, 10**18)) - 1
        if at >= 0 and ranges[at][0] <= seq <= ranges[at][1]:
            self._skip_window = (ranges[at][0], ranges[at][1], True)
            return self._skip_window
        low = ranges[at][1] + 1 if at >= 0 else -(10**18)
        high = ranges[at + 1][0] - 1 if at + 1 < len(ranges) else 10**18
        self._skip_window = (low, high, False)
        return self._skip_window

    def set_key(self, group_id: str, key: Key) -> None:
        self.keys[group_id] = key
        self._stats_of.pop(group_id, None)

    def group_stats(self, group_id: str | None) -> KeyStats:
        """`stats(key_of(group_id))`, remembered per group."""
        found = self._stats_of.get(group_id)
        if found is None:
            found = self._stats_of[group_id] = self.stats(self.key_of(group_id))
        return found

    def step(self, step: int | None = None) -> StepStats:
        step = self.step_of(self.seq) if step is None else step
        found = self.by_step.get(step)
        if found is None:
            found = self.by_step[step] = StepStats()
        return found

    def stats(self, key: Key) -> KeyStats:
        found = self.by_key.get(key)
        if found is None:
            found = self.by_key[key] = KeyStats()
        return found

    def key_of(self, group_id: str | None) -> Key:
        return self.keys.get(group_id, UNKNOWN_KEY) if group_id is not None else UNKNOWN_KEY


def _attempt(state: AuditState, group_id: str, index: int, rollout_id: str) -> _Attempt:
    found = state.attempts.get(rollout_id)
    if found is None:
        found = state.attempts[rollout_id] = _Attempt(group_id, index)
        group = state.groups.get(group_id)
        if group is not None:
            group.attempts.append(rollout_id)
        else:
            state.orphans.setdefault(group_id, []).append(rollout_id)
    return found


def _settle(
    stats: KeyStats, attempt: _Attempt, kept: bool, by_step: AuditState | None = None
) -> None:
    """Count an attempt's rows kept or discarded (and, with `by_step`, per step)."""
    if kept:
        stats.rows_kept += attempt.rows
        stats.tokens_kept += attempt.tokens
    else:
        stats.rows_discarded += attempt.rows
        stats.tokens_discarded += attempt.tokens
        if by_step is not None:
            for step, tokens in attempt.tokens_by_step.items():
                by_step.step(step).tokens_thrown_away += tokens


def _on_reserved(state: AuditState, ev: GroupReserved, effective: bool) -> None:
    key = (ev.agent_name, ev.prompt_ref.task_name)
    state.set_key(ev.group_id, key)
    if not effective:
        return
    state.stats(key).groups += 1
    # A group id freed by a rolled-back reservation may be reserved again: the attempts of the
    # rolled-back incarnation can no longer be owned by anything.
    for rid in state.orphans.pop(ev.group_id, []):
        attempt = state.attempts.pop(rid, None)
        if attempt is not None:
            _settle(state.stats(key), attempt, kept=False, by_step=state)
    state.groups[ev.group_id] = _Group(
        key,
        current={i: rollout_id_for(ev.group_id, i, 0) for i in range(ev.expected_generations)},
    )


def _on_attempts(
    state: AuditState, ev: SiblingsDispatched | RetryPrepared, effective: bool
) -> None:
    stats = state.group_stats(ev.group_id)
    for ref in ev.attempts:
        _attempt(state, ev.group_id, ref.generation_index, ref.rollout_id)
    if isinstance(ev, SiblingsDispatched):
        stats.dispatched += len(ev.attempts)
    else:
        stats.retries += len(ev.attempts)
        state.step().retries += len(ev.attempts)
        if effective and state.in_restore:
            stats.redispatched_after_restore += len(ev.attempts)
    group = state.groups.get(ev.group_id) if effective else None
    if group is not None:
        for ref in ev.attempts:
            group.current[ref.generation_index] = ref.rollout_id


def _on_abandoned(
    state: AuditState, ev: UnsealedAbandoned | GroupAbandoned, effective: bool
) -> None:
    state.group_stats(ev.group_id).abandoned += len(ev.attempts)
    if effective:
        for ref in ev.attempts:
            _attempt(state, ev.group_id, ref.generation_index, ref.rollout_id).dead = True


def _on_failed(state: AuditState, ev: AttemptFailed, effective: bool) -> None:
    state.group_stats(ev.group_id).failed += 1
    state.step().failed += 1
    if effective:
        _attempt(state, ev.group_id, ev.generation_index, ev.rollout_id).dead = True


def _on_sealed(
    state: AuditState, ev: SiblingSealed | SealedView | GroupSealed, effective: bool
) -> None:
    if not effective:
        return
    group = state.groups.get(ev.group_id)
    results = (
        [(r.generation_index, r.rollout_id) for r in ev.results]
        if isinstance(ev, GroupSealed)
        else [(ev.generation_index, ev.rollout_id)]
    )
    for index, rid in results:
        _attempt(state, ev.group_id, index, rid).sealed = True
        if group is not None:
            group.sealed[index] = rid


def _on_stale(state: AuditState, ev: StaleResultRejected, effective: bool) -> None:
    state.group_stats(ev.group_id).stale_rejected += 1


def _on_left(state: AuditState, ev: GroupFinalized | GroupDiscarded, effective: bool) -> None:
    if not effective:
        return
    stats = state.group_stats(ev.group_id)
    finalized = isinstance(ev, GroupFinalized)
    if finalized:
        stats.finalized += 1
    else:
        stats.discarded += 1
    group = state.groups.pop(ev.group_id, None)
    if group is None:
        return
    trained: list[tuple[int | None, int]] = []
    for rid in group.attempts:
        attempt = state.attempts.pop(rid, None)
        if attempt is not None:
            kept = finalized and attempt.sealed and not attempt.dead
            _settle(stats, attempt, kept=kept, by_step=state)
            if kept:
                trained.append((attempt.weight_version, attempt.tokens))
    if finalized:
        state.trainable[ev.group_id] = trained


def _on_replay(state: AuditState, ev: ReplayConsumed | ReplayEvicted, effective: bool) -> None:
    if not effective:
        return
    for group_id in ev.group_ids:
        siblings = state.trainable.pop(group_id, None)
        if siblings is None or not isinstance(ev, ReplayConsumed):
            continue
        step = state.step(ev.step)
        step.groups_trained += 1
        for weight_version, tokens in siblings:
            step.siblings_trained += 1
            step.tokens_trained += tokens
            if weight_version is not None:
                step.staleness[ev.step - weight_version] += 1


def _on_restore_started(state: AuditState, ev: RestoreStarted, effective: bool) -> None:
    state.restores += 1
    state.in_restore = True
    # Every record since the checkpoint is rolled back, so these groups are as it saw them.
    for group in state.groups.values():
        state.stats(group.key).reused_after_restore += len(group.sealed)


def _on_restore_completed(state: AuditState, ev: RestoreCompleted, effective: bool) -> None:
    state.in_restore = False
    step = state.step()
    step.restores += 1
    step.rolled_back_records += ev.rolled_back_until_seq - ev.rolled_back_from_seq + 1
    step.siblings_reused += ev.siblings_reused
    step.siblings_redispatched += ev.siblings_redispatched
    step.rows_cleared += ev.rows_cleared


def _on_checkpoint(state: AuditState, ev: CheckpointCommitted, effective: bool) -> None:
    state.checkpoints += effective


_HANDLERS: dict[type, Callable[[AuditState, Any, bool], None]] = {
    GroupReserved: _on_reserved,
    SiblingsDispatched: _on_attempts,
    RetryPrepared: _on_attempts,
    UnsealedAbandoned: _on_abandoned,
    GroupAbandoned: _on_abandoned,
    AttemptFailed: _on_failed,
    SiblingSealed: _on_sealed,
    SealedView: _on_sealed,
    GroupSealed: _on_sealed,
    StaleResultRejected: _on_stale,
    GroupFinalized: _on_left,
    GroupDiscarded: _on_left,
    RestoreStarted: _on_restore_started,
    RestoreCompleted: _on_restore_completed,
    CheckpointCommitted: _on_checkpoint,
    ReplayConsumed: _on_replay,
    ReplayEvicted: _on_replay,
}


def count_record(state: AuditState, seq: int) -> bool:
    """Count a record of any type (rolled back or not) without reading its event; True when
    it counts. A reader that skips decoding the types `fold_audit` ignores calls this for
    them, so the record counts still cover the whole log."""
    effective = not state.rolled_back(seq)
    state.records += 1
    state.seq = seq
    state.rolled_back_records += not effective
    return effective


def fold_audit(state: AuditState, record: AuditRecord) -> AuditState:
    """Count one record into the statistics (records must come in seq order)."""
    fold_event(state, record.seq, record.recorded_at, record.event)
    return state


def fold_event(state: AuditState, seq: int, recorded_at: int, ev: object | None) -> None:
    """`fold_audit` of a record given as its seq, recorded_at and its event (or its view
    from VIEWS; None: a record counted, not read)."""
    effective = count_record(state, seq)
    if ev is not None:
        _take(state, ev, recorded_at, effective)


def _take(state: AuditState, ev: object, recorded_at: int, effective: bool) -> None:
    """Hand a counted record's event (or view) to its worker or history handler, if any."""
    worker = _WORKER.get(type(ev))
    if worker is not None:
        worker(state, ev, recorded_at)
        return
    handler = _HANDLERS.get(type(ev))
    if handler is not None:
        handler(state, ev, effective)


def _on_started(state: AuditState, ev: GenerationStarted | StartedView, at: int) -> None:
    attempt = _attempt(state, ev.group_id, ev.generation_index, ev.rollout_id)
    attempt.started_ns = at
    attempt.weight_version = ev.weight_version
    state.group_stats(ev.group_id).started += 1


def _on_staged(state: AuditState, ev: TokensStaged | StagedView, at: int) -> None:
    attempt = state.attempts.get(ev.rollout_id)
    group_id = attempt.group_id if attempt else group_of_rollout(ev.rollout_id)
    stats = state.group_stats(group_id)
    tokens = ev.token_count
    stats.rows_staged += 1
    stats.tokens_staged += tokens
    if attempt is not None:
        attempt.rows += 1
        attempt.tokens += tokens
        step = state.step_of(state.seq)
        by_step = attempt.tokens_by_step
        by_step[step] = by_step.get(step, 0) + tokens
    else:  # its group already left the ledger: nothing can own this row any more
        stats.rows_discarded += 1
        stats.tokens_discarded += tokens
        state.step().tokens_thrown_away += tokens


def _on_finished(state: AuditState, ev: GenerationFinished | FinishedView, at: int) -> None:
    attempt = state.attempts.get(ev.rollout_id)
    group_id = attempt.group_id if attempt else group_of_rollout(ev.rollout_id)
    stats = state.group_stats(group_id)  # the key gets its row even without a latency
    if attempt is not None and attempt.started_ns is not None:
        stats.latencies_ns.append(at - attempt.started_ns)


_WORKER: dict[type, Callable[[AuditState, Any, int], None]] = {
    StagedView: _on_staged,
    TokensStaged: _on_staged,
    StartedView: _on_started,
    GenerationStarted: _on_started,
    FinishedView: _on_finished,
    GenerationFinished: _on_finished,
}
"""Worker records: what they add depends on when they were recorded, not on the history."""


def _row_entry(name: str) -> tuple[int, Any, Any, Any]:
    """What `fold_rows` does with a record of type `name`: (the schema its view reads or -1,
    the view's decode, the view's handler, the view's worker handler)."""
    found = VIEWS.get(name)
    if found is None:
        return (-1, None, None, None)
    schema, view = found
    decoder = msgspec.msgpack.Decoder(view)
    return (schema, decoder.decode, _HANDLERS.get(view), _WORKER.get(view))


_ROW_TABLE: dict[str, tuple[int, Any, Any, Any]] = {name: _row_entry(name) for name in STATS_TYPES}
"""Type name -> `_row_entry`, for every type the fold reads."""


# -- folding stored rows ----------------------------------------------------------------------

PayloadRow = tuple[int, str, int, int, bytes]
"""seq, type name, schema version, recorded_at, payload of a stored record."""

RowDecoder = Callable[[str, int, bytes, int], object | None]
"""(type name, schema, payload, seq) -> the event, or None when it does not decode."""

Watch = Callable[[Any, int, bool], None]
"""Called with (event or view, recorded_at, effective) after the fold took the record."""


@dataclass(slots=True)
class TimeBins:
    """A histogram of every record's recorded_at: `bins` equal slices of first..first+span
    (a time outside lands in the first or last bin)."""

    first: int
    span: int
    bins: list[int]


def fold_rows(
    state: AuditState,
    rows: Iterable[PayloadRow],
    decode: RowDecoder,
    *,
    seen: set[str] | None = None,
    watch: dict[type, Watch] | None = None,
    times: TimeBins | None = None,
    advance: Callable[[int], None] | None = None,
) -> None:
    """`fold_event` of every stored row (seq order), in one loop: a record of a type the fold
    ignores is counted without decoding it; the frequent types are decoded as their VIEWS
    (at the schema a view reads), the others with `decode`; a record that does not decode is
    counted, not read. The same figures as `fold_event(state, seq, at, stats_event(...))`
    per row, without its per-record calls.

    `seen` gets the name of every record type decoded other than as a view; `watch`
    maps an event class to what to call after the fold took one; `times` counts every
    record's recorded_at; `advance` is called now and then with the seq reached."""
    table = _ROW_TABLE
    watching = watch or {}
    if times is not None:
        first, span, bins = times.first, max(times.span, 1), times.bins
        n_bins = len(bins)
        last_bin = n_bins - 1
    records = rolled_back = 0
    low, high, inside = 1, 0, False
    seq = state.seq
    try:
        for seq, type_name, schema, at, payload in rows:
            records += 1
            if not low <= seq <= high:
                low, high, inside = state.skip_window(seq)
            if not records & 4095 and advance is not None:
                advance(seq)
            if inside:
                rolled_back += 1
            if times is not None:
                place = (at - first) * n_bins // span  # clamped without min/max calls
                bins[last_bin if place > last_bin else place if place > 0 else 0] += 1
            entry = table.get(type_name)
            if entry is None:  # a type the fold does not read: counted only
                continue
            state.seq = seq
            ev: object | None
            view_schema, view, on_view, on_worker = entry
            if view_schema == schema:  # a frequent type, as the view of what the fold reads
                try:
                    ev = view(payload)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    continue
                if on_worker is not None:
                    on_worker(state, ev, at)
                else:
                    on_view(state, ev, not inside)
            else:
                if seen is not None:
                    seen.add(type_name)
                ev = decode(type_name, schema, payload, seq)
                if ev is None:
                    continue
                _take(state, ev, at, not inside)
            if watching:
                watcher = watching.get(type(ev))
                if watcher is not None:
                    watcher(ev, at, not inside)
    finally:
        state.records += records
        state.rolled_back_records += rolled_back
        state.seq = seq
        if advance is not None:
            advance(seq)


# -- the report -------------------------------------------------------------------------------


class LatencySummary(msgspec.Struct, frozen=True, kw_only=True):
    count: int
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None


class KeyReport(msgspec.Struct, frozen=True, kw_only=True):
    """One row of `eventlog stats`' recovery table."""

    agent_name: str | None
    task_name: str | None
    groups: int
    finalized: int
    discarded: int
    dispatched: int
    started: int
    retries: int
    failed: int
    abandoned: int
    stale_rejected: int
    reused_after_restore: int
    redispatched_after_restore: int
    rows_staged: int
    tokens_staged: int
    rows_kept: int
    tokens_kept: int
    rows_discarded: int
    tokens_discarded: int
    rows_open: int
    tokens_open: int
    generation_latency: LatencySummary


class StepReport(msgspec.Struct, frozen=True, kw_only=True):
    """One step: what it trained, how stale, what it threw away, what recovery cost."""

    step: int
    groups_trained: int
    siblings_trained: int
    staleness: dict[int, int]
    """Trained step - weight version -> trained siblings (a distribution)."""
    tokens_trained: int
    tokens_thrown_away: int
    retries: int
    failed: int
    restores: int
    rolled_back_records: int
    siblings_reused: int
    siblings_redispatched: int
    rows_cleared: int


class AuditReport(msgspec.Struct, frozen=True, kw_only=True):
    records: int
    rolled_back_records: int
    restores: int
    checkpoints: int
    by_agent_task: list[KeyReport]
    total: KeyReport
    by_step: list[StepReport]


def _nearest_rank(ordered: list[int], q: float) -> float | None:
    if not ordered:
        return None
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return round(ordered[rank - 1] / 1e6, 3)


def _latency(values: list[int]) -> LatencySummary:
    ordered = sorted(values)
    return LatencySummary(
        count=len(ordered),
        p50_ms=_nearest_rank(ordered, 50),
        p90_ms=_nearest_rank(ordered, 90),
        p99_ms=_nearest_rank(ordered, 99),
        max_ms=round(ordered[-1] / 1e6, 3) if ordered else None,
    )


_COUNTERS = [f.name for f in fields(KeyStats) if f.name != "latencies_ns"]


def _key_report(key: Key, stats: KeyStats) -> KeyReport:
    values = {name: getattr(stats, name) for name in _COUNTERS}
    return KeyReport(
        agent_name=key[0],
        task_name=key[1],
        generation_latency=_latency(stats.latencies_ns),
        **values,
    )


def report(state: AuditState) -> AuditReport:
    """The figures as of the last folded record (the state itself is left unchanged).

    Attempts of groups still in the ledger are settled as they stand: sealed -> kept, the
    current attempt of an unsealed sibling -> open, any other -> discarded.
    """
    by_key = {key: _copy(stats) for key, stats in state.by_key.items()}
    thrown: Counter[int] = Counter()
    for rid, attempt in state.attempts.items():
        group = state.groups.get(attempt.group_id)
        key = group.key if group else state.key_of(attempt.group_id)
        stats = by_key.setdefault(key, KeyStats())
        if group is not None and attempt.sealed and not attempt.dead:
            _settle(stats, attempt, kept=True)
        elif group is not None and not attempt.dead and group.current.get(attempt.index) == rid:
            stats.rows_open += attempt.rows
            stats.tokens_open += attempt.tokens
        else:
            _settle(stats, attempt, kept=False)
            for step, tokens in attempt.tokens_by_step.items():
                thrown[step] += tokens
    total = KeyStats()
    for stats in by_key.values():
        for name in _COUNTERS:
            setattr(total, name, getattr(total, name) + getattr(stats, name))
        total.latencies_ns.extend(stats.latencies_ns)
    ordered = sorted(by_key.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1])))
    return AuditReport(
        records=state.records,
        rolled_back_records=state.rolled_back_records,
        restores=state.restores,
        checkpoints=state.checkpoints,
        by_agent_task=[_key_report(key, stats) for key, stats in ordered],
        total=_key_report((None, None), total),
        by_step=[
            _step_report(n, state.by_step.get(n, StepStats()), thrown[n])
            for n in sorted({*state.by_step, *thrown})
        ],
    )


def _step_report(step: int, stats: StepStats, thrown: int) -> StepReport:
    return StepReport(
        step=step,
        groups_trained=stats.groups_trained,
        siblings_trained=stats.siblings_trained,
        staleness=dict(sorted(stats.staleness.items())),
        tokens_trained=stats.tokens_trained,
        tokens_thrown_away=stats.tokens_thrown_away + thrown,
        retries=stats.retries,
        failed=stats.failed,
        restores=stats.restores,
        rolled_back_records=stats.rolled_back_records,
        siblings_reused=stats.siblings_reused,
        siblings_redispatched=stats.siblings_redispatched,
        rows_cleared=stats.rows_cleared,
    )


def _copy(stats: KeyStats) -> KeyStats:
    copied = KeyStats(**{name: getattr(stats, name) for name in _COUNTERS})
    copied.latencies_ns = list(stats.latencies_ns)
    return copied


def audit(
    records: Iterable[AuditRecord],
    skipped: RolledBack,
    step_ends: list[tuple[int, int]] | None = None,
) -> AuditReport:
    """Fold every record (in seq order) and report: the whole statistics in one call."""
    state = AuditState(skipped=skipped, step_ends=list(step_ends or []))
    for record in records:
        fold_audit(state, record)
    return report(state)
