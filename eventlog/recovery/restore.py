"""What a restore hands the controller: the restore plan, and the prompt identity check.

The plan says, per group, exactly which generation indices to redispatch (with the attempt
numbers the restore minted) and which sealed siblings are kept as they were: attempt, rollout
id, rows, reward, target step. Admitted groups come first: they may be the only work that can
advance the trainer and open the sampler's gate; reserved groups follow, one entry per
admission, to be admitted exactly once each.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from eventlog import codec, collector
from eventlog.dataplane.protocol import DataPlane, DataPlaneCheckpoint
from eventlog.events import Event
from eventlog.log import EventLog
from eventlog.records import NO_STREAM, ExpectedVersion
from eventlog.recovery.checkpoint import (
    check_canonical_rows,
    check_ledger_digest,
    fold_from_snapshot,
)
from eventlog.recovery.config import DEFAULT_TRAINING_PARTITION
from eventlog.recovery.errors import (
    LedgerRuleError,
    ProjectionVersionError,
    PromptIdentityError,
    ReconciliationError,
)
from eventlog.recovery.vocabulary import (
    CONTROLLER_STREAM,
    REPLAY_STREAM,
    AttemptRef,
    CheckpointCommitted,
    Granularity,
    RestoreCompleted,
    RestoreStarted,
    RowsCleared,
    SealResult,
    StagingCleared,
    attempt_stream,
    group_stream,
)
from projections.history import (
    RolledBack,
    controller_history,
    effective_checkpoints,
    rolled_back_range,
)
from projections.reconcile import Reconciliation, reconcile, referenced_keys, staged_by
from projections.recovery import attempts_used, restart_events
from projections.siblings import (
    GroupState,
    GroupStatus,
    LedgerState,
    RuleViolation,
    fold_all,
)
from projections.version import PROJECTION_VERSION

logger = logging.getLogger(__name__)

Prompt = Mapping[str, Any]


class Dataset(Protocol):
    """Where prompts come back from after a restart: by the `sample_id` of their prompt_ref."""

    def get(self, sample_id: str) -> Prompt: ...


def prompt_digest(prompt: Prompt) -> str:
    """sha256 of a prompt's canonical JSON (keys sorted): the content half of its identity."""
    return hashlib.sha256(msgspec.json.encode(prompt, order="sorted")).hexdigest()


def check_prompt(group: GroupState, prompt: object) -> Prompt:
    """The rehydrated prompt, if it is the one the group was reserved for; else raise."""
    where = f"group {group.group_id!r}: dataset sample {group.prompt_ref.sample_id!r}"
    if not isinstance(prompt, Mapping):
        raise PromptIdentityError(f"{where}: expected a prompt mapping, found {type(prompt)}")
    found_id = prompt.get("prompt_id")
    if found_id != group.prompt_id:
        raise PromptIdentityError(
            f"{where}: expected prompt_id {group.prompt_id!r}, found {found_id!r}",
            hint="the dataset changed order or content since the run reserved this prompt",
        )
    found_task = prompt.get("task_name")
    if found_task != group.prompt_ref.task_name:
        raise PromptIdentityError(
            f"{where}: expected task_name {group.prompt_ref.task_name!r}, found {found_task!r}"
        )
    if group.prompt_hash is not None:
        try:
            found_hash = prompt_digest(prompt)
        except (TypeError, msgspec.EncodeError) as exc:
            raise PromptIdentityError(f"{where}: prompt cannot be fingerprinted: {exc}") from None
        if found_hash != group.prompt_hash:
            raise PromptIdentityError(
                f"{where}: prompt {group.prompt_id!r} has content digest {found_hash[:16]}…, "
                f"expected {group.prompt_hash[:16]}… (same id, different prompt)"
            )
    return prompt


@dataclass(frozen=True)
class GroupPlan:
    """One restored group: what is kept and exactly what to redispatch."""

    group_id: str
    admission_id: str
    phase: str
    status: GroupStatus
    granularity: Granularity
    target_step: int | None
    start_weight_version: int
    prompt: Prompt
    sealed: list[SealResult]
    """Siblings whose result survives the restore unchanged (the group has the target step)."""
    redispatch: list[AttemptRef]

    @property
    def redispatch_indices(self) -> list[int]:
        return [ref.generation_index for ref in self.redispatch]


