"""The rollout-recovery vocabulary: every fact of a prompt group's life, as frozen, tagged events.

Tags are the class names and never change (old logs stay readable); schema evolution follows
`eventlog.events`.
"""

from __future__ import annotations

import enum
import re
from typing import Annotated, ClassVar, NamedTuple

import msgspec

from eventlog.events import Event, event_type

# ---------------------------------------------------------------------------------------------
# Rollout recovery: identities, value types, and the events of each stream.
#
# Streams: `group/<group_id>` (controller: one prompt group's lifecycle), `controller`
# (checkpoints, restores, staging clean-up), `attempt/<rollout_id>` (workers: one physical
# run of a sibling), `replay` (who owns a finalized group until it trains or is evicted).
# Events carry ids, never list positions, and values, never references to live objects.
# ---------------------------------------------------------------------------------------------

CONTROLLER_STREAM = "controller"
REPLAY_STREAM = "replay"
EPOCH_STREAM = "controller/epoch"
"""Fencing: one ControllerEpochStarted per controller incarnation; epoch n sits at version n-1."""


class Granularity(enum.StrEnum):
    """What a failure abandons and a retry redispatches: one sibling, or every sibling of a group.

    A `StrEnum`, so a member equals its stored string and stored logs decode unchanged.
    """

    SIBLING = "sibling"
    PROMPT_GROUP = "prompt_group"


NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
Index = Annotated[int, msgspec.Meta(ge=0)]


def group_stream(group_id: str) -> str:
    """The stream holding one prompt group's lifecycle."""
    return f"group/{group_id}"


def attempt_stream(rollout_id: str) -> str:
    """The stream a worker writes while it runs one attempt."""
    return f"attempt/{rollout_id}"


def logical_id(group_id: str, generation_index: int) -> str:
    """A sibling's logical id; it never changes across attempts (and names its canonical row)."""
    return f"{group_id}_g{generation_index}"


def rollout_id_for(group_id: str, generation_index: int, attempt: int) -> str:
    """The rollout id of one attempt: the logical id for attempt 0, `{logical}-a{n}` after."""
    base = logical_id(group_id, generation_index)
    return base if attempt == 0 else f"{base}-a{attempt}"


def staging_key(rollout_id: str, call: int) -> str:
    """The data-plane key of one call's row: unique per attempt and call, stable on reruns."""
    return f"{rollout_id}/c{call}"


def staging_key_attempt(key: str) -> str:
    """The attempt a staging key is named under: the key up to its last `/`. Each key names
    one attempt, so two attempts' rows never share one (the data plane replaces a row put
    under a key it holds, and another group's sealed row was lost so)."""
    return key.rpartition("/")[0]


class RolloutId(NamedTuple):
    """The parts a rollout id is built from (`rollout_id_for` is the inverse)."""

    group_id: str
    generation_index: int
    attempt: int


_ROLLOUT_ID = re.compile(r"(?P<group>.+)_g(?P<index>\d+)(?:-a(?P<attempt>[1-9]\d*))?", re.DOTALL)


def parse_rollout_id(rollout_id: str) -> RolloutId | None:
    """Group, sibling and attempt of a rollout id built by `rollout_id_for`; None otherwise."""
    match = _ROLLOUT_ID.fullmatch(rollout_id)
    if match is None:
        return None
    parsed = RolloutId(match["group"], int(match["index"]), int(match["attempt"] or 0))
    return parsed if rollout_id_for(*parsed) == rollout_id else None  # e.g. no leading zeros


class PromptRef(msgspec.Struct, frozen=True, kw_only=True):
    """Where the prompt comes from: a durable locator, never the prompt itself."""

    sample_id: NonEmpty
    task_name: str | None


class Receipt(msgspec.Struct, frozen=True, kw_only=True):
    """What an attempt produced: its rollout id and its staging keys, in call order."""

    rollout_id: NonEmpty
    staging_keys: list[NonEmpty]


class AttemptRef(msgspec.Struct, frozen=True, kw_only=True):
    """One attempt of one sibling, named by value (index, attempt number and rollout id)."""

    generation_index: Index
    attempt: Index
    rollout_id: NonEmpty


