"""The events a failure, a retry or a restart implies for a group, by its stored granularity.

Pure functions of a group's state, so the ledger's live commands and its restore produce the
same facts, and a test can ask what would happen without a log.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from eventlog.events import Event
from eventlog.recovery.vocabulary import (
    AttemptRef,
    GroupAbandoned,
    RetryPrepared,
    SiblingsDispatched,
    UnsealedAbandoned,
    rollout_id_for,
)
from projections.siblings import AttemptState, GroupState, LedgerState, fold_all


def attempt_ref(generation_index: int, attempt: AttemptState) -> AttemptRef:
    return AttemptRef(
        generation_index=generation_index, attempt=attempt.attempt, rollout_id=attempt.rollout_id
    )


def abandon_events(group: GroupState, reason: str) -> list[Event]:
    """Give up in-flight work: `sibling` abandons unsealed dispatched attempts only;
    `prompt_group` abandons every sibling once any attempt was dispatched or failed."""
    if group.status != "generating":
        return []
    if group.granularity == "sibling":
        refs = [
            attempt_ref(s.generation_index, s.current)
            for s in group.siblings
            if s.current.status == "dispatched"
        ]
        if not refs:
            return []
        return [UnsealedAbandoned(group_id=group.group_id, attempts=refs, reason=reason)]
    if not group.indices("dispatched", "failed"):
        return []
    refs = [attempt_ref(s.generation_index, s.current) for s in group.siblings]
    return [GroupAbandoned(group_id=group.group_id, attempts=refs, reason=reason)]


def _retry_ref(group_id: str, generation_index: int, attempt: int) -> AttemptRef:
    return AttemptRef(
        generation_index=generation_index,
        attempt=attempt,
        rollout_id=rollout_id_for(group_id, generation_index, attempt),
    )


def retry_events(group: GroupState, floor: Mapping[int, int] | None = None) -> list[Event]:
    """Mint the next attempt for every sibling whose current attempt failed or was abandoned.

    The next number is one above the current attempt, or above `floor[index]` (the highest
    number the log ever used for that sibling) when that is higher. Under `prompt_group`
    every sibling reruns as one attempt number.
    """
    if group.status != "generating":
        return []
    floor = floor or {}
    pending = [s for s in group.siblings if s.current.status in ("failed", "abandoned")]
    if not pending:
        return []

    def above(index: int, current: int) -> int:
        return max(current, floor.get(index, current)) + 1

    if group.granularity == "prompt_group":
        number = max(above(s.generation_index, s.current.attempt) for s in group.siblings)
        refs = [_retry_ref(group.group_id, s.generation_index, number) for s in pending]
    else:
        refs = [
            _retry_ref(
                group.group_id, s.generation_index, above(s.generation_index, s.current.attempt)
            )
            for s in pending
        ]
    return [RetryPrepared(group_id=group.group_id, attempts=refs)]


class AttemptsUsed(msgspec.Struct, frozen=True, kw_only=True):
    """The highest attempt numbers one sibling's history (rolled back or not) ever used."""

    minted: int = 0
    dispatched: int = -1


def attempts_used(events: Iterable[Event]) -> dict[int, AttemptsUsed]:
    """Per generation index, from every record of one group stream, rolled-back ones included."""
    used: dict[int, AttemptsUsed] = {}
    for event in events:
        if isinstance(event, RetryPrepared | SiblingsDispatched):
            for ref in event.attempts:
                seen = used.get(ref.generation_index, AttemptsUsed())
                if isinstance(event, RetryPrepared):
                    seen = msgspec.structs.replace(seen, minted=max(seen.minted, ref.attempt))
                else:
                    seen = msgspec.structs.replace(
                        seen, dispatched=max(seen.dispatched, ref.attempt)
                    )
                used[ref.generation_index] = seen
    return used


def _needs_new_attempt(current: AttemptState, used: AttemptsUsed) -> bool:
    if current.status == "sealed":
        return False
    if current.status != "reserved":
        return True  # in flight at the checkpoint, or already failed/abandoned
    # Reserved at the checkpoint, but rolled-back history dispatched it or minted past it: a
    # worker may have run under this rollout id, so it must not be handed out again.
    return used.dispatched >= current.attempt or used.minted > current.attempt


def restart_events(
    group: GroupState, used: Mapping[int, AttemptsUsed] | None = None, reason: str = "restore"
) -> list[Event]:
    """What a restart does to a group, by its stored granularity.

    Attempts in flight at the checkpoint are abandoned and retried under a fresh number above
    anything the log ever used (`used`, from the group's whole stream); `sibling` keeps every
    sealed sibling, `prompt_group` reruns every sibling of a group that is not fully sealed.
    A fully sealed group is kept as it is under both granularities.
    """
    if group.status != "generating":
        return []
    used = used or {}
    stale = [
        s
        for s in group.siblings
        if _needs_new_attempt(s.current, used.get(s.generation_index, AttemptsUsed()))
    ]
    if not stale:
        return []
    if group.granularity == "prompt_group":
        stale = list(group.siblings)
        abandon: list[Event] = [
            GroupAbandoned(
                group_id=group.group_id,
                attempts=[attempt_ref(s.generation_index, s.current) for s in stale],
                reason=reason,
            )
        ]
    else:
        refs = [
            attempt_ref(s.generation_index, s.current)
            for s in stale
            if s.current.status in ("reserved", "dispatched")
        ]
        abandon = (
            [UnsealedAbandoned(group_id=group.group_id, attempts=refs, reason=reason)]
            if refs
            else []
        )
    scratch = fold_all(LedgerState(groups={group.group_id: group}), abandon)
    floor = {i: u.minted for i, u in used.items()}
    return [*abandon, *retry_events(scratch.groups[group.group_id], floor)]
