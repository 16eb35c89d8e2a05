"""Recovery statistics per agent and task: "how much work did recovery cost?".

Folded record by record (`fold_audit`, records in seq order), then `report`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any

import msgspec

from eventlog.events import Event
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
from projections.audit import AuditRecord, group_of_rollout
from projections.history import RolledBack

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