class SiblingResult(msgspec.Struct, frozen=True, kw_only=True):
    """One sibling's result as a worker reports it (`RecoveryLedger.seal_group`'s input).

    With `SealResult` it is the one documented pair of sibling-result types: this one names
    the attempt by rollout id only, `SealResult` is what the ledger stores once it checked
    which attempt that is. A worker's full report (failures, token counts) is
    `eventlog.rollout.worker.AttemptResult`. mask_sample has no default on purpose.
    """

    generation_index: int
    rollout_id: str
    receipt: Receipt | None
    reward: float
    mask_sample: bool


class SealResult(msgspec.Struct, frozen=True, kw_only=True):
    """One sibling's accepted result: stored in a GroupSealed, kept by a restore plan.

    mask_sample has no default on purpose.
    """

    generation_index: Index
    attempt: Index
    rollout_id: NonEmpty
    receipt: Receipt | None
    reward: float
    mask_sample: bool
    weight_versions: list[int] = msgspec.field(default_factory=list)
    """Policy versions the attempt's staged calls used, ascending (the ledger fills it in from
    the attempt's TokensStaged records; empty in logs written before it existed)."""


# --- stream group/<group_id> -----------------------------------------------------------------


@event_type
class GroupReserved(Event, frozen=True, kw_only=True):
    """A prompt left the dataloader as a group of siblings; its granularity is fixed here."""

    schema: ClassVar[int] = 1
    group_id: NonEmpty
    admission_id: NonEmpty
    prompt_ref: PromptRef
    prompt_id: NonEmpty
    prompt_hash: str | None
    agent_name: str | None
    granularity: Granularity
    expected_generations: Annotated[int, msgspec.Meta(ge=1)]
    target_step: int | None
    start_weight_version: int
    admitted: bool


@event_type
class GroupAdmitted(Event, frozen=True, kw_only=True):
    """The sampler stamped a reserved group (one admission at a time) with its target step."""

    schema: ClassVar[int] = 1
    group_id: NonEmpty
    admission_id: NonEmpty
    target_step: int | None
    start_weight_version: int


@event_type
class SiblingsDispatched(Event, frozen=True, kw_only=True):
    """Reserved attempts were handed to rollout workers."""

    schema: ClassVar[int] = 1
    group_id: NonEmpty
    attempts: list[AttemptRef]


@event_type
class AttemptFailed(Event, frozen=True, kw_only=True):
    """A dispatched attempt ended without a result the controller can seal."""

    schema: ClassVar[int] = 1
    group_id: NonEmpty
    generation_index: Index
    attempt: Index
    rollout_id: NonEmpty
    error: str


@event_type
class SiblingSealed(Event, frozen=True, kw_only=True):
    """The controller accepted one attempt's result as the sibling's result (`sibling` only)."""

    schema: ClassVar[int] = 1
    group_id: NonEmpty
    generation_index: Index
    attempt: Index
    rollout_id: NonEmpty
    receipt: Receipt | None
    reward: float
    mask_sample: bool
    weight_versions: list[int] = msgspec.field(default_factory=list)
    """Policy versions the attempt's staged calls used, ascending (see SealResult)."""


@event_type
class GroupSealed(Event, frozen=True, kw_only=True):
    """Every sibling's result accepted at once (`prompt_group` only): all or nothing."""

    schema: ClassVar[int] = 1
    group_id: NonEmpty
    results: list[SealResult]


@event_type
class UnsealedAbandoned(Event, frozen=True, kw_only=True):
    """Unsealed attempts were given up (`sibling`); sealed siblings keep their results."""

    schema: ClassVar[int] = 1
    group_id: NonEmpty
    attempts: list[AttemptRef]
    reason: str


@event_type
class GroupAbandoned(Event, frozen=True, kw_only=True):
    """Every current attempt of a `prompt_group` group was given up; all will rerun."""

    schema: ClassVar[int] = 1
    group_id: NonEmpty
    attempts: list[AttemptRef]
    reason: str


