"""What `eventlog demo` proves, read back from the log alone (nothing from the controller).

For every restore: the counts it recorded (RestoreCompleted) equal what the log says was
sealed at its checkpoint; every sibling sealed there keeps its result (never dispatched or
sealed again); exactly the missing siblings are dispatched afterwards. For the whole run: no
group is finalized or trained twice, every group of every step trains once, each seal carries
the reward its attempt reported, nothing is left unfinished, and the hash chain verifies.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from eventlog.log import EventLog
from eventlog.records import RecordedEvent
from eventlog.recovery.vocabulary import (
    CONTROLLER_STREAM,
    AttemptFailed,
    GenerationFailed,
    GenerationFinished,
    GenerationStarted,
    GroupAbandoned,
    GroupAdmitted,
    GroupDiscarded,
    GroupFinalized,
    GroupSealed,
    ReplayConsumed,
    RestoreCompleted,
    RetryPrepared,
    SealResult,
    SiblingsDispatched,
    SiblingSealed,
    UnsealedAbandoned,
)
from projections.history import RolledBack, rebuild, rolled_back
from projections.siblings import LedgerState


@dataclass
class RestoreCheck:
    """One restore: what it recorded, and what the log says it should have recorded."""

    seq: int
    checkpoint_step: int
    checkpoint_seq: int
    rolled_back: tuple[int, int]
    recorded: dict[str, int]
    """RestoreCompleted's counts: groups_restored, siblings_reused, siblings_redispatched,
    rows_cleared."""
    sealed_at_checkpoint: dict[str, list[int]]
    missing_at_checkpoint: dict[str, list[int]]
    redispatched_after: dict[str, list[int]]
    """Per group, the generation indices of the first dispatch after the restore."""
    seals_rolled_back: int
    """Sibling results sealed after the checkpoint and rolled back by this restore."""


@dataclass
class DemoCheck:
    records: int
    head: int
    chain: str
    verified: bool
    types: Counter[str]
    groups_expected: int
    groups_trained: int
    steps_trained: list[int]
    finalized_records: int
    """GroupFinalized records, rolled-back ones included."""
    finalized_rolled_back: int
    effective_seals: int
    attempts_started: int
    attempts_failed: int
    attempts_cut_off: int
    """Attempts with GenerationStarted and no outcome: killed workers, the killed controller."""
    retries: int
    abandoned: int
    stale_rejected: int
    restores: list[RestoreCheck]
    first_ns: int
    last_ns: int
    peak_per_s: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _seal_results(record: RecordedEvent) -> list[tuple[str, SealResult]]:
    event = record.event
    if isinstance(event, GroupSealed):
        return [(event.group_id, r) for r in event.results]
    if isinstance(event, SiblingSealed):
        result = SealResult(
            generation_index=event.generation_index,
            attempt=event.attempt,
            rollout_id=event.rollout_id,
            receipt=event.receipt,
            reward=event.reward,
            mask_sample=event.mask_sample,
        )
        return [(event.group_id, result)]
    return []


def _state_until(records: Sequence[RecordedEvent], seq: int, skipped: RolledBack) -> LedgerState:
    return rebuild((r for r in records if r.seq <= seq), skipped)


def _check_restore(
    records: Sequence[RecordedEvent],
    controller: Sequence[RecordedEvent],
    completed: RecordedEvent,
    skipped: RolledBack,
    problems: list[str],
) -> RestoreCheck:
    event = completed.event
    assert isinstance(event, RestoreCompleted)
    started_seq = event.rolled_back_until_seq + 1
    before = rolled_back(r for r in controller if r.seq < started_seq)
    state = _state_until(records, event.checkpoint_seq, before)
    sealed: dict[str, list[int]] = {}
    missing: dict[str, list[int]] = {}
    for group in state.groups.values():
        done = group.indices("sealed")
        if group.granularity == "prompt_group" and group.status == "generating":
            done = []  # a prompt_group group reruns whole unless every sibling was sealed
        sealed[group.group_id] = done
        missing[group.group_id] = [
            s.generation_index for s in group.siblings if s.generation_index not in done
        ]
    where = f"restore at seq {completed.seq} (checkpoint step {event.checkpoint_step})"
    expected = {
        "groups_restored": len(state.groups),
        "siblings_reused": sum(map(len, sealed.values())),
        "siblings_redispatched": sum(map(len, missing.values())),
    }
    recorded = {
        "groups_restored": event.groups_restored,
        "siblings_reused": event.siblings_reused,
        "siblings_redispatched": event.siblings_redispatched,
        "rows_cleared": event.rows_cleared,
    }
    for name, value in expected.items():
        if recorded[name] != value:
            problems.append(
                f"{where}: recorded {name}={recorded[name]}, but the log at the checkpoint "
                f"says {value}"
            )

    after = [r for r in records if r.seq > completed.seq and r.seq not in skipped]
    first_dispatch: dict[str, list[int]] = {}
    finalized: set[str] = set()
    for rec in after:
        ev = rec.event
        if isinstance(ev, SiblingsDispatched) and ev.group_id in state.groups:
            indices = [a.generation_index for a in ev.attempts]
            first_dispatch.setdefault(ev.group_id, indices)
            again = sorted(set(indices) & set(sealed[ev.group_id]))
            if again:
                problems.append(
                    f"{where}: group {ev.group_id!r} siblings {again} were sealed at the "
                    f"checkpoint but dispatched again at seq {rec.seq}"
                )
        if isinstance(ev, GroupFinalized):
            finalized.add(ev.group_id)
        for gid, result in _seal_results(rec):
            if gid in sealed and result.generation_index in sealed[gid]:
                problems.append(
                    f"{where}: group {gid!r} sibling {result.generation_index} was sealed at "
                    f"the checkpoint but sealed again at seq {rec.seq}"
                )
    for gid, indices in missing.items():
        got = sorted(first_dispatch.get(gid, []))
        if got != sorted(indices):
            problems.append(
                f"{where}: group {gid!r} should redispatch siblings {indices}, its first "
                f"dispatch after the restore was {got}"
            )
    for gid, indices in sealed.items():
        if indices and gid not in finalized:
            problems.append(
                f"{where}: group {gid!r} had siblings {indices} sealed at the checkpoint but "
                "was never finalized after the restore (sealed siblings lost)"
            )
    # Which records this restore rolled back, by the one rule (its RestoreStarted record).
    this_restore = rolled_back(r for r in controller if r.seq == started_seq)
    recorded_range = (event.rolled_back_from_seq, event.rolled_back_until_seq)
    if this_restore.ranges != (recorded_range,):
        problems.append(
            f"{where}: RestoreCompleted records rolled-back seqs {recorded_range}, its "
            f"RestoreStarted at seq {started_seq} marks {list(this_restore.ranges)}"
        )
    seals_rolled_back = sum(len(_seal_results(r)) for r in records if r.seq in this_restore)
    return RestoreCheck(
        seq=completed.seq,
        checkpoint_step=event.checkpoint_step,
        checkpoint_seq=event.checkpoint_seq,
        rolled_back=(event.rolled_back_from_seq, event.rolled_back_until_seq),
        recorded=recorded,
        sealed_at_checkpoint={g: i for g, i in sealed.items() if i},
        missing_at_checkpoint={g: i for g, i in missing.items() if i},
        redispatched_after=first_dispatch,
        seals_rolled_back=seals_rolled_back,
    )


def _peak_per_second(records: Iterable[RecordedEvent]) -> int:
    buckets = Counter(r.recorded_at // 1_000_000_000 for r in records)
    return max(buckets.values(), default=0)


def check_run(
    log: EventLog, *, steps: int, groups_per_step: int, expect_restore: bool = True
) -> DemoCheck:
    """Read the whole log back and check the run's invariants (small logs: held in memory)."""
    records = list(log.read())
    problems: list[str] = []
    controller = [r for r in records if r.stream == CONTROLLER_STREAM]
    skipped = rolled_back(controller)
    effective = [r for r in records if r.seq not in skipped]

    report = log.verify()
    if not report.ok:
        problems += [f"verify: seq {p.seq}: {p.kind}: {p.message}" for p in report.problems]

    step_of: dict[str, int | None] = {}
    finalized: Counter[str] = Counter()
    consumed: dict[str, list[int]] = {}
    discarded: set[str] = set()
    for rec in effective:
        ev = rec.event
        if isinstance(ev, GroupAdmitted):
            step_of[ev.group_id] = ev.target_step
        elif isinstance(ev, GroupFinalized):
            finalized[ev.group_id] += 1
        elif isinstance(ev, ReplayConsumed):
            for gid in ev.group_ids:
                consumed.setdefault(gid, []).append(ev.step)
        elif isinstance(ev, GroupDiscarded):
            discarded.add(ev.group_id)
    for gid, count in sorted(finalized.items()):
        if count > 1:
            problems.append(f"group {gid!r} was finalized {count} times")
    for gid, at in sorted(consumed.items()):
        if len(at) > 1:
            problems.append(f"group {gid!r} was trained {len(at)} times (steps {at})")
        elif at[0] != step_of.get(gid):
            problems.append(
                f"group {gid!r} was admitted for step {step_of.get(gid)}, trained at {at[0]}"
            )
    trained_steps = Counter(at[0] for at in consumed.values())
    for step in range(1, steps + 1):
        dropped = sum(1 for g in discarded if step_of.get(g) == step)
        if trained_steps.get(step, 0) + dropped != groups_per_step:
            problems.append(
                f"step {step}: {trained_steps.get(step, 0)} groups trained and {dropped} "
                f"discarded, expected {groups_per_step} in all"
            )
    final = rebuild(records, skipped)
    if final.groups or final.replay:
        problems.append(
            f"the run ended with groups still owned: ledger {sorted(final.groups)}, replay "
            f"{sorted(final.replay)}"
        )

    finished = {
        r.event.rollout_id: r.event for r in records if isinstance(r.event, GenerationFinished)
    }
    seals = [pair for r in effective for pair in _seal_results(r)]
    for gid, result in seals:
        outcome = finished.get(result.rollout_id)
        if outcome is None:
            problems.append(f"group {gid!r}: sealed {result.rollout_id!r} never finished")
        elif outcome.reward != result.reward or (
            result.receipt is not None and result.receipt.staging_keys != outcome.staging_keys
        ):
            problems.append(
                f"group {gid!r}: seal of {result.rollout_id!r} (reward {result.reward}) differs "
                f"from its GenerationFinished (reward {outcome.reward})"
            )

    restores = [
        _check_restore(records, controller, r, skipped, problems)
        for r in controller
        if isinstance(r.event, RestoreCompleted)
    ]
    if expect_restore and not restores:
        problems.append("the log holds no restore: the controller was never restarted")

    ended = {
        r.event.rollout_id
        for r in records
        if isinstance(r.event, GenerationFinished | GenerationFailed)
    }
    started = [r.event for r in records if isinstance(r.event, GenerationStarted)]
    types = Counter(r.type for r in records)
    return DemoCheck(
        records=len(records),
        head=report.head,
        chain=report.last_chain,
        verified=report.ok,
        types=types,
        groups_expected=steps * groups_per_step,
        groups_trained=len(consumed),
        steps_trained=sorted(trained_steps),
        finalized_records=types["GroupFinalized"],
        finalized_rolled_back=sum(
            1 for r in records if r.seq in skipped and isinstance(r.event, GroupFinalized)
        ),
        effective_seals=len(seals),
        attempts_started=len(started),
        attempts_failed=sum(1 for r in effective if isinstance(r.event, AttemptFailed)),
        attempts_cut_off=sum(1 for e in started if e.rollout_id not in ended),
        retries=sum(len(r.event.attempts) for r in effective if isinstance(r.event, RetryPrepared)),
        abandoned=sum(
            len(r.event.attempts)
            for r in effective
            if isinstance(r.event, UnsealedAbandoned | GroupAbandoned)
        ),
        stale_rejected=types["StaleResultRejected"],
        restores=restores,
        first_ns=records[0].recorded_at if records else 0,
        last_ns=records[-1].recorded_at if records else 0,
        peak_per_s=_peak_per_second(records),
        problems=problems,
    )


__all__ = ["DemoCheck", "RestoreCheck", "check_run"]
