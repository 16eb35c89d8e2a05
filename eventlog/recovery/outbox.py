"""Exactly-once acknowledgement of sealed results to the agent environment that produced them.

The outbox is recorded as events on the `outbox` stream: `AcknowledgementPending` once a
result is sealed, `AcknowledgementDelivered` once the receiver accepted it. The steps are

    seal (ledger)  ->  record pending  ->  send (receiver, told the key)  ->  record delivered

and a crash can fall between any two. After a restart (or a restore) `record_seals` adds the
pending records a crash left out, and `deliver` sends only what is not recorded as delivered.
The one window left, a crash after the send and before its delivery record, re-sends that
acknowledgement once; the receiver is told an idempotency key (`log id/rollout id`, one per
result) so it applies each key once. Exactly once = at-least-once sending + the key.

Event ids are derived from the key, so two processes recording the same pending or delivery
append it once (the log recognises a retry).
"""

from __future__ import annotations

import logging
import uuid
from typing import Protocol

from eventlog.log import EventLog
from eventlog.records import ANY, Proposed
from eventlog.recovery.vocabulary import (
    CONTROLLER_STREAM,
    OUTBOX_STREAM,
    AcknowledgementDelivered,
    AcknowledgementPending,
    GroupSealed,
    SiblingSealed,
)
from projections.history import RolledBack, rolled_back
from projections.outbox import OutboxState, fold_outbox, sealed_results, undelivered

logger = logging.getLogger(__name__)

_IDS = uuid.UUID("6f9b1f0e-5a43-4f43-9d55-0c7d1b0a0c6b")
"""Namespace of the outbox's derived event ids."""


class AckReceiver(Protocol):
    """The agent environment's side: accepts one acknowledgement per key.

    `acknowledge` returns once the receiver has durably accepted it, and raises otherwise (the
    acknowledgement stays pending and is sent again). A key it has seen before must be a
    no-op: after a crash between the send and its delivery record the outbox sends it again.
    """

    def acknowledge(self, key: str, ack: AcknowledgementPending) -> None: ...


class Outbox:
    """Records, sends and confirms acknowledgements of sealed results; see the module doc."""

    def __init__(self, log: EventLog, receiver: AckReceiver) -> None:
        self.log = log
        self.receiver = receiver
        self._log_id = log.info()["log_id"]
        self._scanned = 0
        """Seals up to this seq already have their pending records (scans start after it)."""
        self._state = OutboxState()
        self._next_version = 0
        """The outbox stream is folded incrementally: each call reads only what is new."""
        self._controller_version: int | None = None
        self._skipped = RolledBack()

    def key(self, rollout_id: str) -> str:
        """The idempotency key of one result: unique across runs and logs."""
        return f"{self._log_id}/{rollout_id}"

    def record_seals(self) -> list[AcknowledgementPending]:
        """Record a pending acknowledgement for every seal that counts and has none yet.

        Call it after sealing, and after a restart or restore (a crash may have fallen
        between a seal and its pending record). Returns what it recorded.
        """
        state, skipped = self._refresh()
        head = self.log.head()
        records = self.log.read(
            self._scanned + 1, head, types=[SiblingSealed.__name__, GroupSealed.__name__]
        )
        seals = sealed_results(records, skipped)
        new = [
            AcknowledgementPending(
                key=self.key(s.rollout_id),
                group_id=s.group_id,
                generation_index=s.generation_index,
                rollout_id=s.rollout_id,
                reward=s.reward,
                mask_sample=s.mask_sample,
                sealed_seq=s.seq,
            )
            for s in seals
            if s.rollout_id not in state.rollout_ids
        ]
        if new:
            proposed = [Proposed(p, _event_id(p.key, "pending")) for p in new]
            self.log.append(OUTBOX_STREAM, proposed, ANY)
        self._scanned = head
        return new

    def pending(self) -> list[AcknowledgementPending]:
        """Acknowledgements owed and not recorded as delivered (their seals count)."""
        state, skipped = self._refresh()
        return [p for _, p in undelivered(state, skipped)]

    def deliver(self) -> list[str]:
        """Send every pending acknowledgement, recording each delivery right after its send.

        Returns the keys delivered. A receiver that raises stops the round: what it did not
        accept stays pending for the next `deliver`.
        """
        state, skipped = self._refresh()
        sent: list[str] = []
        for seq, pending in undelivered(state, skipped):
            self.receiver.acknowledge(pending.key, pending)
            delivered = AcknowledgementDelivered(key=pending.key, pending_seq=seq)
            event_id = _event_id(pending.key, "delivered")
            self.log.append(OUTBOX_STREAM, [Proposed(delivered, event_id)], ANY)
            sent.append(pending.key)
        return sent

    def _refresh(self) -> tuple[OutboxState, RolledBack]:
        """The outbox folded up to the log's present, and the rolled-back seqs (re-read only
        when the controller stream changed: a restore adds a range)."""
        for rec in self.log.read_stream(OUTBOX_STREAM, self._next_version):
            fold_outbox(self._state, rec.seq, rec.event)
            self._next_version = rec.version + 1
        version = self.log.stream_version(CONTROLLER_STREAM)
        if version != self._controller_version:
            self._skipped = rolled_back(self.log.read_stream(CONTROLLER_STREAM))
            self._controller_version = version
        return self._state, self._skipped


def _event_id(key: str, step: str) -> uuid.UUID:
    return uuid.uuid5(_IDS, f"{key}/{step}")