@event_type
class RetryPrepared(Event, frozen=True, kw_only=True):
    """Fresh attempts were minted for siblings whose current attempt failed or was abandoned."""

    schema: ClassVar[int] = 1
    group_id: NonEmpty
    attempts: list[AttemptRef]


@event_type
class FinalizationStarted(Event, frozen=True, kw_only=True):
    """A fully sealed group is being turned into training rows by `owner`."""

    schema: ClassVar[int] = 1
    group_id: NonEmpty
    owner: NonEmpty


@event_type
class GroupFinalized(Event, frozen=True, kw_only=True):
    """The group's canonical rows exist; it leaves the ledger and the replay buffer owns it."""

    schema: ClassVar[int] = 1
    group_id: NonEmpty
    owner: NonEmpty
    prompt_id: NonEmpty
    target_step: int | None
    canonical_row_ids: list[NonEmpty]
    min_weight_version: int | None
    weight_versions: list[list[int]] = msgspec.field(default_factory=list)
    """Per sibling, the policy versions its sealed attempt used (empty in older logs)."""
    staging_partition: str | None = None
    """Where `staging_cleared` lived (None: nothing cleared here, as in older logs, which
    recorded the clean-up as a StagingCleared in the same append)."""
    staging_cleared: list[ClearedKey] = msgspec.field(default_factory=list)
    """The sealed attempts' staging rows, deleted from the data plane after this record:
    which keys, staged by which attempt; why is the finalization itself, the step its
    `target_step`. Recorded in this record, not in one more: a finalize is one record."""


@event_type
class FinalizationUnknown(Event, frozen=True, kw_only=True):
    """Finalization failed in a way that may or may not have written rows: needs a person."""

    schema: ClassVar[int] = 1
    group_id: NonEmpty
    owner: NonEmpty
    error: str


@event_type
class FinalizationRetryable(Event, frozen=True, kw_only=True):
    """An unknown finalization was resolved: its canonical rows are not all there, so the
    group is ready to finalize again (any partial rows were cleared, listed here)."""

    schema: ClassVar[int] = 1
    group_id: NonEmpty
    owner: NonEmpty
    reason: str
    canonical_rows_cleared: list[NonEmpty] = msgspec.field(default_factory=list)


@event_type
class GroupDiscarded(Event, frozen=True, kw_only=True):
    """The group was dropped without training; the staging keys it owned were cleared."""

    schema: ClassVar[int] = 1
    group_id: NonEmpty
    reason: str
    staging_keys: list[NonEmpty]


@event_type
class StaleResultRejected(Event, frozen=True, kw_only=True):
    """A result arrived for an attempt that is no longer current; it was not sealed."""

    schema: ClassVar[int] = 1
    group_id: NonEmpty
    generation_index: Index
    rollout_id: NonEmpty
    current_rollout_id: str | None
    reason: str


# --- stream controller -----------------------------------------------------------------------


@event_type
class CheckpointCommitted(Event, frozen=True, kw_only=True):
    """A consistent cut: ledger state, data-plane checkpoint and the log position it covers."""

    schema: ClassVar[int] = 1
    step: int
    data_plane_ref: str
    inventory_digest: str
    row_count: Annotated[int, msgspec.Meta(ge=0)]
    ledger_digest: str
    group_count: Annotated[int, msgspec.Meta(ge=0)]
    covers_seq: Annotated[int, msgspec.Meta(ge=0)]
    """The log's head when the cut was taken; the chain value below is that record's."""
    chain: str
    """Hex chain value at `covers_seq` ('' for an empty log): an anchor against truncation."""
    projection_version: str | None = None
    """The projection version `ledger_digest` was computed by (None: before versions)."""


@event_type
class CheckpointRetired(Event, frozen=True, kw_only=True):
    """An older checkpoint was given up after a newer one was committed; its data-plane
    checkpoint is deleted after this is appended (`deleted` false: it was not one the ledger
    created in a fresh location, so it is left where it is). It counts even when a later
    restore rolls this record back: its files may already be gone."""

    schema: ClassVar[int] = 1
    step: int
    checkpoint_seq: Annotated[int, msgspec.Meta(ge=1)]
    data_plane_ref: str
    deleted: bool
    reason: str


