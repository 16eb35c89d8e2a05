"""The auditor's view of one prompt group: which attempt counts for each sibling and why the
others do not, who ran them under which weights, and what became of every staged row.

Folded from every record about the group (its stream, its attempts' streams, the replay
records naming it, the clean-ups of its rows), in seq order. Verdicts follow the effective
history; rolled-back records still show what physically happened (a worker ran, rows were
staged), and an attempt whose only verdict was rolled back says so.

Pure: no I/O, no clock; the rolled-back ranges are given up front.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from eventlog.recovery.vocabulary import (
    AttemptFailed,
    FinalizationStarted,
    GenerationFailed,
    GenerationFinished,
    GenerationStarted,
    GroupAbandoned,
    GroupAdmitted,
    GroupDiscarded,
    GroupFinalized,
    GroupReserved,
    GroupSealed,
    ReplayConsumed,
    ReplayEvicted,
    ReplaySelected,
    RestoreStarted,
    RetryPrepared,
    SealResult,
    SiblingsDispatched,
    SiblingSealed,
    StagingCleared,
    StaleResultRejected,
    TokensStaged,
    UnsealedAbandoned,
    cleared_of_attempts,
)
from projections.audit import AuditRecord
from projections.history import RolledBack

Verdict = Literal["counts", "failed", "abandoned", "rolled back", "in flight", "reserved"]


class StagedRow(msgspec.Struct, frozen=True, kw_only=True):
    """One staged row and what became of it."""

    key: str
    tokens: int
    fate: str
    """`trained in step N`, `finalized, not yet trained`, `kept by the seal`,
    `cleared by seq S`, `discarded with the group`, `rolled back` (staged in records a
    restore rolled back, so not in the data plane it restored), or `not kept`."""


class AttemptView(msgspec.Struct, frozen=True, kw_only=True):
    generation_index: int
    attempt: int
    rollout_id: str
    verdict: Verdict
    why: str
    """What decided the verdict: the seal, the failure's error, the abandon's reason, ..."""
    worker: str | None
    weight_versions: list[int]
    tokens: int
    reward: float | None
    mask_sample: bool | None
    stale_rejections: int
    rows: list[StagedRow]


class Incarnation(msgspec.Struct, frozen=True, kw_only=True):
    """Another group reserved for the same prompt (before or after a rollback)."""

    group_id: str
    reserved_seq: int
    rolled_back: bool


class GroupView(msgspec.Struct, frozen=True, kw_only=True):
    group_id: str
    agent_name: str | None
    task_name: str | None
    sample_id: str | None
    prompt_id: str | None
    granularity: str | None
    expected_generations: int | None
    target_step: int | None
    fate: str
    """`trained in step N`, `finalized (seq S), not yet trained`, `evicted untrained`,
    `discarded`, `in the ledger`, `rolled back`, or `unknown`."""
    trained_step: int | None
    finalized_seq: int | None
    records: int
    rolled_back_records: int
    restores: list[int]
    """Seqs of the RestoreStarted records that rolled back some of the group's records."""
    attempts: list[AttemptView]
    earlier: list[Incarnation] = msgspec.field(default_factory=list)
    later: list[Incarnation] = msgspec.field(default_factory=list)


@dataclass
class _Attempt:
    index: int
    attempt: int
    verdict: Verdict | None = None
    why: str = ""
    rolled_back_verdict: str | None = None
    worker: str | None = None
    weights: set[int] = field(default_factory=set)
    keys: dict[str, int] = field(default_factory=dict)
    reward: float | None = None
    mask: bool | None = None
    stale: int = 0
    finished: bool = False
    failed_run: bool = False


