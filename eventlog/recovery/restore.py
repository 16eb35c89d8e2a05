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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from eventlog.dataplane.protocol import DataPlaneCheckpoint
from eventlog.events import Event
from eventlog.records import NO_STREAM, AppendRequest, ExpectedVersion
from eventlog.recovery.checkpoint import fold_until
from eventlog.recovery.errors import LedgerRuleError, PromptIdentityError, ReconciliationError
from eventlog.recovery.vocabulary import (
    CONTROLLER_STREAM,
    REPLAY_STREAM,
    AttemptRef,
    Granularity,
    RestoreCompleted,
    RestoreStarted,
    StagingCleared,
    attempt_stream,
    group_stream,
)
from projections.history import RolledBack, effective_checkpoints, rolled_back
from projections.reconcile import Reconciliation, reconcile, referenced_keys, staged_by
from projections.recovery import attempts_used, restart_events
from projections.siblings import (
    GroupState,
    GroupStatus,
    LedgerState,
    RuleViolation,
    fold_all,
    state_digest,
)

if TYPE_CHECKING:
    from eventlog.log import EventLog
    from eventlog.recovery.ledger import RecoveryLedger

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


class SealedSibling(msgspec.Struct, frozen=True, kw_only=True):
    """A sibling whose result survives the restore unchanged."""

    generation_index: int
    attempt: int
    rollout_id: str
    staging_keys: list[str]
    reward: float
    mask_sample: bool
    target_step: int | None


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
    sealed: list[SealedSibling]
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
        SealedSibling(
            generation_index=s.generation_index,
            attempt=s.current.attempt,
            rollout_id=s.current.rollout_id,
            staging_keys=list(s.current.staging_keys),
            reward=s.current.reward if s.current.reward is not None else 0.0,
            mask_sample=bool(s.current.mask_sample),
            target_step=group.target_step,
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


def run_restore(
    ledger: RecoveryLedger, dataset: Dataset, step: int | None
) -> tuple[RestorePlan, LedgerState, dict[str, int], RolledBack, dict[str, Prompt]]:
    """Everything `RecoveryLedger.restore` does; it adopts what this returns.

    All checks (checkpoint found, digest, granularity, reconciliation, prompt identity) run
    before anything is appended; a failure raises and appends nothing. The data plane is loaded
    first because every later check reads it.
    """
    log = ledger.log
    head = log.head()
    controller = [r for r in log.read_stream(CONTROLLER_STREAM) if r.seq <= head]
    skipped = rolled_back(controller)
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

    ledger.data_plane.load_checkpoint(
        DataPlaneCheckpoint(
            ref=ckpt.data_plane_ref,
            inventory_digest=ckpt.inventory_digest,
            row_count=ckpt.row_count,
        )
    )
    state, _ = fold_until(log, ckpt_seq, skipped)
    found = state_digest(state)
    if found != ckpt.ledger_digest:
        raise ReconciliationError(
            f"checkpoint step {ckpt.step} (seq {ckpt_seq}): the log folds to ledger digest "
            f"{found[:16]}…, the checkpoint recorded {ckpt.ledger_digest[:16]}…"
        )

    # Stored granularity, never the current config: in-flight attempts are abandoned and retried.
    group_events: list[tuple[str, list[Event]]] = []
    for group in state.groups.values():
        # Read the whole stream, rolled-back records included: numbers they used stay used.
        used = attempts_used(r.event for r in log.read_stream(group_stream(group.group_id)))
        events = restart_events(group, used)
        if events:
            group_events.append((group.group_id, events))
    try:
        for _, events in group_events:
            fold_all(state, events)
        present = ledger.data_plane.list_keys(ledger.staging_partition)
        staging = reconcile(
            state,
            present,
            _staged(log, ledger.staging_partition, present, referenced_keys(state)),
            ledger.staging_partition,
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
    prompts = {gid: _rehydrate(dataset, group) for gid, group in state.groups.items()}

    def expected(stream: str) -> ExpectedVersion:
        version = log.stream_version(stream)
        return NO_STREAM if version is None else version

    controller_version = controller[-1].version if controller else None
    (started,) = log.append_batch(
        [
            AppendRequest(
                CONTROLLER_STREAM,
                [
                    RestoreStarted(
                        checkpoint_step=ckpt.step,
                        checkpoint_seq=ckpt_seq,
                        rolled_back_from_seq=ckpt_seq + 1,
                    )
                ],
                NO_STREAM if controller_version is None else controller_version,
            )
        ]
    )
    started_seq = started.seqs[0]
    rolled = (ckpt_seq + 1, started_seq - 1)
    skipped = RolledBack([*skipped.ranges, rolled])
    plan = build_plan(
        state,
        prompts,
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
    closing.append(
        RestoreCompleted(
            checkpoint_step=ckpt.step,
            checkpoint_seq=ckpt_seq,
            rolled_back_from_seq=rolled[0],
            rolled_back_until_seq=rolled[1],
            **plan.counts,
        )
    )
    requests = [
        AppendRequest(group_stream(g), evs, expected(group_stream(g))) for g, evs in group_events
    ]
    requests.append(AppendRequest(CONTROLLER_STREAM, closing, started.versions[-1]))
    log.append_batch(requests)
    if staging.clear:
        ledger.data_plane.delete_rows(staging.partition, staging.clear)
    streams = [group_stream(g) for g in state.groups] + [CONTROLLER_STREAM, REPLAY_STREAM]
    versions = {s: v for s in streams if (v := log.stream_version(s)) is not None}
    logger.info(
        "restored checkpoint step %d (seq %d): rolled back seqs %d..%d; %s",
        ckpt.step,
        ckpt_seq,
        rolled[0],
        rolled[1],
        plan.counts,
    )
    return plan, state, versions, skipped, prompts


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
    if None in rollout_ids:
        records = log.read(types=["TokensStaged"])
    else:
        records = (
            record
            for rollout_id in sorted(r for r in rollout_ids if r is not None)
            for record in log.read_stream(attempt_stream(rollout_id))
        )
    return staged_by((r.event for r in records), partition)
