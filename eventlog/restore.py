"""What a restore hands the controller: the restore plan, and the prompt identity check.

The plan says, per group, exactly which generation indices to redispatch (with the attempt
numbers the restore minted) and which sealed siblings are kept as they were: attempt, rollout
id, rows, reward, target step. Admitted groups come first: they may be the only work that can
advance the trainer and open the sampler's gate; reserved groups follow, one entry per
admission, to be admitted exactly once each.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from eventlog.errors import PromptIdentityError
from eventlog.events import AttemptRef, Granularity
from projections.reconcile import Reconciliation
from projections.siblings import GroupState, GroupStatus, LedgerState

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
