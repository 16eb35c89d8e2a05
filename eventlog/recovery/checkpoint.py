"""Checkpoints and the state at a log position: snapshots, folding, and the row check.

A checkpoint is taken inside the barrier's exclusive section, so the ledger state, the data
plane's own checkpoint and the log position are one consistent cut. The projection snapshot
stored at the CheckpointCommitted seq lets a restore skip replaying the whole run; if it is
missing (a crash right after the append) or unreadable, folding the log gives the same state,
which the checkpoint's ledger digest then confirms.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import msgspec

from eventlog.dataplane.protocol import DataPlane
from eventlog.errors import InvalidEventError
from eventlog.log import EventLog
from eventlog.recovery.errors import LedgerRuleError, ReconciliationError
from eventlog.recovery.vocabulary import CheckpointCommitted
from projections.history import RolledBack
from projections.reconcile import referenced_keys
from projections.siblings import LedgerState, RuleViolation, fold, state_digest

logger = logging.getLogger(__name__)

SNAPSHOT_NAME = "recovery-ledger"


class Snapshot(msgspec.Struct, kw_only=True):
    """A snapshot payload: the state and the stream versions it was folded from."""

    state: LedgerState
    versions: dict[str, int]


_SNAPSHOT_DECODER = msgspec.msgpack.Decoder(Snapshot)


def _usable_snapshot(
    log: EventLog, until_seq: int, skipped: RolledBack
) -> tuple[int, Snapshot | None]:
    """The newest readable snapshot at or before `until_seq` that was not rolled back."""
    at = until_seq
    while at > 0:
        found = log.load_snapshot(SNAPSHOT_NAME, at_or_before_seq=at)
        if found is None:
            break
        seq, payload = found
        if seq not in skipped:
            try:
                return seq, _SNAPSHOT_DECODER.decode(payload)
            except msgspec.DecodeError as exc:
                logger.warning("snapshot at seq %d is unreadable (%s); folding instead", seq, exc)
        at = seq - 1
    return 0, None


def fold_until(
    log: EventLog, until_seq: int, skipped: RolledBack
) -> tuple[LedgerState, dict[str, int]]:
    """The effective state at `until_seq`, and the stream versions seen on the way."""
    snap_seq, snapshot = _usable_snapshot(log, until_seq, skipped)
    state = snapshot.state if snapshot else LedgerState()
    versions = dict(snapshot.versions) if snapshot else {}
    if until_seq <= snap_seq:
        return state, versions
    for rec in log.read(from_seq=snap_seq + 1, until_seq=until_seq):
        versions[rec.stream] = rec.version
        if rec.seq in skipped:
            continue
        try:
            fold(state, rec.event)
        except RuleViolation as exc:
            raise InvalidEventError(
                f"seq {rec.seq} ({rec.type} on stream {rec.stream!r}) breaks a ledger rule: {exc}",
                hint="the log was edited or written by something other than the ledger",
            ) from None
    return state, versions


def check_rows(state: LedgerState, data_plane: DataPlane, partition: str) -> None:
    """Every staging key a sealed attempt owns must be in the data plane (fail closed)."""
    try:
        owners = referenced_keys(state)
    except RuleViolation as exc:
        raise ReconciliationError(str(exc)) from None
    present = data_plane.list_keys(partition)
    for key, owner in sorted(owners.items()):
        if key not in present:
            raise ReconciliationError(
                f"group {owner.group_id!r}, sibling {owner.generation_index}, attempt "
                f"{owner.attempt}: staging key {key!r} is missing from partition {partition!r}"
            )


def checkpoint_event(
    state: LedgerState,
    data_plane: DataPlane,
    partition: str,
    log: EventLog,
    *,
    step: int,
    directory: str,
) -> CheckpointCommitted:
    """Check the state can be checkpointed, save the data plane, and return the event to append.

    Refuses while a group is finalizing or finalization_unknown and checks every sealed
    staging row exists; appends nothing (the ledger commits the event, then `save_snapshot`).
    """
    for group in state.groups.values():
        if group.status in ("finalizing", "finalization_unknown"):
            raise LedgerRuleError(
                f"group {group.group_id!r}: cannot checkpoint while it is {group.status} "
                f"(owner {group.finalization_owner!r})",
                hint="finish or resolve finalization first",
            )
    check_rows(state, data_plane, partition)
    saved = data_plane.save_checkpoint(directory)
    covers_seq, chain = log.tail_chain()
    return CheckpointCommitted(
        step=step,
        data_plane_ref=saved.ref,
        inventory_digest=saved.inventory_digest,
        row_count=saved.row_count,
        ledger_digest=state_digest(state),
        group_count=len(state.groups),
        covers_seq=covers_seq,
        chain=chain.hex(),
    )


def save_snapshot(log: EventLog, seq: int, state: LedgerState, versions: Mapping[str, int]) -> None:
    """Store the state at a CheckpointCommitted seq, so a restore need not fold the whole run."""
    snapshot = Snapshot(state=state, versions=dict(versions))
    log.save_snapshot(SNAPSHOT_NAME, seq, msgspec.msgpack.encode(snapshot))