@event_type
class RestoreStarted(Event, frozen=True, kw_only=True):
    """A restore went back to a checkpoint: records from `rolled_back_from_seq` up to this one
    are rolled back (kept for audits, skipped by every rebuild)."""

    schema: ClassVar[int] = 1
    checkpoint_step: int
    checkpoint_seq: Annotated[int, msgspec.Meta(ge=1)]
    rolled_back_from_seq: Annotated[int, msgspec.Meta(ge=1)]


class ClearedKey(msgspec.Struct, frozen=True, kw_only=True):
    """A staging row that was cleared, with the attempt that staged it."""

    key: NonEmpty
    rollout_id: NonEmpty


@event_type
class StagingCleared(Event, frozen=True, kw_only=True):
    """Unreferenced staging rows were deleted from the data plane."""

    schema: ClassVar[int] = 1
    partition: NonEmpty
    of_attempts: list[ClearedKey]
    """Rows a worker staged (TokensStaged) for an attempt that no sealed sibling owns."""
    never_staged: list[NonEmpty]
    """Rows no TokensStaged event and no rollout_id tag names: written outside the protocol."""
    reason: str
    step: int | None = None
    """The step the clean-up belongs to (a finalized group's target step, a checkpoint's)."""


def cleared_of_attempts(event: Event) -> list[ClearedKey]:
    """The attempts' staging rows a record clears: a StagingCleared's `of_attempts`, or a
    GroupFinalized's `staging_cleared` (a finalize is one record); none for any other."""
    if isinstance(event, StagingCleared):
        return event.of_attempts
    if isinstance(event, GroupFinalized):
        return event.staging_cleared
    return []


@event_type
class RowsCleared(Event, frozen=True, kw_only=True):
    """Canonical (training) rows were deleted from the data plane: trained, evicted, orphaned.

    Appended before the delete, or in the same atomic append as the fact that frees the rows
    (ReplayConsumed, ReplayEvicted): a crash in between leaves rows the log calls cleared,
    which the next restore deletes again (docs/design.md §7).
    """

    schema: ClassVar[int] = 1
    partition: NonEmpty
    keys: list[NonEmpty]
    reason: str
    step: int | None = None
    group_ids: list[NonEmpty] = msgspec.field(default_factory=list)


@event_type
class RestoreCompleted(Event, frozen=True, kw_only=True):
    """A restore finished; the counts say how much work it kept and how much reruns."""

    schema: ClassVar[int] = 1
    checkpoint_step: int
    checkpoint_seq: int
    rolled_back_from_seq: int
    rolled_back_until_seq: int
    groups_restored: int
    siblings_reused: int
    siblings_redispatched: int
    rows_cleared: int
    snapshots_untrusted: int = 0
    """Snapshots of another projection version the restore did not use (it folded instead)."""
    records_folded: int = 0
    """Log records folded to reach the checkpoint (0: its snapshot was used as is)."""
    digest_compared: bool = True
    """False when the checkpoint's ledger digest is of another projection version."""
    projection_version: str | None = None
    """The projection version of the code that restored (None: before versions)."""


@event_type
class ControllerEpochStarted(Event, frozen=True, kw_only=True):
    """A controller opened or restored the ledger and took fencing epoch `epoch`.

    Every later ledger append asserts the epoch stream is still at this event's version, in
    the same atomic append, so a superseded controller's next command appends nothing.
    """

    schema: ClassVar[int] = 1
    epoch: Annotated[int, msgspec.Meta(ge=1)]
    reason: NonEmpty
    """`open` or `restore`."""
    process: str = ""
    """host:pid of the controller, for the audit."""


# --- stream attempt/<rollout_id> (written by workers) ----------------------------------------

ParamValue = str | int | float | bool | None


