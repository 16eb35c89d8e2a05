"""The acknowledgement outbox: which sealed results are owed an acknowledgement, and which the
receiver has accepted, folded from the `outbox` stream and the seals.

An acknowledgement is owed for every seal that counts (not rolled back) and is pending until
an `AcknowledgementDelivered` names its key. Outbox records themselves are never rolled back:
a send already happened whatever a restore does to the run, so a delivery recorded after the
checkpoint a restore went back to still counts, and a pending record stays the result's one
pending record. What a restore does change is whether the seal counts: an acknowledgement
whose seal was rolled back is not sent (its sibling reruns as a new result, with a key of
its own).
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass, field

from eventlog.events import Event
from eventlog.recovery.vocabulary import (
    AcknowledgementDelivered,
    AcknowledgementPending,
    GroupSealed,
    SiblingSealed,
)
from projections.history import RecordLike


@dataclass
class OutboxState:
    """Pending acknowledgements by key (with their record's seq) and delivered keys."""

    pending: dict[str, tuple[int, AcknowledgementPending]] = field(default_factory=dict)
    delivered: dict[str, int] = field(default_factory=dict)
    """key -> seq of its AcknowledgementDelivered."""
    rollout_ids: set[str] = field(default_factory=set)
    """Results that already have a pending record."""


def fold_outbox(state: OutboxState, seq: int, event: Event) -> None:
    """Apply one outbox record (rolled back or not: see the module docstring)."""
    if isinstance(event, AcknowledgementPending):
        if event.key not in state.pending:  # the first pending record of a key is its record
            state.pending[event.key] = (seq, event)
            state.rollout_ids.add(event.rollout_id)
    elif isinstance(event, AcknowledgementDelivered):
        state.delivered.setdefault(event.key, seq)


def undelivered(
    state: OutboxState, skipped: Container[int]
) -> list[tuple[int, AcknowledgementPending]]:
    """Pending acknowledgements to send now, in pending order: not delivered, and their seal
    not rolled back (`skipped`: the rolled-back seqs)."""
    return sorted(
        (seq, pending)
        for key, (seq, pending) in state.pending.items()
        if key not in state.delivered and pending.sealed_seq not in skipped
    )


@dataclass(frozen=True)
class Sealed:
    """One sealed result as a seal record states it."""

    seq: int
    group_id: str
    generation_index: int
    rollout_id: str
    reward: float
    mask_sample: bool


def sealed_results(records: Iterable[RecordLike], skipped: Container[int]) -> list[Sealed]:
    """Every result a seal that counts accepted (`SiblingSealed`, each of a `GroupSealed`)."""
    found: list[Sealed] = []
    for rec in records:
        if rec.seq in skipped:
            continue
        ev = rec.event
        if isinstance(ev, SiblingSealed):
            found.append(
                Sealed(
                    rec.seq,
                    ev.group_id,
                    ev.generation_index,
                    ev.rollout_id,
                    ev.reward,
                    ev.mask_sample,
                )
            )
        elif isinstance(ev, GroupSealed):
            found.extend(
                Sealed(
                    rec.seq,
                    ev.group_id,
                    r.generation_index,
                    r.rollout_id,
                    r.reward,
                    r.mask_sample,
                )
                for r in ev.results
            )
    return found
