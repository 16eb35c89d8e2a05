"""One group's timeline and its summary: "what happened to group G?"."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import msgspec

from eventlog.events import Event
from eventlog.recovery.vocabulary import (
    AttemptFailed,
    AttemptRef,
    GenerationFailed,
    GenerationFinished,
    GenerationStarted,
    GroupAbandoned,
    GroupDiscarded,
    GroupFinalized,
    GroupReserved,
    GroupSealed,
    RetryPrepared,
    SiblingsDispatched,
    SiblingSealed,
    StaleResultRejected,
    TokensStaged,
    UnsealedAbandoned,
    parse_rollout_id,
)
from projections.audit import AuditRecord
from projections.history import RolledBack


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
            parsed = parse_rollout_id(ev.rollout_id)
            note(ev.rollout_id, ev.generation_index, parsed.attempt if parsed else 0).stale += 1
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
    parsed = parse_rollout_id(rollout_id)
    index, attempt = (parsed.generation_index, parsed.attempt) if parsed else (-1, 0)
    found = notes[rollout_id] = _AttemptNotes(index, attempt)
    return found
