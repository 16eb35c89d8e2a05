"""Checkpoints and the state at a log position: snapshots, folding, and the row check.

A checkpoint is taken inside the barrier's exclusive section, so the ledger state, the data
plane's own checkpoint and the log position are one consistent cut. The projection snapshot
stored at the CheckpointCommitted seq lets a restore skip replaying the whole run; if it is
missing (a crash right after the append) or unreadable, folding the log gives the same state,
which the checkpoint's ledger digest then confirms.

Snapshots and checkpoints carry the projection version of the code that folded them
(projections.version). A snapshot of another version is not trusted: the fold starts from an
older snapshot of this version, or from the log, and says so. A ledger digest of another
version cannot be compared (ProjectionVersionError, told apart from a real divergence).
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from eventlog import codec, collector
from eventlog.dataplane.protocol import DataPlane, DataPlaneCheckpoint
from eventlog.errors import InvalidEventError
from eventlog.log import EventLog
from eventlog.recovery.errors import LedgerRuleError, ProjectionVersionError, ReconciliationError
from eventlog.recovery.vocabulary import (
    CONTROLLER_STREAM,
    EPOCH_STREAM,
    REPLAY_STREAM,
    CheckpointCommitted,
    CheckpointRetired,
    group_stream,
)
from projections.history import RecordLike, RolledBack, effective, retired_checkpoints
from projections.reconcile import referenced_keys
from projections.siblings import (
    FOLDED_TYPES,
    Folder,
    LedgerState,
    RuleViolation,
    state_digest,
)
from projections.version import PROJECTION_VERSION

logger = logging.getLogger(__name__)

SNAPSHOT_NAME = "recovery-ledger"


class Snapshot(msgspec.Struct, kw_only=True):
    """A snapshot payload: the state, the stream versions it was folded from, and the
    projection version that folded it (None: written before snapshots carried one)."""

    state: LedgerState
    versions: dict[str, int]
    projection_version: str | None = None


class _SnapshotHeader(msgspec.Struct):
    """Only the version, read before the state (whose shape may be another version's)."""

    projection_version: str | None = None


_SNAPSHOT_DECODER = msgspec.msgpack.Decoder(Snapshot)
_HEADER_DECODER = msgspec.msgpack.Decoder(_SnapshotHeader)

MAX_UNTRUSTED = 8
"""Snapshots of another version passed over before giving up and folding from seq 1: after a
code change every older snapshot is usually of an older version, and reading each back costs
more than it can save."""


@dataclass
class Folded:
    """A state at a log position, and how it was reached."""

    state: LedgerState
    versions: dict[str, int]
    """Stream versions at that position (only when asked for: `versions=True`)."""
    snapshot_seq: int = 0
    """The snapshot the fold started from (0: the start of the log)."""
    untrusted: list[tuple[int, str | None]] = field(default_factory=list)
    """Snapshots passed over because another projection version wrote them: (seq, version)."""
    records_folded: int = 0
    """Log records after the snapshot up to the position: the range the fold covered (it
    reads and decodes only the ledger's types among them, `FOLDED_TYPES`)."""


def _usable_snapshot(
    log: EventLog, until_seq: int, skipped: RolledBack, untrusted: list[tuple[int, str | None]]
) -> tuple[int, Snapshot | None]:
    """The newest readable snapshot of this projection version at or before `until_seq` that
    was not rolled back; snapshots of another version are listed in `untrusted`."""
    at = until_seq
    while at > 0:
        found = log.load_snapshot(SNAPSHOT_NAME, at_or_before_seq=at)
        if found is None:
            break
        seq, payload = found
        if seq not in skipped:
            try:
                version = _HEADER_DECODER.decode(payload).projection_version
                if version == PROJECTION_VERSION:
                    return seq, _SNAPSHOT_DECODER.decode(payload)
                untrusted.append((seq, version))
                if len(untrusted) >= MAX_UNTRUSTED:
                    logger.warning(
                        "%d snapshots in a row are of other projection versions: folding the "
                        "log from seq 1",
                        len(untrusted),
                    )
                    break
                logger.warning(
                    "snapshot at seq %d is of projection version %s, this code is %s: not "
                    "trusted, folding from an older snapshot or the log instead",
                    seq,
                    version or "(none: written before versions)",
                    PROJECTION_VERSION,
                )
            except msgspec.DecodeError as exc:
                logger.warning("snapshot at seq %d is unreadable (%s); folding instead", seq, exc)
        at = seq - 1
    return 0, None


def fold_from_snapshot(
    log: EventLog, until_seq: int, skipped: RolledBack, *, versions: bool = False
) -> Folded:
    """The effective state at `until_seq`, from the newest trusted snapshot (or the log).

    `versions`: also the stream versions as of `until_seq` (the snapshot's, updated by one
    grouped query over the records after it), for a ledger that will append; a restore looks
    up the few streams it appends to instead.
    """
    untrusted: list[tuple[int, str | None]] = []
    snap_seq, snapshot = _usable_snapshot(log, until_seq, skipped, untrusted)
    folded = Folded(
        state=snapshot.state if snapshot else LedgerState(),
        versions=dict(snapshot.versions) if snapshot and versions else {},
        snapshot_seq=snap_seq,
        untrusted=untrusted,
    )
    if until_seq <= snap_seq:
        return folded
    fold_records(log, folded.state, snap_seq + 1, until_seq, skipped)
    folded.records_folded = until_seq - snap_seq
    if versions:
        folded.versions.update(log.versions_between(snap_seq + 1, until_seq))
    return folded


def fold_records(
    log: EventLog, state: LedgerState, from_seq: int, until_seq: int, skipped: RolledBack
) -> LedgerState:
    """Fold the effective records of from_seq..until_seq into `state`: every rebuild's loop.

    Reads only the types the fold handles (`FOLDED_TYPES`, a quarter of a run's records):
    the others would be decoded only to be ignored. Only the columns it decodes are read
    (`EventLog.read_payloads`), each checked row's payload straight into its event
    (`codec.decode`, which names the seq of one that does not decode): no record object,
    event id or envelope per record. A record that breaks a rule is named by its seq and
    stream (InvalidEventError).
    """
    rows = log.read_payloads(from_seq, until_seq, types=FOLDED_TYPES, page_size=_FOLD_PAGE)
    decode = codec.decode
    apply = Folder(state)
    # Pages of rows, their events and the values the fold builds are acyclic and freed by
    # their reference counts; collections meanwhile only rescanned and promoted them (about
    # a sixth of a 10^6-record rebuild in a process that imported torch).
    with collector.paused(long=True):
        for seq, type_name, schema, _, payload in rows:
            if skipped and seq in skipped:
                continue
            try:
                apply(decode(type_name, schema, payload, seq=seq))
            except RuleViolation as exc:
                # The stream is read only to name it (the rows carry the columns a fold uses).
                found = next(iter(log.read_records(seq, seq)), None)
                stream = "?" if found is None else found.stream
                raise InvalidEventError(
                    f"seq {seq} ({type_name} on stream {stream!r}) breaks a ledger rule: {exc}",
                    hint="the log was edited or written by something other than the ledger",
                ) from None
    return state


_FOLD_PAGE = 5000
"""Records per fetch while folding: fewer round trips, memory still bounded."""


def fold_until(
    log: EventLog, until_seq: int, skipped: RolledBack
) -> tuple[LedgerState, dict[str, int]]:
    """The effective state at `until_seq`, and the stream versions as of then."""
    folded = fold_from_snapshot(log, until_seq, skipped, versions=True)
    return folded.state, folded.versions


def check_ledger_digest(ckpt: CheckpointCommitted, ckpt_seq: int, state: LedgerState) -> bool:
    """Compare a checkpoint's ledger digest with the state the log folds to at its seq.

    True when they match. A mismatch of the same projection version is a real divergence
    (ReconciliationError); one written by another version (or before versions existed) is
    ProjectionVersionError: the digests are of different shapes and prove nothing either way.
    """
    found = state_digest(state)
    if found == ckpt.ledger_digest:
        return True
    where = f"checkpoint step {ckpt.step} (seq {ckpt_seq})"
    if ckpt.projection_version == PROJECTION_VERSION:
        raise ReconciliationError(
            f"{where}: the log folds to ledger digest {found[:16]}…, the checkpoint recorded "
            f"{ckpt.ledger_digest[:16]}…, both of projection version {PROJECTION_VERSION}: "
            "the log and the checkpoint diverged",
            hint="the log was edited, or a snapshot or checkpoint was written by something else",
        )
    raise ProjectionVersionError(
        f"{where}: its ledger digest was computed by projection version "
        f"{ckpt.projection_version or '(none: written before versions)'}, this code is "
        f"{PROJECTION_VERSION}: the digests cannot be compared (a code change, not a divergence)",
        hint="restore re-folds the log with this code and records that the digest was not compared",
    )


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


def check_canonical_rows(
    state: LedgerState, data_plane: DataPlane, partition: str, *, when: str
) -> Mapping[str, Mapping[str, str]]:
    """Every canonical row a replay entry owns must be in the training partition (fail
    closed: training would silently lose the group); the partition's keys, for the caller.
    `when` says which step found it missing (a checkpoint about to commit, a restore)."""
    present = data_plane.list_keys(partition)
    owners = {row: e.group_id for e in state.replay.values() for row in e.canonical_row_ids}
    missing = sorted(row for row in owners if row not in present)
    if missing:
        first = missing[0]
        raise ReconciliationError(
            f"group {owners[first]!r}: canonical row {first!r} is missing from partition "
            f"{partition!r} {when} ({len(missing)} missing in all)",
            hint="the finalized groups' rows must be written before their GroupFinalized",
        )
    return present


_FRESH = re.compile(r"^step-\d+-seq-\d+(?:-e\d+)?-[0-9a-f]+$")
"""A folder `checkpoint_location` names (older logs' names have no epoch)."""


def checkpoint_location(
    directory: str, step: int, covers_seq: int, chain: bytes, epoch: int
) -> Path:
    """Where a checkpoint's data plane goes: a fresh folder under `directory`, never one that
    a committed checkpoint references.

    Named by the log position the cut covers, the saving controller's fencing epoch and that
    position's chain value: every committed checkpoint covers a different seq of its log (its
    own record comes after the seq it covers), another log's chain differs, and two
    controllers at the same head (a zombie beside the one that superseded it) hold different
    epochs. So the only folder that can already be there is the leftover of this controller's
    own attempt at this very cut that failed before it was committed.
    """
    name = f"step-{step}-seq-{covers_seq}-e{epoch}-{chain.hex()[:12] or '0'}"
    return Path(directory).resolve() / name


def save_fresh(data_plane: DataPlane, location: Path) -> DataPlaneCheckpoint:
    """Save the data plane into `location`, first removing an uncommitted leftover there."""
    if location.exists():
        logger.warning("removing %s: left by a checkpoint that was never committed", location)
        shutil.rmtree(location)
    return data_plane.save_checkpoint(str(location))


def retire_events(
    controller_records: Iterable[RecordLike], skipped: RolledBack, *, keep: int
) -> list[CheckpointRetired]:
    """Retire every checkpoint but the newest `keep` effective ones (rolled-back ones too).

    Only after a newer checkpoint was committed; the caller appends these, then deletes
    each `deleted` data-plane checkpoint (log first, delete after: a crash in between leaves
    files of a retired checkpoint, which `retire_events` lists again for deletion).
    """
    if keep < 1:
        raise LedgerRuleError(f"keep must be at least 1 (the newest checkpoint), found {keep}")
    records = list(controller_records)
    retired = retired_checkpoints(records)
    live = {rec.seq for rec in effective(records, skipped)}
    checkpoints = [
        (rec.seq, rec.event)
        for rec in records
        if isinstance(rec.event, CheckpointCommitted) and rec.seq not in retired
    ]
    kept = {seq for seq, _ in [c for c in checkpoints if c[0] in live][-keep:]}
    events = []
    for seq, ckpt in checkpoints:
        if seq in kept:
            continue
        why = "rolled back by a restore" if seq not in live else f"older than the newest {keep}"
        events.append(
            CheckpointRetired(
                step=ckpt.step,
                checkpoint_seq=seq,
                data_plane_ref=ckpt.data_plane_ref,
                deleted=_FRESH.match(Path(ckpt.data_plane_ref).name) is not None,
                reason=why,
            )
        )
    return events


def delete_retired(events: Iterable[CheckpointRetired]) -> None:
    """Delete the data-plane checkpoints the appended CheckpointRetired events gave up."""
    for event in events:
        if event.deleted:
            shutil.rmtree(event.data_plane_ref, ignore_errors=True)


def checkpoint_event(
    state: LedgerState,
    data_plane: DataPlane,
    partition: str,
    log: EventLog,
    *,
    step: int,
    directory: str,
    epoch: int,
    training_partition: str,
) -> CheckpointCommitted:
    """Check the state can be checkpointed, save the data plane, and return the event to append.

    Refuses while a group is finalizing or finalization_unknown and checks every sealed
    staging row and every replay entry's canonical row exists (a checkpoint without them
    would commit and never restore); saves into a fresh folder under `directory`
    (checkpoint_location, of the saving controller's `epoch`), so a crash before the event is
    committed leaves the newest committed checkpoint whole.
    Appends nothing (the ledger commits the event, then `save_snapshot`).
    """
    for group in state.groups.values():
        if group.status in ("finalizing", "finalization_unknown"):
            raise LedgerRuleError(
                f"group {group.group_id!r}: cannot checkpoint while it is {group.status} "
                f"(owner {group.finalization_owner!r})",
                hint="finish or resolve finalization first",
            )
    check_rows(state, data_plane, partition)
    check_canonical_rows(
        state, data_plane, training_partition, when=f"as checkpoint step {step} was taken"
    )
    covers_seq, chain = log.tail_chain()
    saved = save_fresh(data_plane, checkpoint_location(directory, step, covers_seq, chain, epoch))
    return CheckpointCommitted(
        step=step,
        data_plane_ref=saved.ref,
        inventory_digest=saved.inventory_digest,
        row_count=saved.row_count,
        ledger_digest=state_digest(state),
        projection_version=PROJECTION_VERSION,
        group_count=len(state.groups),
        covers_seq=covers_seq,
        chain=chain.hex(),
    )


def live_versions(state: LedgerState, versions: Mapping[str, int]) -> dict[str, int]:
    """The stream versions worth keeping: those of the streams the ledger appends to at a
    version it holds (the controller's, the replay buffer's, the epoch's) and of the groups
    in the ledger or its replay buffer. Every other version (a group that trained or was
    evicted, which only a late result's record touches again; an attempt stream, written
    by workers at ANY; another application's stream) is read from the log when a command
    needs it, so a snapshot and the ledger's memory hold the work in flight, not the run."""
    found = {stream: versions[stream] for stream in _LEDGER_STREAMS if stream in versions}
    for group_id in [*state.groups, *state.replay]:
        stream = group_stream(group_id)
        if stream in versions:
            found[stream] = versions[stream]
    return found


_LEDGER_STREAMS = (CONTROLLER_STREAM, REPLAY_STREAM, EPOCH_STREAM)


def save_snapshot(log: EventLog, seq: int, state: LedgerState, versions: Mapping[str, int]) -> int:
    """Store the state at a CheckpointCommitted seq, so a restore need not fold the whole run
    (with the ledger's `live_versions`, so its size follows the work in flight); the bytes
    stored."""
    snapshot = Snapshot(state=state, versions=dict(versions), projection_version=PROJECTION_VERSION)
    payload = msgspec.msgpack.encode(snapshot)
    log.save_snapshot(SNAPSHOT_NAME, seq, payload)
    return len(payload)