@dataclass(frozen=True)
class AdmissionPlan:
    """Reserved groups of one admission: admit them once (`ledger.admit`), then dispatch."""

    admission_id: str
    groups: list[GroupPlan]


@dataclass(frozen=True)
class RestorePlan:
    """Everything a controller needs to resume after a restore."""

    checkpoint_step: int
    checkpoint_seq: int
    rolled_back: tuple[int, int]
    """Inclusive seq range this restore rolled back (empty when low > high)."""
    admitted: list[GroupPlan]
    reserved: list[AdmissionPlan]
    replay_group_ids: list[str]
    """Finalized groups the replay buffer owns again (their canonical rows came back)."""
    staging: Reconciliation
    counts: dict[str, int] = field(default_factory=dict)


def group_plan(group: GroupState, prompt: Prompt) -> GroupPlan:
    sealed = [
        SealResult(
            generation_index=s.generation_index,
            attempt=s.current.attempt,
            rollout_id=s.current.rollout_id,
            receipt=s.current.receipt,
            reward=s.current.reward if s.current.reward is not None else 0.0,
            mask_sample=bool(s.current.mask_sample),
        )
        for s in group.siblings
        if s.current.status == "sealed"
    ]
    redispatch = [
        AttemptRef(
            generation_index=s.generation_index,
            attempt=s.current.attempt,
            rollout_id=s.current.rollout_id,
        )
        for s in group.siblings
        if s.current.status == "reserved"
    ]
    return GroupPlan(
        group_id=group.group_id,
        admission_id=group.admission_id,
        phase=group.phase,
        status=group.status,
        granularity=group.granularity,
        target_step=group.target_step,
        start_weight_version=group.start_weight_version,
        prompt=prompt,
        sealed=sealed,
        redispatch=redispatch,
    )


def build_plan(
    state: LedgerState,
    prompts: Mapping[str, Prompt],
    *,
    checkpoint_step: int,
    checkpoint_seq: int,
    rolled_back: tuple[int, int],
    staging: Reconciliation,
) -> RestorePlan:
    admitted: list[GroupPlan] = []
    reserved: dict[str, list[GroupPlan]] = {}
    for group in state.groups.values():
        plan = group_plan(group, prompts[group.group_id])
        if group.phase == "admitted":
            admitted.append(plan)
        else:
            reserved.setdefault(group.admission_id, []).append(plan)
    every = admitted + [p for plans in reserved.values() for p in plans]
    counts = {
        "groups_restored": len(every),
        "siblings_reused": sum(len(p.sealed) for p in every),
        "siblings_redispatched": sum(len(p.redispatch) for p in every),
        "rows_cleared": len(staging.clear),
    }
    return RestorePlan(
        checkpoint_step=checkpoint_step,
        checkpoint_seq=checkpoint_seq,
        rolled_back=rolled_back,
        admitted=admitted,
        reserved=[AdmissionPlan(admission_id=a, groups=g) for a, g in reserved.items()],
        replay_group_ids=sorted(state.replay),
        staging=staging,
        counts=counts,
    )


def _rehydrate(dataset: Dataset, group: GroupState) -> Prompt:
    try:
        prompt = dataset.get(group.prompt_ref.sample_id)
    except (KeyError, IndexError, ValueError) as exc:
        raise PromptIdentityError(
            f"group {group.group_id!r}: dataset has no sample {group.prompt_ref.sample_id!r} "
            f"({type(exc).__name__}: {exc})"
        ) from None
    return check_prompt(group, prompt)


Append = tuple[str, ExpectedVersion, list[Event]]
"""One append of a restore: stream, the version it must be at, and its events."""


