"""The events a failure, a retry or a restart implies for a group, by its stored granularity.

Pure functions of a group's state, so the ledger's live commands and its restore produce the
same facts, and a test can ask what would happen without a log.
"""

from __future__ import annotations

from eventlog.events import (
    AttemptRef,
    Event,
    GroupAbandoned,
    RetryPrepared,
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


def retry_events(group: GroupState) -> list[Event]:
    """Mint the next attempt for every sibling whose current attempt failed or was abandoned."""
    if group.status != "generating":
        return []
    refs = [
        AttemptRef(
            generation_index=s.generation_index,
            attempt=s.current.attempt + 1,
            rollout_id=rollout_id_for(group.group_id, s.generation_index, s.current.attempt + 1),
        )
        for s in group.siblings
        if s.current.status in ("failed", "abandoned")
    ]
    if not refs:
        return []
    return [RetryPrepared(group_id=group.group_id, attempts=refs)]


def restart_events(group: GroupState, reason: str = "restore") -> list[Event]:
    """What a restart does to a group: abandon what was in flight, then mint its retries.

    A fully sealed group (ready to finalize) is kept as it is under both granularities.
    """
    abandon = abandon_events(group, reason)
    scratch = fold_all(LedgerState(groups={group.group_id: group}), abandon)
    return [*abandon, *retry_events(scratch.groups[group.group_id])]
