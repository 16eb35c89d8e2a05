"""Audit folds: one group's timeline, and recovery statistics per agent and task.

Two questions people ask of a run: "what happened to group G?" (`group_timeline`,
`summarize_group`) and "how much work did recovery cost, per agent and task?" (`AuditState`,
folded record by record with `fold_audit`, then `report`).

Rolled-back records (projections.history) are facts about work that physically happened:
dispatches, worker runs, staged rows, failures and rejected late results count wherever they
are. What the ledger *kept* (seals, which siblings a restore reused, which staged rows ended
up owned by a sealed attempt) follows the effective history only, as a rebuild sees it.

Pure: no I/O, no clock; the rolled-back ranges are given up front (read the controller stream
first, as the ledger does), so one pass in seq order suffices.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Protocol

import msgspec

from eventlog.events import Event
from eventlog.recovery.vocabulary import (
    AttemptFailed,
    AttemptRef,
    CheckpointCommitted,
    GenerationFailed,
    GenerationFinished,
    GenerationStarted,
    GroupAbandoned,
    GroupDiscarded,
    GroupFinalized,
    GroupReserved,
    GroupSealed,
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
from projections.history import RolledBack


class AuditRecord(Protocol):
    """What the audit folds need of a stored record (eventlog's RecordedEvent has it)."""

    @property
    def seq(self) -> int: ...

    @property
    def stream(self) -> str: ...

    @property
    def recorded_at(self) -> int: ...

    @property
    def event(self) -> Event: ...


AUDIT_TYPES = frozenset(
    cls.__name__
    for cls in (
        GroupReserved,
        SiblingsDispatched,
        RetryPrepared,
        AttemptFailed,
        SiblingSealed,
        GroupSealed,
        UnsealedAbandoned,
        GroupAbandoned,
        StaleResultRejected,
        GroupFinalized,
        GroupDiscarded,
        RestoreStarted,
        RestoreCompleted,
        CheckpointCommitted,
        GenerationStarted,
        TokensStaged,
        GenerationFinished,
        GenerationFailed,
    )
)
"""Record types `fold_audit` reads; a reader may skip decoding every other record."""

RECOVERY_TYPES = frozenset({"GroupReserved"})
"""A log holds recovery events when it holds at least one of these."""

_ROLLOUT = re.compile(r"^(?P<group>.+)_g(?P<index>\d+)(?:-a(?P<attempt>\d+))?$")


def group_of_rollout(rollout_id: str) -> str | None:
    """The group id a rollout id names (`{group}_g{i}` or `{group}_g{i}-a{n}`), if it parses."""
    match = _ROLLOUT.match(rollout_id)
    return match["group"] if match else None


# -- one group's timeline ---------------------------------------------------------------------


class TimelineEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One record of a group's history, marked when a restore rolled it back."""

    seq: int
    stream: str
    recorded_at: int
    event: Event
    rolled_back: bool


def group_timeline(records: Iterable[AuditRecord], skipped: RolledBack) -> list[TimelineEntry]:
    """The records in seq order (each seq once), each marked rolled back or not."""
    by_seq = {rec.seq: rec for rec in records}
    return [
        TimelineEntry(
            seq=seq,
            stream=rec.stream,
            recorded_at=rec.recorded_at,
            event=rec.event,
            rolled_back=seq in skipped,
        )
        for seq, rec in sorted(by_seq.items())
    ]


AttemptVerdict = Literal["reserved", "dispatched", "sealed", "failed", "abandoned", "rolled back"]
WorkerStatus = Literal["not started", "running", "finished", "failed"]


class AttemptSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One attempt as the timeline shows it: the ledger's verdict and what its worker did."""

    generation_index: int
    attempt: int
    rollout_id: str
    verdict: AttemptVerdict
    """The last effective ledger event about it; `rolled back` when all of them were."""
    worker: WorkerStatus
    rows_staged: int
    tokens_staged: int
    reward: float | None
    latency_ns: int | None
    stale_rejections: int


class GroupSummary(msgspec.Struct, frozen=True, kw_only=True):
    """A group at a glance: who it belongs to, how it ended, and every attempt it ran."""

    group_id: str
    agent_name: str | None
    task_name: str | None
    granularity: str | None
    expected_generations: int | None
    fate: Literal["finalized", "discarded", "in the ledger", "rolled back", "unknown"]
    records: int
    rolled_back_records: int
    attempts: list[AttemptSummary]


@dataclass
class _AttemptNotes:
    index: int
    attempt: int
    verdict: AttemptVerdict | None = None
    rolled_back_verdict: bool = False
    worker: WorkerStatus = "not started"
    rows: int = 0
    tokens: int = 0
    reward: float | None = None
    started_ns: int | None = None
    latency_ns: int | None = None
    stale: int = 0


def _refs(event: Event) -> list[AttemptRef]:
    if isinstance(event, SiblingsDispatched | RetryPrepared | UnsealedAbandoned | GroupAbandoned):
        return list(event.attempts)
    return []


def summarize_group(group_id: str, timeline: Iterable[TimelineEntry]) -> GroupSummary:
    """Fold a group's timeline (from `group_timeline`) into its summary."""
    notes: dict[str, _AttemptNotes] = {}
    reserved: GroupReserved | None = None
    fate: str = "unknown"
    records = rolled = 0

    def note(rollout_id: str, index: int, attempt: int) -> _AttemptNotes:
        found = notes.get(rollout_id)
        if found is None:
            found = notes[rollout_id] = _AttemptNotes(index, attempt)
        return found

    def verdict(entry: TimelineEntry, n: _AttemptNotes, value: AttemptVerdict) -> None:
        if entry.rolled_back:
            if n.verdict is None:
                n.rolled_back_verdict = True
            return
        n.verdict, n.rolled_back_verdict = value, False

    for entry in timeline:
        records += 1
        rolled += entry.rolled_back
        ev = entry.event
        if isinstance(ev, GroupReserved):
            if reserved is None or not entry.rolled_back:
                reserved = ev
            if not entry.rolled_back:
                fate = "in the ledger"
            elif fate == "unknown":
                fate = "rolled back"
        elif isinstance(ev, GroupFinalized | GroupDiscarded) and not entry.rolled_back:
            fate = "finalized" if isinstance(ev, GroupFinalized) else "discarded"
        for ref in _refs(ev):
            n = note(ref.rollout_id, ref.generation_index, ref.attempt)
            if isinstance(ev, SiblingsDispatched):
                verdict(entry, n, "dispatched")
            elif isinstance(ev, RetryPrepared):
                verdict(entry, n, "reserved")
            else:
                verdict(entry, n, "abandoned")
        if isinstance(ev, SiblingSealed):
            n = note(ev.rollout_id, ev.generation_index, ev.attempt)
            verdict(entry, n, "sealed")
            n.reward = ev.reward if not entry.rolled_back else n.reward
        elif isinstance(ev, GroupSealed):
            for result in ev.results:
                n = note(result.rollout_id, result.generation_index, result.attempt)
                verdict(entry, n, "sealed")
                n.reward = result.reward if not entry.rolled_back else n.reward
        elif isinstance(ev, AttemptFailed):
            verdict(entry, note(ev.rollout_id, ev.generation_index, ev.attempt), "failed")
        elif isinstance(ev, StaleResultRejected):
            match = _ROLLOUT.match(ev.rollout_id)
            attempt = int(match["attempt"] or 0) if match else 0
            note(ev.rollout_id, ev.generation_index, attempt).stale += 1
        elif isinstance(ev, GenerationStarted):
            n = note(ev.rollout_id, ev.generation_index, ev.attempt)
            n.worker, n.started_ns = "running", entry.recorded_at
        elif isinstance(ev, TokensStaged | GenerationFinished | GenerationFailed):
            n = notes.get(ev.rollout_id) or _orphan(notes, ev.rollout_id)
            if isinstance(ev, TokensStaged):
                n.rows += 1
                n.tokens += ev.token_count
            elif isinstance(ev, GenerationFinished):
                n.worker = "finished"
                if n.started_ns is not None:
                    n.latency_ns = entry.recorded_at - n.started_ns
            else:
                n.worker = "failed"
    attempts = [
        AttemptSummary(
            generation_index=n.index,
            attempt=n.attempt,
            rollout_id=rid,
            verdict=n.verdict or ("rolled back" if n.rolled_back_verdict else "reserved"),
            worker=n.worker,
            rows_staged=n.rows,
            tokens_staged=n.tokens,
            reward=n.reward,
            latency_ns=n.latency_ns,
            stale_rejections=n.stale,
        )
        for rid, n in sorted(notes.items(), key=lambda kv: (kv[1].index, kv[1].attempt))
    ]
    return GroupSummary(
        group_id=group_id,
        agent_name=reserved.agent_name if reserved else None,
        task_name=reserved.prompt_ref.task_name if reserved else None,
        granularity=reserved.granularity if reserved else None,
        expected_generations=reserved.expected_generations if reserved else None,
        fate=fate,  # type: ignore[arg-type]
        records=records,
        rolled_back_records=rolled,
        attempts=attempts,
    )


def _orphan(notes: dict[str, _AttemptNotes], rollout_id: str) -> _AttemptNotes:
    """Worker records of an attempt no ledger event named: place it by its rollout id."""
    match = _ROLLOUT.match(rollout_id)
    index = int(match["index"]) if match else -1
    attempt = int(match["attempt"] or 0) if match else 0
    found = notes[rollout_id] = _AttemptNotes(index, attempt)
    return found


# -- recovery statistics per agent and task ---------------------------------------------------

Key = tuple[str | None, str | None]
"""(agent_name, task_name) of a group, as its GroupReserved recorded them."""

UNKNOWN_KEY: Key = ("?", "?")
"""Where records of a group no GroupReserved names are counted."""


@dataclass
class KeyStats:
    """The counters of one (agent, task)."""

    groups: int = 0
    """Groups reserved (effective reservations)."""
    finalized: int = 0
    discarded: int = 0
    attempts: int = 0
    """Attempts dispatched to workers, rolled back or not (each was real work)."""
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


@dataclass
class _Attempt:
    group_id: str
    index: int
    rows: int = 0
    tokens: int = 0
    started_ns: int | None = None
    sealed: bool = False
    dead: bool = False


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


def _settle(stats: KeyStats, attempt: _Attempt, kept: bool) -> None:
    if kept:
        stats.rows_kept += attempt.rows
        stats.tokens_kept += attempt.tokens
    else:
        stats.rows_discarded += attempt.rows
        stats.tokens_discarded += attempt.tokens


def _on_reserved(state: AuditState, ev: GroupReserved, effective: bool) -> None:
    key = (ev.agent_name, ev.prompt_ref.task_name)
    state.keys[ev.group_id] = key
    if not effective:
        return
    state.stats(key).groups += 1
    # A group id freed by a rolled-back reservation may be reserved again: the attempts of the
    # rolled-back incarnation can no longer be owned by anything.
    for rid in state.orphans.pop(ev.group_id, []):
        attempt = state.attempts.pop(rid, None)
        if attempt is not None:
            _settle(state.stats(key), attempt, kept=False)
    state.groups[ev.group_id] = _Group(
        key,
        current={i: rollout_id_for(ev.group_id, i, 0) for i in range(ev.expected_generations)},
    )


def _on_attempts(
    state: AuditState, ev: SiblingsDispatched | RetryPrepared, effective: bool
) -> None:
    stats = state.stats(state.key_of(ev.group_id))
    for ref in ev.attempts:
        _attempt(state, ev.group_id, ref.generation_index, ref.rollout_id)
    if isinstance(ev, SiblingsDispatched):
        stats.attempts += len(ev.attempts)
    else:
        stats.retries += len(ev.attempts)
        if effective and state.in_restore:
            stats.redispatched_after_restore += len(ev.attempts)
    group = state.groups.get(ev.group_id) if effective else None
    if group is not None:
        for ref in ev.attempts:
            group.current[ref.generation_index] = ref.rollout_id


def _on_abandoned(
    state: AuditState, ev: UnsealedAbandoned | GroupAbandoned, effective: bool
) -> None:
    state.stats(state.key_of(ev.group_id)).abandoned += len(ev.attempts)
    if effective:
        for ref in ev.attempts:
            _attempt(state, ev.group_id, ref.generation_index, ref.rollout_id).dead = True


def _on_failed(state: AuditState, ev: AttemptFailed, effective: bool) -> None:
    state.stats(state.key_of(ev.group_id)).failed += 1
    if effective:
        _attempt(state, ev.group_id, ev.generation_index, ev.rollout_id).dead = True


def _on_sealed(state: AuditState, ev: SiblingSealed | GroupSealed, effective: bool) -> None:
    if not effective:
        return
    group = state.groups.get(ev.group_id)
    results = (
        [(ev.generation_index, ev.rollout_id)]
        if isinstance(ev, SiblingSealed)
        else [(r.generation_index, r.rollout_id) for r in ev.results]
    )
    for index, rid in results:
        _attempt(state, ev.group_id, index, rid).sealed = True
        if group is not None:
            group.sealed[index] = rid


def _on_stale(state: AuditState, ev: StaleResultRejected, effective: bool) -> None:
    state.stats(state.key_of(ev.group_id)).stale_rejected += 1


def _on_left(state: AuditState, ev: GroupFinalized | GroupDiscarded, effective: bool) -> None:
    if not effective:
        return
    stats = state.stats(state.key_of(ev.group_id))
    finalized = isinstance(ev, GroupFinalized)
    if finalized:
        stats.finalized += 1
    else:
        stats.discarded += 1
    group = state.groups.pop(ev.group_id, None)
    if group is None:
        return
    for rid in group.attempts:
        attempt = state.attempts.pop(rid, None)
        if attempt is not None:
            _settle(stats, attempt, kept=finalized and attempt.sealed and not attempt.dead)


def _on_restore_started(state: AuditState, ev: RestoreStarted, effective: bool) -> None:
    state.restores += 1
    state.in_restore = True
    # Every record since the checkpoint is rolled back, so these groups are as it saw them.
    for group in state.groups.values():
        state.stats(group.key).reused_after_restore += len(group.sealed)


def _on_restore_completed(state: AuditState, ev: RestoreCompleted, effective: bool) -> None:
    state.in_restore = False


def _on_checkpoint(state: AuditState, ev: CheckpointCommitted, effective: bool) -> None:
    state.checkpoints += effective


_HANDLERS: dict[type[Event], Callable[[AuditState, Any, bool], None]] = {
    GroupReserved: _on_reserved,
    SiblingsDispatched: _on_attempts,
    RetryPrepared: _on_attempts,
    UnsealedAbandoned: _on_abandoned,
    GroupAbandoned: _on_abandoned,
    AttemptFailed: _on_failed,
    SiblingSealed: _on_sealed,
    GroupSealed: _on_sealed,
    StaleResultRejected: _on_stale,
    GroupFinalized: _on_left,
    GroupDiscarded: _on_left,
    RestoreStarted: _on_restore_started,
    RestoreCompleted: _on_restore_completed,
    CheckpointCommitted: _on_checkpoint,
}


def fold_audit(state: AuditState, record: AuditRecord) -> AuditState:
    """Count one record into the statistics (records must come in seq order)."""
    ev = record.event
    effective = record.seq not in state.skipped
    state.records += 1
    state.rolled_back_records += not effective
    handler = _HANDLERS.get(type(ev))
    if handler is not None:
        handler(state, ev, effective)
    elif isinstance(ev, GenerationStarted):
        attempt = _attempt(state, ev.group_id, ev.generation_index, ev.rollout_id)
        attempt.started_ns = record.recorded_at
    elif isinstance(ev, TokensStaged | GenerationFinished):
        _worker_record(state, ev, record.recorded_at)
    return state


def _worker_record(state: AuditState, ev: TokensStaged | GenerationFinished, at: int) -> None:
    attempt = state.attempts.get(ev.rollout_id)
    group_id = attempt.group_id if attempt else group_of_rollout(ev.rollout_id)
    stats = state.stats(state.key_of(group_id))
    if isinstance(ev, TokensStaged):
        stats.rows_staged += 1
        stats.tokens_staged += ev.token_count
        if attempt is not None:
            attempt.rows += 1
            attempt.tokens += ev.token_count
        else:  # its group already left the ledger: nothing can own this row any more
            stats.rows_discarded += 1
            stats.tokens_discarded += ev.token_count
    elif attempt is not None and attempt.started_ns is not None:
        stats.latencies_ns.append(at - attempt.started_ns)


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
    attempts: int
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


class AuditReport(msgspec.Struct, frozen=True, kw_only=True):
    records: int
    rolled_back_records: int
    restores: int
    checkpoints: int
    by_agent_task: list[KeyReport]
    total: KeyReport


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
    )


def _copy(stats: KeyStats) -> KeyStats:
    copied = KeyStats(**{name: getattr(stats, name) for name in _COUNTERS})
    copied.latencies_ns = list(stats.latencies_ns)
    return copied


def audit(records: Iterable[AuditRecord], skipped: RolledBack) -> AuditReport:
    """Fold every record (in seq order) and report: the whole statistics in one call."""
    state = AuditState(skipped=skipped)
    for record in records:
        fold_audit(state, record)
    return report(state)