@dataclass(frozen=True)
class PreparedRestore:
    """Everything a restore checked before appending anything; the ledger commits `start`."""

    checkpoint_seq: int
    checkpoint: CheckpointCommitted
    state: LedgerState
    """The state at the checkpoint: what the ledger folds `finish_restore`'s events into."""
    restored: LedgerState
    """`state` with the restart events folded in: what the plan describes."""
    skipped: RolledBack
    """Rolled-back ranges before this restore."""
    versions: dict[str, int]
    """Stream versions now, for the ledger's expected versions after the restore."""
    prompts: dict[str, Prompt]
    staging: Reconciliation
    group_events: list[Append]
    start: Append
    """RestoreStarted: appended alone first, so its seq closes the rolled-back range."""
    training_partition: str = DEFAULT_TRAINING_PARTITION
    canonical_orphans: list[str] = field(default_factory=list)
    """Canonical rows no replay entry owns: recorded (RowsCleared), then deleted."""
    snapshots_untrusted: int = 0
    """Snapshots of another projection version passed over (RestoreCompleted says so)."""
    records_folded: int = 0
    digest_compared: bool = True
    """False: the checkpoint's ledger digest is of another projection version."""


def prepare_restore(
    log: EventLog,
    data_plane: DataPlane,
    partition: str,
    dataset: Dataset,
    step: int | None,
    *,
    training_partition: str = DEFAULT_TRAINING_PARTITION,
) -> PreparedRestore:
    """Load the checkpoint's data plane and run every check a restore makes; append nothing.

    Checkpoint found, ledger digest, granularity (each group's stored one, never the current
    config: in-flight attempts are abandoned and retried), reconciliation of the staging and
    the canonical partitions, prompt identity: a
    failure raises before the ledger appends anything. The data plane is loaded first because
    every later check reads it.

    The cyclic garbage collector is paused meanwhile (`collector.paused`): what a restore
    builds is tens of thousands of acyclic values, and each collection they triggered
    rescanned the whole process heap (torch's included) — most of a restore's time.
    """
    with collector.paused(long=True):
        return _prepare_restore(
            log, data_plane, partition, dataset, step, training_partition=training_partition
        )


def _check_chain_anchor(log: EventLog, ckpt: CheckpointCommitted) -> None:
    """The log still holds the record the checkpoint covered, with the chain value it
    recorded: a log truncated and grown again, or another run's file, fails here instead of
    restoring from history that is not the checkpoint's (one read; `verify` checks it all)."""
    if ckpt.covers_seq == 0:
        return
    found = next(iter(log.read_records(ckpt.covers_seq, ckpt.covers_seq)), None)
    chain = "" if found is None else found.chain.hex()
    if chain != ckpt.chain:
        raise ReconciliationError(
            f"checkpoint step {ckpt.step} covers seq {ckpt.covers_seq} with chain "
            f"{ckpt.chain[:16]}…, but the log's record at seq {ckpt.covers_seq} "
            + ("is missing" if found is None else f"has chain {chain[:16]}…")
            + ": the log before the checkpoint is not the one it was taken on",
            hint="run `eventlog verify` on the log; restore from a backup of it",
        )