def view_group(group_id: str, records: Iterable[AuditRecord], skipped: RolledBack) -> GroupView:
    """Fold every record about the group (in seq order) into the auditor's view."""
    attempts: dict[str, _Attempt] = {}
    reserved: GroupReserved | None = None
    fate = "unknown"
    trained_step: int | None = None
    target_step: int | None = None
    finalized_seq: int | None = None
    cleared: dict[str, int] = {}
    lost: set[str] = set()
    restores: list[int] = []
    total = rolled = 0

    def note(rollout_id: str, index: int | None = None, attempt: int | None = None) -> _Attempt:
        """An attempt by rollout id; records that name its sibling and attempt place it
        (a worker's rows alone do not, until its GenerationStarted is seen)."""
        found = attempts.get(rollout_id)
        if found is None:
            found = attempts[rollout_id] = _Attempt(-1, 0)
        if index is not None:
            found.index = index
        if attempt is not None:
            found.attempt = attempt
        return found

    def decide(a: _Attempt, effective: bool, verdict: Verdict, why: str) -> None:
        if effective:
            a.verdict, a.why, a.rolled_back_verdict = verdict, why, None
        elif a.verdict is None:
            a.rolled_back_verdict = why

    def sealed(result: SiblingSealed | SealResult, effective: bool) -> None:
        a = note(result.rollout_id, result.generation_index, result.attempt)
        decide(a, effective, "counts", "sealed")
        if effective:
            a.reward, a.mask = result.reward, result.mask_sample

    for rec in records:
        ev = rec.event
        effective = rec.seq not in skipped
        if isinstance(ev, RestoreStarted):
            restores.append(rec.seq)
            continue
        for item in cleared_of_attempts(ev):
            cleared.setdefault(item.key, rec.seq)
        if isinstance(ev, StagingCleared):
            continue
        total += 1
        rolled += not effective
        if isinstance(ev, GroupReserved):
            if reserved is None or effective:
                reserved = ev
            if effective:
                fate, target_step = "in the ledger", ev.target_step
            elif fate == "unknown":
                fate = "rolled back"
        elif isinstance(ev, GroupAdmitted) and effective:
            target_step = ev.target_step
        elif isinstance(ev, SiblingsDispatched | RetryPrepared):
            for ref in ev.attempts:
                a = note(ref.rollout_id, ref.generation_index, ref.attempt)
                kind: Verdict = "in flight" if isinstance(ev, SiblingsDispatched) else "reserved"
                decide(a, effective, kind, "dispatched" if kind == "in flight" else "retry")
        elif isinstance(ev, UnsealedAbandoned | GroupAbandoned):
            for ref in ev.attempts:
                a = note(ref.rollout_id, ref.generation_index, ref.attempt)
                decide(a, effective, "abandoned", ev.reason)
        elif isinstance(ev, AttemptFailed):
            decide(
                note(ev.rollout_id, ev.generation_index, ev.attempt), effective, "failed", ev.error
            )
        elif isinstance(ev, SiblingSealed):
            sealed(ev, effective)
        elif isinstance(ev, GroupSealed):
            for result in ev.results:
                sealed(result, effective)
        elif isinstance(ev, StaleResultRejected):
            note(ev.rollout_id, ev.generation_index).stale += 1
        elif isinstance(ev, GenerationStarted):
            a = note(ev.rollout_id, ev.generation_index, ev.attempt)
            a.worker = ev.worker
            a.weights.add(ev.weight_version)
        elif isinstance(ev, TokensStaged):
            a = note(ev.rollout_id)
            a.keys[ev.staging_key] = ev.token_count
            if not effective:
                lost.add(ev.staging_key)
            a.weights.add(ev.weight_version)
        elif isinstance(ev, GenerationFinished):
            note(ev.rollout_id).finished = True
        elif isinstance(ev, GenerationFailed):
            note(ev.rollout_id).failed_run = True
        elif isinstance(ev, GroupFinalized) and effective:
            fate, finalized_seq = f"finalized (seq {rec.seq}), not yet trained", rec.seq
        elif isinstance(ev, GroupDiscarded) and effective:
            fate = "discarded"
        elif isinstance(ev, ReplayConsumed) and effective and group_id in ev.group_ids:
            fate, trained_step = f"trained in step {ev.step}", ev.step
        elif isinstance(ev, ReplayEvicted) and effective and group_id in ev.group_ids:
            fate = "evicted untrained"
        elif isinstance(ev, FinalizationStarted | ReplaySelected):
            pass

    def row_fate(a: _Attempt, key: str) -> str:
        # A counted attempt's rows are cleared only by its finalization (they live on as
        # the canonical rows): its fate is the group's.
        if key in cleared and a.verdict != "counts":
            return f"cleared by seq {cleared[key]}"
        if a.verdict == "counts":
            if trained_step is not None:
                return f"trained in step {trained_step}"
            if finalized_seq is not None:
                return "finalized, not yet trained"
            if fate == "discarded":
                return "discarded with the group"
            return "kept by the seal"
        return "rolled back" if key in lost else "not kept"

    views = []
    for rid, a in sorted(attempts.items(), key=lambda kv: (kv[1].index, kv[1].attempt)):
        verdict: Verdict = a.verdict or ("rolled back" if a.rolled_back_verdict else "reserved")
        why = a.why if a.verdict else (a.rolled_back_verdict or "")
        views.append(
            AttemptView(
                generation_index=a.index,
                attempt=a.attempt,
                rollout_id=rid,
                verdict=verdict,
                why=why,
                worker=a.worker,
                weight_versions=sorted(a.weights),
                tokens=sum(a.keys.values()),
                reward=a.reward,
                mask_sample=a.mask,
                stale_rejections=a.stale,
                rows=[StagedRow(key=k, tokens=t, fate=row_fate(a, k)) for k, t in a.keys.items()],
            )
        )
    return GroupView(
        group_id=group_id,
        agent_name=reserved.agent_name if reserved else None,
        task_name=reserved.prompt_ref.task_name if reserved else None,
        sample_id=reserved.prompt_ref.sample_id if reserved else None,
        prompt_id=reserved.prompt_id if reserved else None,
        granularity=reserved.granularity if reserved else None,
        expected_generations=reserved.expected_generations if reserved else None,
        target_step=target_step,
        fate=fate,
        trained_step=trained_step,
        finalized_seq=finalized_seq,
        records=total,
        rolled_back_records=rolled,
        restores=restores,
        attempts=views,
    )
