"""What the audit folds share: the record they read, the types they decode, rollout ids.

Two questions people ask of a run: "what happened to group G?" (`projections.audit_view`)
and "how much work did recovery cost, per agent and task?" (`projections.audit_stats`).

Rolled-back records (projections.history) are facts about work that physically happened:
dispatches, worker runs, staged rows, failures and rejected late results count wherever they
are. What the ledger *kept* (seals, which siblings a restore reused, which staged rows ended
up owned by a sealed attempt) follows the effective history only, as a rebuild sees it.

Pure: no I/O, no clock; the rolled-back ranges are given up front (read the controller stream
first, as the ledger does), so one pass in seq order suffices.
"""

from __future__ import annotations

from typing import Protocol

from eventlog.events import Event
from eventlog.recovery.vocabulary import (
    AttemptFailed,
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
    parse_rollout_id,
)


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


def group_of_rollout(rollout_id: str) -> str | None:
    """The group id a rollout id names (`{group}_g{i}` or `{group}_g{i}-a{n}`), if it parses."""
    parsed = parse_rollout_id(rollout_id)
    return parsed.group_id if parsed else None