def _prepare_restore(
    log: EventLog,
    data_plane: DataPlane,
    partition: str,
    dataset: Dataset,
    step: int | None,
    *,
    training_partition: str,
) -> PreparedRestore:
    controller, skipped = controller_history(log, log.head())
    checkpoints = effective_checkpoints(controller, skipped)
    chosen = [c for c in checkpoints if step is None or c[1].step == step]
    if not chosen:
        steps = sorted({c[1].step for c in checkpoints})
        raise LedgerRuleError(
            f"no checkpoint at step {step} to restore (checkpoints at steps {steps})"
            if step is not None
            else "no checkpoint to restore: the log has none"
        )
    ckpt_seq, ckpt = chosen[-1]
    _check_chain_anchor(log, ckpt)

    data_plane.load_checkpoint(
        DataPlaneCheckpoint(
            ref=ckpt.data_plane_ref,
            inventory_digest=ckpt.inventory_digest,
            row_count=ckpt.row_count,
        )
    )
    folded = fold_from_snapshot(log, ckpt_seq, skipped)
    state = folded.state
    try:
        digest_compared = check_ledger_digest(ckpt, ckpt_seq, state)
    except ProjectionVersionError as exc:
        # Not a divergence: this code folds the log its own way. The fold from the log (never
        # a snapshot of the other version) is what the restore goes on with, and it says so.
        logger.warning("%s; restoring from this code's fold of the log", exc)
        digest_compared = False

    streams = [group_stream(g) for g in state.groups] + [CONTROLLER_STREAM, REPLAY_STREAM]
    # Every version the restore appends at, and every group's attempt history, in a few
    # queries (one read per group stream cost a pooled connection's round trip each).
    now = log.stream_versions(streams)
    minted = attempt_histories(log, [group_stream(g) for g in state.groups])
    group_events: list[Append] = []
    for group in state.groups.values():
        # The whole stream, rolled-back records included: numbers they used stay used.
        stream = group_stream(group.group_id)
        events = restart_events(group, attempts_used(minted.get(stream, ())))
        if events:
            version = now[stream]
            group_events.append((stream, NO_STREAM if version is None else version, events))
    restored = state.copy()
    try:
        for _, _, events in group_events:
            fold_all(restored, events)
        present = data_plane.list_keys(partition)
        staging = reconcile(
            restored,
            present,
            _staged(log, partition, present, referenced_keys(restored)),
            partition,
        )
    except RuleViolation as exc:
        raise ReconciliationError(f"checkpoint step {ckpt.step}: {exc}") from None
    if staging.missing:
        first = staging.missing[0]
        raise ReconciliationError(
            f"group {first.owner.group_id!r}, sibling {first.owner.generation_index}, attempt "
            f"{first.owner.attempt}: staging key {first.key!r} is missing from partition "
            f"{staging.partition!r} after loading checkpoint step {ckpt.step} "
            f"({len(staging.missing)} missing in all)",
            hint="the data-plane checkpoint does not hold the rows the log says were sealed",
        )
    orphans = _reconcile_canonical(restored, data_plane, training_partition, ckpt.step)
    prompts = {gid: _rehydrate(dataset, group) for gid, group in restored.groups.items()}
    versions = {s: v for s, v in now.items() if v is not None}
    start = RestoreStarted(
        checkpoint_step=ckpt.step, checkpoint_seq=ckpt_seq, rolled_back_from_seq=ckpt_seq + 1
    )
    controller_version = controller[-1].version if controller else NO_STREAM
    return PreparedRestore(
        checkpoint_seq=ckpt_seq,
        checkpoint=ckpt,
        state=state,
        restored=restored,
        skipped=skipped,
        versions=versions,
        prompts=prompts,
        staging=staging,
        group_events=group_events,
        start=(CONTROLLER_STREAM, controller_version, [start]),
        training_partition=training_partition,
        canonical_orphans=orphans,
        snapshots_untrusted=len(folded.untrusted),
        records_folded=folded.records_folded,
        digest_compared=digest_compared,
    )


def _reconcile_canonical(
    state: LedgerState, data_plane: DataPlane, partition: str, step: int
) -> list[str]:
    """The canonical rows no replay entry owns; a row an entry owns but the data plane lacks
    fails the restore closed (training would silently lose the group)."""
    present = check_canonical_rows(
        state, data_plane, partition, when=f"after loading checkpoint step {step}"
    )
    owned = {row for e in state.replay.values() for row in e.canonical_row_ids}
    return sorted(set(present).difference(owned))