@event_type
class GenerationStarted(Event, frozen=True, kw_only=True):
    """A worker began one attempt."""

    schema: ClassVar[int] = 1
    rollout_id: NonEmpty
    group_id: NonEmpty
    generation_index: Index
    attempt: Index
    worker: str
    model: str
    weight_version: int
    sampling_params: dict[str, ParamValue] = msgspec.field(default_factory=dict)


@event_type
class TokensStaged(Event, frozen=True, kw_only=True):
    """The data plane acknowledged one call's token row under `staging_key`."""

    schema: ClassVar[int] = 1
    rollout_id: NonEmpty
    partition: NonEmpty
    staging_key: NonEmpty
    token_count: Annotated[int, msgspec.Meta(ge=0)]
    weight_version: int


@event_type
class GenerationProgress(Event, frozen=True, kw_only=True):
    """A worker is still generating an attempt, inside a model call: tokens so far.

    Written at a bounded rate (at most one per attempt per worker progress interval), so a
    long call shows in `tail -f`; an attempt whose last progress grows old is stuck. Only
    audits read it: no fold's state depends on it.
    """

    schema: ClassVar[int] = 1
    rollout_id: NonEmpty
    call: Index
    token_count: Annotated[int, msgspec.Meta(ge=0)]
    """Tokens the model generated for the attempt so far, over all its calls."""
    weight_version: int
    """The worker's weight version when this was written (a sync may change it mid-call)."""


@event_type
class GenerationFinished(Event, frozen=True, kw_only=True):
    """A worker finished an attempt; the controller decides whether to seal it."""

    schema: ClassVar[int] = 1
    rollout_id: NonEmpty
    finish_reason: str
    token_count: Annotated[int, msgspec.Meta(ge=0)]
    reward: float | None
    staging_keys: list[NonEmpty]


@event_type
class GenerationFailed(Event, frozen=True, kw_only=True):
    """A worker gave up an attempt."""

    schema: ClassVar[int] = 1
    rollout_id: NonEmpty
    error: str


# --- stream replay ---------------------------------------------------------------------------


@event_type
class ReplaySelected(Event, frozen=True, kw_only=True):
    """Finalized groups were picked to train `step` (by id, never by buffer position)."""

    schema: ClassVar[int] = 1
    group_ids: list[NonEmpty]
    step: int


@event_type
class ReplayReleased(Event, frozen=True, kw_only=True):
    """Selected groups went back to the buffer untrained (the step failed or was cancelled)."""

    schema: ClassVar[int] = 1
    group_ids: list[NonEmpty]
    reason: str


@event_type
class ReplayConsumed(Event, frozen=True, kw_only=True):
    """Selected groups were trained on at `step`; the buffer no longer owns them."""

    schema: ClassVar[int] = 1
    group_ids: list[NonEmpty]
    step: int


@event_type
class ReplayEvicted(Event, frozen=True, kw_only=True):
    """Finalized groups were dropped untrained (too stale for the sampler)."""

    schema: ClassVar[int] = 1
    group_ids: list[NonEmpty]
    reason: str


# --- stream outbox (acknowledgements to the agent environment) -------------------------------

OUTBOX_STREAM = "outbox"
"""Acknowledgements of sealed results; never rolled back: a send is a fact outside the run."""


@event_type
class AcknowledgementPending(Event, frozen=True, kw_only=True):
    """A sealed result is owed an acknowledgement to the agent environment that produced it.

    `key` is the idempotency key the receiver is told: one per result (log id and rollout
    id), so a re-send after a crash is recognised by the receiver.
    """

    schema: ClassVar[int] = 1
    key: NonEmpty
    group_id: NonEmpty
    generation_index: Index
    rollout_id: NonEmpty
    reward: float
    mask_sample: bool
    sealed_seq: Annotated[int, msgspec.Meta(ge=1)]
    """The seal's record: while a restore has rolled it back, nothing is sent."""


@event_type
class AcknowledgementDelivered(Event, frozen=True, kw_only=True):
    """The receiver accepted the acknowledgement `key`: it is never sent again."""

    schema: ClassVar[int] = 1
    key: NonEmpty
    pending_seq: Annotated[int, msgspec.Meta(ge=1)]