def finish_restore(
    prepared: PreparedRestore, started_seq: int, started_version: int
) -> tuple[RestorePlan, RolledBack, list[Append]]:
    """The plan, the rolled-back ranges, and the appends that close a restore (one atomic step).

    Each group's restart events (abandon and retry by its stored granularity) go to its
    stream; StagingCleared and RestoreCompleted close the controller stream. The caller deletes
    `plan.staging.clear` from the data plane after they are appended.
    """
    ckpt, ckpt_seq = prepared.checkpoint, prepared.checkpoint_seq
    _, _, (started,) = prepared.start
    assert isinstance(started, RestoreStarted)
    rolled = rolled_back_range(started, started_seq)
    skipped = RolledBack([*prepared.skipped.ranges, rolled])
    staging = prepared.staging
    plan = build_plan(
        prepared.restored,
        prepared.prompts,
        checkpoint_step=ckpt.step,
        checkpoint_seq=ckpt_seq,
        rolled_back=rolled,
        staging=staging,
    )
    closing: list[Event] = []
    if staging.clear:
        closing.append(
            StagingCleared(
                partition=staging.partition,
                of_attempts=staging.clear_of_attempts,
                never_staged=staging.clear_never_staged,
                reason=f"unreferenced after restore to checkpoint step {ckpt.step}",
            )
        )
    if prepared.canonical_orphans:
        closing.append(
            RowsCleared(
                partition=prepared.training_partition,
                keys=prepared.canonical_orphans,
                reason=f"unreferenced after restore to checkpoint step {ckpt.step}",
                step=ckpt.step,
            )
        )
    closing.append(
        RestoreCompleted(
            checkpoint_step=ckpt.step,
            checkpoint_seq=ckpt_seq,
            rolled_back_from_seq=rolled[0],
            rolled_back_until_seq=rolled[1],
            **plan.counts,
            snapshots_untrusted=prepared.snapshots_untrusted,
            records_folded=prepared.records_folded,
            digest_compared=prepared.digest_compared,
            projection_version=PROJECTION_VERSION,
        )
    )
    appends = [*prepared.group_events, (CONTROLLER_STREAM, started_version, closing)]
    logger.info(
        "restoring checkpoint step %d (seq %d): rolling back seqs %d..%d; %s",
        ckpt.step,
        ckpt_seq,
        rolled[0],
        rolled[1],
        plan.counts,
    )
    return plan, skipped, appends


_ATTEMPT_NUMBERS = ["RetryPrepared", "SiblingsDispatched"]
"""The group-stream records that mint or use attempt numbers (what `attempts_used` reads)."""
_STREAMS_PER_READ = 500


def _read_streams(
    log: EventLog, streams: Sequence[str] | None, types: Sequence[str]
) -> Iterator[tuple[str, Event]]:
    """(stream, event) of the records of `types` in `streams` (every stream: None), a few
    hundred streams per query; each checked row's payload is decoded straight into its
    event, without a record object or an event id per row."""
    decode = codec.decode
    chunks = (
        [None]
        if streams is None
        else [streams[i : i + _STREAMS_PER_READ] for i in range(0, len(streams), _STREAMS_PER_READ)]
    )
    for chunk in chunks:
        rows = log.read_rows(streams=chunk, types=types, page_size=5000)
        for seq, stream, _, _, type_name, schema, _, payload, _ in rows:
            yield stream, decode(type_name, schema, payload, seq=seq)


def attempt_histories(log: EventLog, streams: Sequence[str]) -> dict[str, list[Event]]:
    """Per group stream, its records that mint or use attempt numbers, rolled-back included."""
    found: dict[str, list[Event]] = {}
    for stream, event in _read_streams(log, streams, _ATTEMPT_NUMBERS):
        found.setdefault(stream, []).append(event)
    return found


def _staged(
    log: EventLog,
    partition: str,
    present: Mapping[str, Mapping[str, str]],
    owned: Mapping[str, object],
) -> dict[str, str]:
    """Which attempt staged each unreferenced row (only those need telling apart).

    Workers tag every row with its `rollout_id`, so the attempt streams those tags name are
    read through the (stream, version) index; a row without the tag falls back to scanning
    every TokensStaged record, which grows with the length of the whole run.
    """
    rollout_ids = {present[key].get("rollout_id") for key in present if key not in owned}
    wanted = (
        None
        if None in rollout_ids
        else [attempt_stream(r) for r in sorted(r for r in rollout_ids if r is not None)]
    )
    staged = staged_by(
        (event for _, event in _read_streams(log, wanted, ["TokensStaged"])), partition
    )
    # A worker killed between its put and its TokensStaged left a row its tag still names:
    # it belongs to that attempt (its stream exists: GenerationStarted), not to "never staged".
    untold = {
        key: tagged
        for key, tags in present.items()
        if (tagged := tags.get("rollout_id")) and key not in owned and key not in staged
    }
    if untold:
        exists = log.stream_versions(attempt_stream(r) for r in set(untold.values()))
        for key, tagged in untold.items():
            if exists[attempt_stream(tagged)] is not None:
                staged[key] = tagged
    return staged
