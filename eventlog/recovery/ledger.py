"""The recovery ledger: the command side of rollout recovery (docs/design.md §4, §6).

Every command takes a live cut from the mutation barrier, turns its arguments into events,
and hands them to `_commit`, the one write path: it folds them into a copy of the state (every
state-transition rule lives in `projections.siblings.fold`, the same fold a rebuild uses, which
raises typed violations that `_ledger_error` maps to LedgerRuleError / StaleAttemptError),
appends them atomically with the stream versions this ledger knows, and only then adopts the
copy. Checkpoint and restore (eventlog.recovery.checkpoint, .restore) return the events they
want appended and commit through the same path. A rejected command raises a typed error and
appends nothing.

Fencing: opening or restoring the ledger takes a fencing epoch (ControllerEpochStarted on
`controller/epoch`, conditional on the version read), and every append asserts that stream's
version in the same atomic append_batch. A superseded controller's next command fails with
ControllerFencedError naming both epochs and appends nothing; the ledger then refuses commands
until it is reopened or restored. A ledger is bound to one barrier (given, or the first cut's):
a cut of another barrier, a stale one, or anything else is refused (BarrierError).

The ledger itself keeps only the preconditions that need something the fold cannot see:

- the runtime prompt (`reserve`: prompt_id and task_name agree with the ref, fingerprint);
- the log (`_refuse_used_group_id`: a group id is used once, rolled-back history included;
  `_require_staged`: a receipt names only keys its attempt staged; `_result_group`: a result
  for a group the ledger no longer holds is stale; `_refuse_unfinished_restore`: `open`
  refuses a log whose last restore died midway);
- the data plane (`checkpoint`: every sealed row exists; `clear_superseded_rows`;
  `resolve_finalization_unknown`: the canonical rows decide). Every deletion is recorded
  first, in the same append as the fact that frees the rows where there is one (docs/design.md §7);
- the data plane's keys (`_require_own_keys`: `stage` puts and a seal names only keys named
  under the attempt, `{rollout_id}/NAME`; the data plane replaces a row put under a key it
  holds, and the fold sees no other group's keys);
- the barrier (`checkpoint` needs the exclusive cut; a fenced ledger refuses commands);
- command idempotency (`_repeat`: an identical repeat of an accepted seal is a no-op);
- a discard waits for an unknown finalization to be resolved (`_discard`: kept out of the
  fold, so that a log already holding such a discard still restores).

Superseded attempts: a late result of an attempt that is no longer current raises
`StaleAttemptError` and appends nothing, like every rejection. Because late results are normal
traffic, the controller records them for the audit with `record_rejected_result(cut, err)`,
which appends `StaleResultRejected` to the group's stream.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
from collections.abc import (
    Callable,
    Coroutine,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
    Sized,
)
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import msgspec

from eventlog import codec
from eventlog.dataplane.protocol import DataPlane, Row
from eventlog.errors import ConcurrencyError, EventLogError, InvalidEventError
from eventlog.events import Event
from eventlog.log import EventLog
from eventlog.records import (
    ANY,
    NO_STREAM,
    AppendRequest,
    AppendResult,
    ExpectedVersion,
    RecordedEvent,
)
from eventlog.recovery.barrier import Cut, MutationBarrier
from eventlog.recovery.checkpoint import (
    check_rows,
    checkpoint_event,
    delete_retired,
    fold_until,
    live_versions,
    retire_events,
    save_snapshot,
)
from eventlog.recovery.config import (
    DEFAULT_STAGING_PARTITION,
    DEFAULT_TRAINING_PARTITION,
    RecoveryConfig,
    check_staging_partition,
    resolve_granularity,
)
from eventlog.recovery.errors import (
    ControllerFencedError,
    LedgerRuleError,
    ReconciliationError,
    StaleAttemptError,
)
from eventlog.recovery.replay_ownership import ReplayOwnership
from eventlog.recovery.restore import (
    Dataset,
    GroupPlan,
    Prompt,
    RestorePlan,
    finish_restore,
    prepare_restore,
    prompt_digest,
)
from eventlog.recovery.trial import Trial
from eventlog.recovery.vocabulary import (
    CONTROLLER_STREAM,
    EPOCH_STREAM,
    AttemptFailed,
    AttemptRef,
    CheckpointCommitted,
    CheckpointRetired,
    ClearedKey,
    ControllerEpochStarted,
    FinalizationRetryable,
    FinalizationStarted,
    FinalizationUnknown,
    Granularity,
    GroupAdmitted,
    GroupDiscarded,
    GroupFinalized,
    GroupReserved,
    GroupSealed,
    PromptRef,
    Receipt,
    RestoreStarted,
    SealResult,
    SiblingResult,
    SiblingsDispatched,
    SiblingSealed,
    StagingCleared,
    StaleResultRejected,
    TokensStaged,
    attempt_stream,
    group_stream,
    staging_key_attempt,
)
from projections.history import RolledBack, controller_history, unfinished_restore
from projections.reconcile import referenced_keys
from projections.recovery import abandon_events, attempt_ref, retry_events
from projections.siblings import (
    AttemptState,
    GroupState,
    LedgerState,
    ReplayEntry,
    RuleViolation,
    StaleAttempt,
    fold,
    live_attempt,
    require_granularity,
    state_digest,
)

__all__ = ["Cut", "FinalizationInputs", "RecoveryLedger", "SiblingResult"]

logger = logging.getLogger(__name__)


Append = tuple[str, ExpectedVersion | None, Sequence[Event]]
"""One append of a commit: stream, expected version (None: the one this ledger knows), events."""


class FinalizationInputs(msgspec.Struct, frozen=True, kw_only=True):
    """What a finalizer needs, in sibling order: which rows become which canonical row."""

    group_id: str
    prompt_id: str
    target_step: int | None
    rollout_ids: list[str]
    canonical_row_ids: list[str]
    receipts: list[Receipt | None]
    rewards: list[float]
    mask_samples: list[bool]


def _check_types(event: Event) -> None:
    """The codec's own validation, so a wrong type fails as a ledger rule, not at decode."""
    try:
        codec.encode(event)
    except InvalidEventError as exc:
        group = getattr(event, "group_id", None)
        where = f"group {group!r}: " if group else ""
        raise LedgerRuleError(f"{where}{exc}") from None


def _no_epoch() -> LedgerRuleError:
    return LedgerRuleError(
        "the ledger holds no fencing epoch (opened read_only?): commands need "
        "RecoveryLedger.open(...) or restore(...)"
    )


def _ledger_error(exc: RuleViolation) -> LedgerRuleError:
    """The public error for a fold's violation (a stale attempt keeps both rollout ids)."""
    if isinstance(exc, StaleAttempt):
        return StaleAttemptError(
            str(exc),
            group_id=exc.group_id,
            generation_index=exc.generation_index,
            rollout_id=exc.rollout_id,
            current_rollout_id=exc.current_rollout_id,
        )
    return LedgerRuleError(str(exc))


@contextmanager
def _rules() -> Iterator[None]:
    """Run fold rules on behalf of a command: their violations become the ledger's errors."""
    try:
        yield
    except RuleViolation as exc:
        raise _ledger_error(exc) from None


STAGED_READS_KEPT = 65_536
"""How many attempts' staged-row reads a ledger keeps: a cache (a miss reads the log again),
bounded so that attempts which never finalize (refused, rolled back) cannot grow it for weeks."""

P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class _Pending:
    """One commit of a command: validated and folded into its trial, not yet appended."""

    requests: list[AppendRequest]
    trial: Trial
    fresh: bool
    """The trial starts over from a given base (a restore): adopting replaces the state."""
    keys: frozenset[str]
    """What it changes (state keys and streams): async commands sharing a key take turns."""


@dataclass
class _Blocking:
    """A blocking call a command makes between commits (a data-plane deletion): the blocking
    form runs it in place, the asyncio form in a thread, so the loop keeps serving others."""

    call: Callable[[], object]


Steps = Generator[_Pending | _Blocking, list[AppendResult], R]
"""A command's body: yields each commit it needs, receives the results once they are
durable, returns the command's result. `_sync` runs it blocking, `_async` awaiting. It may
also yield a `_Blocking` call (it receives an empty list back)."""


def _sync(
    body: Callable[Concatenate[RecoveryLedger, P], Steps[R]],
) -> Callable[Concatenate[RecoveryLedger, P], R]:
    """The blocking form of a command: each commit waits in the caller's thread."""

    @functools.wraps(body)
    def command(self: RecoveryLedger, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._drive(body(self, *args, **kwargs))

    command.__name__ = command.__qualname__ = body.__name__.removeprefix("_")
    return command


def _async(
    body: Callable[Concatenate[RecoveryLedger, P], Steps[R]],
) -> Callable[Concatenate[RecoveryLedger, P], Coroutine[Any, Any, R]]:
    """The asyncio form: awaits the log's group commit, so the loop keeps running and
    commands on other groups share the commit."""

    @functools.wraps(body)
    async def command(self: RecoveryLedger, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await self._drive_async(lambda: body(self, *args, **kwargs))

    command.__name__ = command.__qualname__ = body.__name__.removeprefix("_") + "_async"
    return command


class RecoveryLedger:
    """Per-group sibling/attempt ownership, recorded in the log before the controller acts.

    Every command validates first and appends nothing when it refuses (a typed error naming
    the group, sibling or attempt). A command with nothing to do (no sibling to dispatch,
    nothing to retry, abandon or clear, an identical repeat of a seal) returns quietly: an
    empty result or False, nothing appended.
    """

    def __init__(
        self,
        log: EventLog,
        data_plane: DataPlane,
        *,
        config: RecoveryConfig | None = None,
        staging_partition: str | None = None,
        barrier: MutationBarrier | None = None,
    ) -> None:
        self.log = log
        self.data_plane = data_plane
        self.config = config
        if staging_partition is None:
            staging_partition = (
                config.token_capture.staging_partition if config else DEFAULT_STAGING_PARTITION
            )
        self.staging_partition = check_staging_partition(staging_partition, "staging_partition")
        self.training_partition = DEFAULT_TRAINING_PARTITION
        """Where finalized groups' canonical rows live until they train or are evicted."""
        self._state: LedgerState | None = None
        self._versions: dict[str, int] = {}
        self._absent: set[str] = set()
        """Streams read as absent and not appended to since: not read again. Only this
        ledger appends to its streams; another writer's append makes ours fail on NO_STREAM
        and fences the ledger, as a stale entry of `_versions` does."""
        self._era = 0
        """Bumped whenever `_versions` and `_absent` start over from the log (open, restore)
        or a checkpoint drops versions (`live_versions`): a read begun before that is of the
        old view (it may predate an append of ours whose version was dropped), not kept."""
        self._skipped = RolledBack()
        self._prompts: dict[str, Prompt] = {}
        self._staged: dict[str, dict[str, int]] = {}
        """Per rollout id, what `_staged_versions` read of its attempt stream."""
        self._fenced: str | None = None
        self._read_only = False
        """Opened read_only: takes no epoch, so nothing may append or touch the data plane."""
        self._barrier = barrier
        self._superseded: ControllerFencedError | None = None
        self._fence: AppendRequest | None = None
        """The epoch assertion every command's append carries: the epoch stream at the version
        this ledger's fencing epoch sits at (None: no epoch taken). Built once per epoch."""
        self._in_flight: dict[str, asyncio.Future[list[AppendResult]]] = {}
        """Keys (groups, admissions, replay entries, streams) of async commits not yet landed."""
        self.replay = ReplayOwnership(
            self._require_state,
            self._commit,
            data_plane,
            lambda: self.training_partition,
            commit_async=self._commit_async,
        )
        """Finalized groups the replay buffer owns, by group id (eventlog.replay_ownership)."""

    # -- loading ---------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        log: EventLog,
        data_plane: DataPlane,
        *,
        config: RecoveryConfig | None = None,
        staging_partition: str | None = None,
        barrier: MutationBarrier | None = None,
        read_only: bool = False,
    ) -> RecoveryLedger:
        """A ledger holding the log's current state (rolled-back records skipped).

        This continues a run whose process stopped without losing its data plane. After a
        crash that took the data plane with it, use `restore` instead. Opening takes a new
        fencing epoch: a controller that still holds an older one can append nothing more.
        `barrier` binds the ledger to it (None: to the barrier of the first cut it is given).
        `read_only` (audits, comparisons) takes no epoch, so it fences nobody and refuses
        every command.
        """
        ledger = cls(
            log, data_plane, config=config, staging_partition=staging_partition, barrier=barrier
        )
        head, unfinished = ledger._load()
        if read_only:
            ledger._read_only = True
            return ledger
        _refuse_unfinished_restore(unfinished)
        stream, expected, events = ledger._next_epoch("open")
        (taken,) = ledger._append([AppendRequest(stream, events, expected)])
        if taken.seqs[0] != head + 1:
            # Something was appended between the fold and the epoch (by the superseded epoch,
            # or a worker): it all precedes the epoch, so folding again sees all of it.
            ledger._load()
        return ledger

    def _load(self) -> tuple[int, RecordedEvent | None]:
        """Fold the log up to its head; the head, and the RestoreStarted of a restore that
        died midway, if the log ends in one."""
        head = self.log.head()
        controller, self._skipped = controller_history(self.log, head)
        self._state, self._versions = fold_until(self.log, head, self._skipped)
        self._absent, self._era = set(), self._era + 1
        return head, unfinished_restore(controller)

    @property
    def epoch(self) -> int | None:
        """This controller's fencing epoch (None before open or restore took one)."""
        held = self._epoch_version
        return None if held is None else held + 1

    @property
    def _epoch_version(self) -> int | None:
        """Version of the epoch stream this ledger's fencing epoch sits at (None: none taken)."""
        return None if self._fence is None else cast(int, self._fence.expected_version)

    def _current_epoch(self) -> int:
        """This ledger's epoch, checked against the log's newest one: for a step that writes
        outside the log before its append (a checkpoint saves the data plane first), where
        the append's own fence would come too late. A superseded ledger writes nothing."""
        self._require_unfenced()
        held = self._epoch_version
        if held is None:
            raise _no_epoch()
        found = self.log.stream_version(EPOCH_STREAM)
        if found != held:
            raise self._supersede(held, found)
        return held + 1

    def _require_unfenced(self) -> None:
        """Refuse while this ledger knows it is superseded or stale (until reopened)."""
        if self._superseded is not None:
            raise self._superseded
        if self._fenced is not None:
            raise LedgerRuleError(
                self._fenced, hint="reopen the ledger (RecoveryLedger.open), or restore it"
            )

    def _supersede(self, held: int, found: int | None) -> ControllerFencedError:
        """Fence this ledger for good: a newer epoch (`found`) was taken than the one held."""
        self._superseded = self._fenced_error(held, found)
        self._fenced = str(self._superseded)
        return self._superseded

    def _next_epoch(self, reason: str) -> tuple[str, ExpectedVersion, list[Event]]:
        """The conditional append that takes the epoch after the newest one in the log."""
        version = self.log.stream_version(EPOCH_STREAM)
        event = ControllerEpochStarted(
            epoch=1 if version is None else version + 2,
            reason=reason,
            process=f"{socket.gethostname()}:{os.getpid()}",
        )
        return EPOCH_STREAM, NO_STREAM if version is None else version, [event]

    def _require_cut(self, cut: Cut) -> Cut:
        """A live cut of the barrier this ledger is bound to (bound by the first cut if unset)."""
        if self._barrier is None and isinstance(cut, Cut):
            self._barrier = cut.barrier
        if self._barrier is None:
            raise LedgerRuleError(
                f"expected a live barrier cut, found a {type(cut).__name__}",
                hint="async with barrier.mutation(kind) as cut: ledger.<command>(cut, ...)",
            )
        return self._barrier.require_own(cut)

    @property
    def state(self) -> LedgerState:
        """A copy of the current state (its values are immutable and shared)."""
        return self._require_state().copy()

    def group(self, group_id: str) -> GroupState:
        return self._group(self._require_state(), group_id)

    @property
    def groups(self) -> Mapping[str, GroupState]:
        """The live groups, read-only: commands update the entries they change, in place
        (a restore replaces the state: take the view again after one)."""
        return MappingProxyType(self._require_state().groups)

    def digest(self) -> str:
        return state_digest(self._require_state())

    def prompt(self, group_id: str) -> Prompt:
        """The runtime prompt of a group (given at reservation, or rehydrated by restore)."""
        found = self._prompts.get(group_id)
        if found is None:
            raise LedgerRuleError(f"group {group_id!r}: no prompt bound in this process")
        return found

    def finalization_inputs(self, group_id: str) -> FinalizationInputs:
        group = self.group(group_id)
        if group.status not in ("ready_to_finalize", "finalizing"):
            raise LedgerRuleError(f"group {group_id!r}: is {group.status}, not fully sealed")
        current = [s.current for s in group.siblings]
        return FinalizationInputs(
            group_id=group_id,
            prompt_id=group.prompt_id,
            target_step=group.target_step,
            rollout_ids=[a.rollout_id for a in current],
            canonical_row_ids=group.canonical_row_ids(),
            receipts=[a.receipt for a in current],
            rewards=[a.reward if a.reward is not None else 0.0 for a in current],
            mask_samples=[bool(a.mask_sample) for a in current],
        )

    # -- the one write path ----------------------------------------------------------------

    def _require_state(self) -> LedgerState:
        if self._state is None:
            raise LedgerRuleError(
                "the ledger holds no state yet: use RecoveryLedger.open(...) or restore(...)"
            )
        return self._state

    @staticmethod
    def _group(state: LedgerState, group_id: str) -> GroupState:
        with _rules():
            return state.group(group_id)

    def _knows(self, stream: str) -> bool:
        """Whether the ledger holds a stream's version (or knows it has none)."""
        return stream in self._versions or stream in self._absent

    def _expected(self, stream: str) -> ExpectedVersion:
        if not self._knows(stream):
            self._learn(stream, self.log.stream_version(stream), self._era)
        version = self._versions.get(stream)
        return NO_STREAM if version is None else version

    async def _expected_async(self, stream: str) -> ExpectedVersion:
        """`_expected` with its read (a stream's first) in a thread: a log read on the loop
        (a server round trip on PostgreSQL) stalled every task on it."""
        if not self._knows(stream):
            era = self._era
            version = await asyncio.to_thread(self.log.stream_version, stream)
            self._learn(stream, version, era)
        return self._expected(stream)

    def _read_version(self, stream: str) -> Steps[None]:
        """Read the version of a stream the ledger does not hold (a group that left it, named
        by a late result) as a blocking step: the asyncio form reads it in a thread, as
        `_expected_async` does, not on the loop."""
        if self._knows(stream):
            return
        era = self._era
        found: list[int | None] = []
        (yield _Blocking(lambda: found.append(self.log.stream_version(stream))))
        self._learn(stream, found[0], era)

    def _learn(self, stream: str, version: int | None, era: int) -> None:
        """What a read found, unless an append of ours landed on the stream meanwhile, or
        the ledger started over from the log (a restore) or dropped versions (a checkpoint)
        since the read began (`era`)."""
        if self._knows(stream):
            return
        if era != self._era:
            return
        if version is None:
            self._absent.add(stream)
        else:
            self._versions[stream] = version

    def _prepare(
        self,
        cut: Cut,
        appends: Sequence[Append],
        *,
        base: LedgerState | None = None,
        folded: LedgerState | None = None,
    ) -> _Pending:
        """Validate by folding into a trial of the state; nothing is appended yet.

        The trial is an overlay over the live state (eventlog.recovery.trial): it costs what
        the command changes, not the groups held. `base` is the state to fold into instead of
        this ledger's (a restore's checkpoint state); adopting it also lifts the fence, since
        a restore starts over from the log. `folded`: the state these very appends already
        folded into from `base` (a restore's `restored`, validated while it prepared): it is
        adopted as it is instead of folding every restart event a second time.
        """
        self._require_cut(cut)
        if base is None:
            self._require_unfenced()
        trial = Trial(self._require_state() if base is None else base)
        if folded is not None:
            trial.take(folded)
        else:
            with _rules():
                for _, _, events in appends:
                    for event in events:
                        _check_types(event)
                        fold(trial.state, event)
        requests = [
            AppendRequest(s, list(evs), self._expected(s) if v is None else v)
            for s, v, evs in appends
            if evs
        ]
        streams = frozenset(f"stream:{r.stream}" for r in requests)
        return _Pending(requests, trial, base is not None, trial.touched() | streams)

    def _adopt(self, pending: _Pending) -> None:
        """The append is durable: make the trial live (only the keys it touched)."""
        if pending.fresh:
            self._state = pending.trial.materialize()
            self._fenced = None
            self._superseded = None
        else:
            pending.trial.adopt()

    def _commit_now(self, pending: _Pending) -> list[AppendResult]:
        results = self._append(pending.requests)
        self._adopt(pending)
        return [r for r in results if r.stream != EPOCH_STREAM]

    async def _commit_later(self, pending: _Pending) -> list[AppendResult]:
        fenced = self._with_fence(pending.requests)
        try:
            results = await self.log.append_batch_async(fenced)
        except ConcurrencyError as exc:
            raise self._conflict(exc, fenced) from None
        self._landed(results)
        self._adopt(pending)
        return [r for r in results if r.stream != EPOCH_STREAM]

    def _drive(self, steps: Steps[R]) -> R:
        """Run a command's body, blocking on each commit (the sync form)."""
        try:
            pending = next(steps)
            while True:
                if isinstance(pending, _Blocking):
                    try:
                        pending.call()
                    except Exception as exc:
                        pending = steps.throw(exc)
                        continue
                    pending = steps.send([])
                    continue
                busy = sorted(k for k in pending.keys if k in self._in_flight)
                if busy:
                    steps.close()
                    raise LedgerRuleError(
                        f"{busy[0]}: an async command on it is in flight",
                        hint="await the async form of the command instead",
                    )
                try:
                    results = self._commit_now(pending)
                except EventLogError as exc:
                    pending = steps.throw(exc)  # the body may handle it (restore does)
                    continue
                pending = steps.send(results)
        except StopIteration as done:
            return cast(R, done.value)

    async def _drive_async(self, start: Callable[[], Steps[R]]) -> R:
        """Run a command's body, awaiting each commit (group commit shares it with others).

        Commands that change the same group, admission, replay entry or stream are
        serialized: one whose keys are in flight waits for them, then validates again against
        what they adopted. A caller cancelled while its commit is pending does not stop the
        commit: it is adopted when it lands, as if the caller had waited.

        A waiting command first waits until the keys its last try named are all free: when a
        commit lands, every command queued behind it wakes, and only the first to run may
        validate again (the others find the keys taken again by then). Running every waiting
        body again on each landing cost the loop waiters x landings folds (and log reads).
        """
        keys: frozenset[str] = frozenset()
        while True:
            while busy := self._busy(keys):
                await asyncio.wait(busy)
            steps = start()
            try:
                pending = next(steps)
                while isinstance(pending, _Blocking):  # reads before its first commit
                    failed = await self._off_loop(pending)
                    pending = steps.send([]) if failed is None else steps.throw(failed)
            except StopIteration as done:
                return cast(R, done.value)
            if not self._busy(pending.keys):
                break
            steps.close()
            keys = pending.keys
        try:
            while True:
                if isinstance(pending, _Blocking):
                    failed = await self._off_loop(pending)
                    pending = steps.send([]) if failed is None else steps.throw(failed)
                    continue
                commit = asyncio.ensure_future(self._commit_later(pending))
                for key in pending.keys:
                    self._in_flight[key] = commit
                commit.add_done_callback(functools.partial(self._release, pending.keys))
                try:
                    results = await asyncio.shield(commit)
                except EventLogError as exc:
                    pending = steps.throw(exc)  # the body may handle it (restore does)
                    continue
                pending = steps.send(results)
        except StopIteration as done:
            return cast(R, done.value)

    @staticmethod
    async def _off_loop(call: _Blocking) -> Exception | None:
        """Run a body's blocking call in a thread; its error, to throw into the body."""
        try:
            await asyncio.to_thread(call.call)
        except Exception as exc:
            return exc
        return None

    def _busy(self, keys: frozenset[str]) -> set[asyncio.Future[list[AppendResult]]]:
        """The commits in flight that hold any of `keys`."""
        return {self._in_flight[k] for k in keys if k in self._in_flight}

    def _release(self, keys: frozenset[str], commit: asyncio.Future[list[AppendResult]]) -> None:
        """A commit finished (adopted, or refused): commands waiting on its keys go on."""
        for key in keys:
            if self._in_flight.get(key) is commit:
                del self._in_flight[key]
        if not commit.cancelled():
            commit.exception()  # retrieved here too: a cancelled caller never will

    def _group_commit(self, cut: Cut, group_id: str, events: Sequence[Event]) -> _Pending:
        return self._prepare(cut, [(group_stream(group_id), None, events)])

    def _commit(
        self, cut: Cut, appends: Sequence[Append], *, base: LedgerState | None = None
    ) -> list[AppendResult]:
        """Validate, append atomically, adopt, blocking: for callers outside a command
        (the replay buffer's ownership). Nothing to append commits nothing, on a live cut."""
        if not appends:
            self._require_cut(cut)
            return []
        return self._drive(self._commit_steps(cut, appends, base=base))

    def _commit_steps(
        self, cut: Cut, appends: Sequence[Append], *, base: LedgerState | None = None
    ) -> Steps[list[AppendResult]]:
        results = yield self._prepare(cut, appends, base=base)
        return results

    async def _commit_async(
        self, cut: Cut, appends: Callable[[], Sequence[Append]]
    ) -> list[AppendResult]:
        """`_commit` awaiting the group commit (the replay buffer's asyncio forms).

        `appends` is asked again when the commit had to wait for commands in flight on its
        keys, so it decides on what they adopted; nothing to append commits nothing.
        """

        def steps() -> Steps[list[AppendResult]]:
            chosen = [a for a in appends() if a[2]]
            if not chosen:
                self._require_cut(cut)  # nothing to do is refused all the same on a bad cut
                return []
            results = yield self._prepare(cut, chosen)
            return results

        return await self._drive_async(steps)

    def _append(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        """One atomic append_batch, conditional on this ledger's fencing epoch.

        The epoch stream is asserted first, with no events (the log's "append nothing, but
        require stream S at version v"), unless the batch takes a new epoch itself; so a
        superseded controller fails on the epoch, not on whichever stream it touched. An
        asyncio form sends `_with_fence(requests)` with append_batch_async and hands the outcome
        to `_conflict` / `_landed` the same way.
        """
        fenced = self._with_fence(requests)
        try:
            results = self.log.append_batch(fenced)
        except ConcurrencyError as exc:
            raise self._conflict(exc, fenced) from None
        self._landed(results)
        return results

    def _with_fence(self, requests: Sequence[AppendRequest]) -> list[AppendRequest]:
        """`requests` with the epoch assertion in front (unless they take a new epoch)."""
        for request in requests:
            if request.stream == EPOCH_STREAM:
                return list(requests)
        fence = self._fence
        if fence is None:
            raise _no_epoch()
        return [fence, *requests]

    def _conflict(
        self, exc: ConcurrencyError, requests: Sequence[AppendRequest]
    ) -> ConcurrencyError:
        """Fence this ledger after a failed append: superseded (the epoch) or stale."""
        asserted = requests[0] if requests else None
        held = self._epoch_version
        if (
            exc.stream == EPOCH_STREAM
            and asserted is not None
            and asserted.stream == EPOCH_STREAM
            and not asserted.events
            and held is not None
        ):
            return self._supersede(held, exc.actual)
        self._fenced = f"another writer appended to stream {exc.stream!r}; this ledger is stale"
        return exc

    def _landed(self, results: Sequence[AppendResult]) -> None:
        """Adopt the stream versions (and a new epoch) an append landed at."""
        for result in results:
            if result.versions:
                self._versions[result.stream] = result.versions[-1]
                self._absent.discard(result.stream)
            if result.stream == EPOCH_STREAM and result.versions:
                # built once per epoch: every command sends this same (immutable) request
                self._fence = AppendRequest(EPOCH_STREAM, (), result.versions[-1])

    def _fenced_error(self, held: int, found: int | None) -> ControllerFencedError:
        """Name both epochs, and who took the newer one (the epoch stream's last record)."""
        by = ""
        newest = next(self.log.read_stream_backwards(EPOCH_STREAM, page_size=1), None)
        if newest is not None and isinstance(newest.event, ControllerEpochStarted):
            by = f" at seq {newest.seq} by {newest.event.process or '?'} ({newest.event.reason})"
        return ControllerFencedError(
            EPOCH_STREAM,
            held_epoch=held + 1,
            current_epoch=(found if found is not None else -1) + 1,
            by=by,
        )

    # -- commands: reservation and admission -----------------------------------------------

    def _reserve(
        self,
        cut: Cut,
        *,
        group_id: str,
        prompt: Prompt,
        prompt_ref: PromptRef,
        expected_generations: int,
        start_weight_version: int,
        admitted: bool,
        target_step: int | None = None,
        admission_id: str | None = None,
        granularity: str | None = None,
        agent_name: str | None = None,
        fingerprint: bool = True,
    ) -> Steps[GroupState]:
        """Record that a prompt left the dataloader as a group; fixes its granularity for good.

        `prompt` must carry its identity: `prompt_id` (and `task_name` equal to the ref's).
        `granularity` None resolves it from the ledger's config (agent beats task beats
        default); the stored value is used by every later failure, retry and restore.
        `fingerprint` stores a digest of the prompt's JSON content, so a restore also refuses
        a dataset whose prompt changed under the same id; turn it off for prompts that are
        not JSON (tensors): identity is then prompt_id and task_name only.
        """
        self._require_cut(cut)
        state = self._require_state()
        where = f"group {group_id!r}"
        prompt_id = prompt.get("prompt_id") if isinstance(prompt, Mapping) else None
        if not isinstance(prompt_id, str) or not prompt_id:
            raise LedgerRuleError(f"{where}: prompt['prompt_id'] must be a non-empty string")
        if prompt.get("task_name") != prompt_ref.task_name:
            raise LedgerRuleError(
                f"{where}: prompt_ref.task_name is {prompt_ref.task_name!r} but the prompt's "
                f"task_name is {prompt.get('task_name')!r}"
            )
        if granularity is None:
            if self.config is None:
                raise LedgerRuleError(
                    f"{where}: no granularity given and the ledger has no config to resolve it"
                )
            granularity = resolve_granularity(self.config, prompt).value
        if agent_name is None:
            agent_name = _agent_name(prompt)
        try:
            digest = prompt_digest(prompt) if fingerprint else None
        except (TypeError, msgspec.EncodeError) as exc:
            raise LedgerRuleError(
                f"{where}: the prompt cannot be fingerprinted: {exc}",
                hint="pass fingerprint=False to check identity by prompt_id and task_name only",
            ) from None
        if group_id not in state.groups:
            self._refuse_used_group_id(group_id)
        event = GroupReserved(
            group_id=group_id,
            admission_id=admission_id if admission_id is not None else group_id,
            prompt_ref=prompt_ref,
            prompt_id=prompt_id,
            prompt_hash=digest,
            agent_name=agent_name,
            granularity=str(granularity),  # type: ignore[arg-type]  # checked by _check_types
            expected_generations=expected_generations,
            target_step=target_step,
            start_weight_version=start_weight_version,
            admitted=admitted,
        )
        (yield self._group_commit(cut, group_id, [event]))
        self._prompts[group_id] = prompt
        return self.group(group_id)

    reserve = _sync(_reserve)
    reserve_async = _async(_reserve)

    def _refuse_used_group_id(self, group_id: str) -> None:
        """A group id names one group forever, even when its reservation was rolled back.

        Its attempt streams (`attempt/<group_id>_g<i>`) outlive a restore, so a second group
        under the same id would mint rollout ids that already name other physical runs.
        """
        if self._expected(group_stream(group_id)) is NO_STREAM:
            return
        for rec in self.log.read_stream(group_stream(group_id)):
            rolled_back = " (rolled back by a restore)" if rec.seq in self._skipped else ""
            raise LedgerRuleError(
                f"group {group_id!r}: the id was already used (stream {rec.stream!r} has "
                f"{rec.type} at seq {rec.seq}{rolled_back}); a group id is used once",
                hint="reserve the prompt again under a new group id",
            )

    def _admit(
        self, cut: Cut, admission_id: str, *, target_step: int | None, start_weight_version: int
    ) -> Steps[list[str]]:
        """Stamp every reserved group of one admission at once; admission happens once."""
        self._require_cut(cut)  # a command with nothing to do is refused all the same
        state = self._require_state()
        members = state.admissions.get(admission_id, ())
        pending = [g for g in members if state.groups[g].phase == "reserved"]
        if not pending and members:
            stamped = {
                (state.groups[g].target_step, state.groups[g].start_weight_version) for g in members
            }
            if stamped == {(target_step, start_weight_version)}:
                return []  # an identical repeat: quietly, like every command with nothing to do
            raise LedgerRuleError(
                f"admission {admission_id!r} is already admitted (target step, weight version: "
                f"{sorted(stamped, key=str)}), not at ({target_step}, {start_weight_version})"
            )
        if not pending:
            raise LedgerRuleError(f"admission {admission_id!r} has no group in the ledger")
        events = [
            GroupAdmitted(
                group_id=g,
                admission_id=admission_id,
                target_step=target_step,
                start_weight_version=start_weight_version,
            )
            for g in pending
        ]
        (yield self._prepare(cut, [(group_stream(e.group_id), None, [e]) for e in events]))
        return pending

    admit = _sync(_admit)
    admit_async = _async(_admit)

    # -- commands: generation --------------------------------------------------------------

    def _dispatch(
        self, cut: Cut, group_id: str, generation_indices: Iterable[int] | None = None
    ) -> Steps[list[AttemptRef]]:
        """Hand reserved attempts to workers; None means every reserved sibling."""
        self._require_cut(cut)  # a command with nothing to do is refused all the same
        group = self.group(group_id)
        wanted = (
            group.indices("reserved") if generation_indices is None else list(generation_indices)
        )
        if not wanted:
            return []  # nothing to dispatch: quietly, like every command with nothing to do
        with _rules():
            refs = [attempt_ref(index, group.sibling(index).current) for index in wanted]
        (
            yield self._group_commit(
                cut, group_id, [SiblingsDispatched(group_id=group_id, attempts=refs)]
            )
        )
        return refs

    dispatch = _sync(_dispatch)
    dispatch_async = _async(_dispatch)

    @staticmethod
    def _attempt(group: GroupState, index: int, rollout_id: str) -> AttemptState:
        """The attempt a result names (the fold's stale-attempt rule, StaleAttemptError)."""
        with _rules():
            return live_attempt(group, index, rollout_id)

    def check_result(self, group_id: str, generation_index: int, rollout_id: str) -> AttemptState:
        """The current attempt a worker result names; StaleAttemptError when it was superseded.

        For a controller that buffers `prompt_group` results until every sibling is in: a late
        result is recognised (and can be recorded with `record_rejected_result`) when it
        arrives, not only when the whole group is sealed. Appends nothing.
        """
        group = self._result_group(group_id, generation_index, rollout_id)
        return self._attempt(group, generation_index, rollout_id)

    def _result_group(self, group_id: str, generation_index: int, rollout_id: str) -> GroupState:
        """The group a worker result names; StaleAttemptError when the ledger no longer holds it.

        A group that left the ledger (finalized, discarded) or was rolled back by a restore
        still has its stream in the log: a result for it is late, not unknown (needs the log).
        """
        state = self._require_state()
        stream = group_stream(group_id)
        if group_id in state.groups:
            return self.group(group_id)
        era = self._era
        version = self.log.stream_version(stream)
        if version is not None:
            self._learn(stream, version, era)  # where the late result's record will append
            why = "finalized" if group_id in state.replay else "discarded or rolled back"
            raise StaleAttemptError(
                f"group {group_id!r}, sibling {generation_index}: the group was {why}; the "
                f"result of {rollout_id!r} is rejected",
                group_id=group_id,
                generation_index=generation_index,
                rollout_id=rollout_id,
                current_rollout_id=None,
            )
        return self.group(group_id)

    def _fail_attempt(
        self, cut: Cut, group_id: str, generation_index: int, *, rollout_id: str, error: str
    ) -> Steps[AttemptRef]:
        """Record that a dispatched attempt ended without a sealable result."""
        group = self._result_group(group_id, generation_index, rollout_id)
        attempt = self._attempt(group, generation_index, rollout_id)
        event = AttemptFailed(
            group_id=group_id,
            generation_index=generation_index,
            attempt=attempt.attempt,
            rollout_id=rollout_id,
            error=error,
        )
        (yield self._group_commit(cut, group_id, [event]))
        return attempt_ref(generation_index, attempt)

    fail_attempt = _sync(_fail_attempt)
    fail_attempt_async = _async(_fail_attempt)

    def _seal_sibling(
        self,
        cut: Cut,
        group_id: str,
        generation_index: int,
        *,
        rollout_id: str,
        receipt: Receipt | None,
        reward: float,
        mask_sample: bool,
    ) -> Steps[bool]:
        """Accept one attempt's result (`sibling` granularity). False: an identical repeat."""
        self._require_cut(cut)  # a command with nothing to do is refused all the same
        yield from self._read_staged([receipt])
        group = self._result_group(group_id, generation_index, rollout_id)
        attempt = self._attempt(group, generation_index, rollout_id)
        result = SealResult(
            generation_index=generation_index,
            attempt=attempt.attempt,
            rollout_id=rollout_id,
            receipt=receipt,
            reward=reward,
            mask_sample=mask_sample,
        )
        if attempt.status == "sealed":
            return self._repeat(group, [result], Granularity.SIBLING, "seal one sibling")
        event = SiblingSealed(
            group_id=group_id,
            generation_index=generation_index,
            attempt=attempt.attempt,
            rollout_id=rollout_id,
            receipt=receipt,
            reward=reward,
            mask_sample=mask_sample,
            weight_versions=self._require_staged(group_id, generation_index, receipt),
        )
        (yield self._group_commit(cut, group_id, [event]))
        return True

    seal_sibling = _sync(_seal_sibling)
    seal_sibling_async = _async(_seal_sibling)

    def _seal_group(self, cut: Cut, group_id: str, results: Sequence[SiblingResult]) -> Steps[bool]:
        """Accept every sibling's result at once (`prompt_group`); validated whole first."""
        self._require_cut(cut)  # a command with nothing to do is refused all the same
        yield from self._read_staged([r.receipt for r in results])
        group = (
            self._result_group(group_id, results[0].generation_index, results[0].rollout_id)
            if results
            else self.group(group_id)
        )
        sealed = []
        for r in results:
            attempt = self._attempt(group, r.generation_index, r.rollout_id)
            sealed.append(
                SealResult(
                    generation_index=r.generation_index,
                    attempt=attempt.attempt,
                    rollout_id=r.rollout_id,
                    receipt=r.receipt,
                    reward=r.reward,
                    mask_sample=r.mask_sample,
                )
            )
        if group.status != "generating" and sealed:
            return self._repeat(group, sealed, Granularity.PROMPT_GROUP, "seal the whole group")
        sealed = [
            msgspec.structs.replace(
                s, weight_versions=self._require_staged(group_id, s.generation_index, s.receipt)
            )
            for s in sealed
        ]
        (yield self._group_commit(cut, group_id, [GroupSealed(group_id=group_id, results=sealed)]))
        return True

    seal_group = _sync(_seal_group)
    seal_group_async = _async(_seal_group)

    def _require_staged(self, group_id: str, index: int, receipt: Receipt | None) -> list[int]:
        """Every key of a receipt was staged by the attempt it names (its TokensStaged records).

        Needs the attempt's stream, so it is the ledger's precondition, not a fold rule; a key
        another sibling owns is the fold's rule (`projections.siblings._sealed`). Returns the
        policy versions those calls used, ascending (recorded in the seal).
        """
        if receipt is None or not receipt.staging_keys:
            return []
        _require_own_keys(
            receipt.rollout_id, receipt.staging_keys, f"group {group_id!r}, sibling {index}: "
        )
        staged = self._staged_versions(receipt)
        unstaged = [k for k in receipt.staging_keys if k not in staged]
        if unstaged:
            raise LedgerRuleError(
                f"group {group_id!r}, sibling {index}: the receipt of {receipt.rollout_id!r} "
                f"names staging keys that attempt never staged in partition "
                f"{self.staging_partition!r}: {unstaged}",
                hint="a receipt lists the keys of the attempt's own TokensStaged records",
            )
        return sorted({staged[k] for k in receipt.staging_keys})

    def _staged_versions(self, receipt: Receipt | None) -> dict[str, int]:
        """staging key -> weight version, from the TokensStaged records of the receipt's attempt.

        Kept from the seal's read until the group leaves (finalize reads every sibling's
        again, on the loop); the log is read again whenever a receipt names a key not kept.
        """
        if receipt is None or not receipt.staging_keys:
            return {}
        kept = self._staged.get(receipt.rollout_id)
        if kept is not None and all(k in kept for k in receipt.staging_keys):
            return kept
        found = {
            ev.staging_key: ev.weight_version
            for r in self.log.read_stream(attempt_stream(receipt.rollout_id))
            if isinstance(ev := r.event, TokensStaged)
            and ev.partition == self.staging_partition
            and ev.rollout_id == receipt.rollout_id
        }
        if len(self._staged) >= STAGED_READS_KEPT:
            self._staged.clear()
        self._staged[receipt.rollout_id] = found
        return found

    def _read_staged(self, receipts: Iterable[Receipt | None]) -> Steps[None]:
        """Read the attempt streams of receipts not read yet, as a blocking step (the asyncio
        form reads them in a thread: a read on the loop waits for the server)."""
        unread = [
            r
            for r in receipts
            if r is not None
            and r.staging_keys
            and not all(k in self._staged.get(r.rollout_id, ()) for k in r.staging_keys)
        ]
        if unread:
            (yield _Blocking(lambda: [self._staged_versions(r) for r in unread]))

    async def read_staged_async(self, receipt: Receipt | None) -> None:
        """Read, in a thread, the attempt stream a seal of `receipt` checks, so the seal finds
        it kept and reads nothing: a caller that serializes the seals of one group (the
        controller) reads before it waits its turn, and holds the group for the commit only.
        A failed read is left to the seal, which reads again and reports it."""
        for call in self._read_staged([receipt]):
            if isinstance(call, _Blocking):  # (it yields nothing else)
                await self._off_loop(call)

    def _forget_staged(self, group: GroupState) -> None:
        for sibling in group.siblings:
            for attempt in sibling.attempts:
                self._staged.pop(attempt.rollout_id, None)

    def _weight_versions(self, group: GroupState) -> list[list[int]]:
        """Per sibling, the policy versions its sealed attempt's staged calls used."""
        found = []
        for s in group.siblings:
            staged = self._staged_versions(s.current.receipt)
            found.append(sorted({staged[k] for k in s.current.staging_keys if k in staged}))
        return found

    @staticmethod
    def _repeat(
        group: GroupState, results: Sequence[SealResult], method: Granularity, action: str
    ) -> bool:
        """An identical repeat of an accepted seal is a no-op; anything else is a conflict.

        The seal method must still fit the group (the fold's rule, checked here because a
        repeat never reaches the fold).
        """
        with _rules():
            require_granularity(group, method, action)
        for r in results:
            held = group.siblings[r.generation_index].current
            if (held.status, held.receipt, held.reward, held.mask_sample) != (
                "sealed",
                r.receipt,
                r.reward,
                r.mask_sample,
            ):
                raise LedgerRuleError(
                    f"group {group.group_id!r}, sibling {r.generation_index}: conflicting "
                    f"duplicate seal of {r.rollout_id!r} (sealed reward={held.reward}, "
                    f"mask_sample={held.mask_sample}, receipt={held.receipt}; new reward="
                    f"{r.reward}, mask_sample={r.mask_sample}, receipt={r.receipt})"
                )
        return False

    def _record_rejected_result(self, cut: Cut, error: StaleAttemptError) -> Steps[None]:
        """Make a rejected late result visible in the audit (StaleResultRejected)."""
        event = StaleResultRejected(
            group_id=error.group_id,
            generation_index=error.generation_index,
            rollout_id=error.rollout_id,
            current_rollout_id=error.current_rollout_id,
            reason=str(error),
        )
        yield from self._read_version(group_stream(error.group_id))
        (yield self._group_commit(cut, error.group_id, [event]))

    record_rejected_result = _sync(_record_rejected_result)
    record_rejected_result_async = _async(_record_rejected_result)

    def _abandon_unsealed(self, cut: Cut, group_id: str, *, reason: str) -> Steps[list[AttemptRef]]:
        """A live failure: `sibling` abandons in-flight unsealed attempts, `prompt_group` all."""
        self._require_cut(cut)  # a command with nothing to do is refused all the same
        events = abandon_events(self.group(group_id), reason)
        if events:
            (yield self._group_commit(cut, group_id, events))
        return [ref for e in events for ref in e.attempts]  # type: ignore[attr-defined]

    abandon_unsealed = _sync(_abandon_unsealed)
    abandon_unsealed_async = _async(_abandon_unsealed)

    def _prepare_retry(self, cut: Cut, group_id: str) -> Steps[list[AttemptRef]]:
        """Mint the next attempt for every failed or abandoned sibling (none: no-op)."""
        self._require_cut(cut)
        events = retry_events(self.group(group_id))
        if events:
            (yield self._group_commit(cut, group_id, events))
        return [ref for e in events for ref in e.attempts]  # type: ignore[attr-defined]

    prepare_retry = _sync(_prepare_retry)
    prepare_retry_async = _async(_prepare_retry)

    # -- commands: finalization and discard ------------------------------------------------

    def _start_finalization(
        self, cut: Cut, group_id: str, *, owner: str
    ) -> Steps[FinalizationInputs]:
        """Claim a fully sealed group for finalization; the owner is recorded."""
        (
            yield self._group_commit(
                cut, group_id, [FinalizationStarted(group_id=group_id, owner=owner)]
            )
        )
        return self.finalization_inputs(group_id)

    start_finalization = _sync(_start_finalization)
    start_finalization_async = _async(_start_finalization)

    def _finalize(
        self, cut: Cut, group_id: str, *, owner: str, min_weight_version: int | None
    ) -> Steps[ReplayEntry]:
        """The canonical rows exist: the group leaves the ledger for the replay buffer.

        Its staging rows are no longer needed: GroupFinalized lists them (which keys, staged
        by which attempt; its target step) and the rows are deleted after it is appended (log
        first, delete after; a crash in between leaves rows the next restore clears again).
        One record, not GroupFinalized plus a StagingCleared: a second record in the append
        was most of what the clean-up cost a finalize (issue 8, bench/README.md "Cleanup").
        """
        yield from self._read_staged(s.current.receipt for s in self.group(group_id).siblings)
        group = self.group(group_id)
        versions = self._weight_versions(group)
        cleared = [
            ClearedKey(key=key, rollout_id=s.current.rollout_id)
            for s in group.siblings
            for key in s.current.staging_keys
        ]
        event = GroupFinalized(
            group_id=group_id,
            owner=owner,
            prompt_id=group.prompt_id,
            target_step=group.target_step,
            canonical_row_ids=group.canonical_row_ids(),
            min_weight_version=min_weight_version,
            weight_versions=versions,
            staging_partition=self.staging_partition if cleared else None,
            staging_cleared=cleared,
        )
        (yield self._group_commit(cut, group_id, [event]))
        entry = self._require_state().replay[group_id]
        self._prompts.pop(group_id, None)
        self._forget_staged(group)
        if cleared:
            keys = [c.key for c in cleared]
            (yield _Blocking(lambda: self.data_plane.delete_rows(self.staging_partition, keys)))
        return entry

    finalize = _sync(_finalize)
    finalize_async = _async(_finalize)

    def _resolve_finalization_unknown(
        self, cut: Cut, group_id: str, *, owner: str | None = None
    ) -> Steps[str]:
        """Settle a finalization_unknown group by the canonical partition (needs the data plane).

        Every canonical row there: the finalization did happen, record GroupFinalized
        ("finalized"). Otherwise record FinalizationRetryable, clearing any partial rows after
        the append ("retryable"): the group is ready to finalize again. `owner` defaults to
        the recorded finalization owner.
        """
        group = self.group(group_id)
        if group.status != "finalization_unknown":
            raise LedgerRuleError(
                f"group {group_id!r}: is {group.status}, not finalization_unknown",
                hint="only a group marked finalization_unknown needs resolving",
            )
        owner = owner or group.finalization_owner or ""
        rows = group.canonical_row_ids()
        present = self.data_plane.list_keys(self.training_partition)
        found = [r for r in rows if r in present]
        if len(found) == len(rows):
            oldest = min((v for vs in self._weight_versions(group) for v in vs), default=None)
            (yield from self._finalize(cut, group_id, owner=owner, min_weight_version=oldest))
            return "finalized"
        missing = [r for r in rows if r not in present]
        event = FinalizationRetryable(
            group_id=group_id,
            owner=owner,
            reason=f"canonical rows {missing} are not in partition {self.training_partition!r}",
            canonical_rows_cleared=found,
        )
        (yield self._group_commit(cut, group_id, [event]))
        if found:
            self.data_plane.delete_rows(self.training_partition, found)
        return "retryable"

    resolve_finalization_unknown = _sync(_resolve_finalization_unknown)
    resolve_finalization_unknown_async = _async(_resolve_finalization_unknown)

    def _mark_finalization_unknown(
        self, cut: Cut, group_id: str, *, owner: str, error: str
    ) -> Steps[None]:
        """Finalization failed ambiguously: no checkpoint until a person resolves it."""
        event = FinalizationUnknown(group_id=group_id, owner=owner, error=error)
        (yield self._group_commit(cut, group_id, [event]))

    mark_finalization_unknown = _sync(_mark_finalization_unknown)
    mark_finalization_unknown_async = _async(_mark_finalization_unknown)

    def _discard(self, cut: Cut, group_id: str, *, reason: str) -> Steps[list[str]]:
        """Drop a group untrained; clears the staging rows it owned (after the append)."""
        group = self.group(group_id)
        if group.status == "finalization_unknown":
            # Its canonical rows may be written, and a discard names only staging rows: they
            # stayed in the training partition with no record. Not a fold rule, so that a
            # log holding such a discard still restores.
            raise LedgerRuleError(
                f"group {group_id!r}: cannot discard it while its finalization is unknown",
                hint="settle it first: resolve_finalization_unknown "
                "(`eventlog resolve-finalization`)",
            )
        keys = group.staging_keys()
        event = GroupDiscarded(group_id=group_id, reason=reason, staging_keys=keys)
        (yield self._group_commit(cut, group_id, [event]))
        self._prompts.pop(group_id, None)
        self._forget_staged(group)
        if keys:
            (yield _Blocking(lambda: self.data_plane.delete_rows(self.staging_partition, keys)))
        return keys

    discard = _sync(_discard)
    discard_async = _async(_discard)

    def _discard_if_few_valid_rows(self, cut: Cut, group_id: str) -> Steps[str | None]:
        """Discard a fully sealed group whose fraction of valid rows is below the threshold.

        A valid row is a sibling that trains (mask_sample false); the threshold is the config's
        `rollout_recovery.min_valid_row_fraction` (0 or no config: never). Returns the
        recorded reason when the group was discarded (GroupDiscarded, rows cleared), else None.
        """
        self._require_cut(cut)  # a command with nothing to do is refused all the same
        group = self.group(group_id)
        recovery = self.config.rollout_recovery if self.config else None
        threshold = recovery.min_valid_row_fraction if recovery else 0.0
        if group.status != "ready_to_finalize" or threshold <= 0.0:
            return None
        valid = sum(1 for s in group.siblings if s.current.mask_sample is False)
        fraction = valid / group.expected_generations
        if fraction >= threshold:
            return None
        reason = (
            f"valid-row fraction {valid}/{group.expected_generations} = {fraction:.3f} is below "
            f"rollout_recovery.min_valid_row_fraction {threshold}"
        )
        (yield from self._discard(cut, group_id, reason=reason))
        return reason

    discard_if_few_valid_rows = _sync(_discard_if_few_valid_rows)
    discard_if_few_valid_rows_async = _async(_discard_if_few_valid_rows)

    def _clear_superseded_rows(
        self,
        cut: Cut,
        *,
        reason: str = "rows of failed or abandoned attempts",
        step: int | None = None,
    ) -> Steps[list[ClearedKey]]:
        """Delete the staging rows no live attempt can still need, during a run.

        A row that no sealed sibling owns and whose `rollout_id` tag names an attempt that is
        not live (not the current, reserved or dispatched attempt of a group the ledger holds):
        failed, abandoned or superseded attempts, whether or not their group is still held
        (finalized, discarded and rolled-back groups included). Without it such rows wait for
        the next restore, and a long run keeps them all, in every checkpoint. Untagged rows are
        left to the restore's reconciliation. Appended first, deleted after: a crash in
        between leaves rows the log calls cleared, which the next restore clears again.
        """
        self._require_cut(cut)
        state = self._require_state()
        present = self.data_plane.list_keys(self.staging_partition)
        owned = referenced_keys(state)
        live = {
            s.current.rollout_id
            for group in state.groups.values()
            for s in group.siblings
            if s.current.status in ("reserved", "dispatched")
        }
        tagged = {
            key: rid
            for key, tags in sorted(present.items())
            if key not in owned and (rid := tags.get("rollout_id")) and rid not in live
        }
        # A tag naming no attempt the log knows (no stream) was not written by our workers.
        known = {
            rid
            for rid in set(tagged.values())
            if self.log.stream_version(attempt_stream(rid)) is not None
        }
        cleared = [ClearedKey(key=k, rollout_id=r) for k, r in tagged.items() if r in known]
        never = [k for k, r in tagged.items() if r not in known]
        if cleared or never:
            event = StagingCleared(
                partition=self.staging_partition,
                of_attempts=cleared,
                never_staged=never,
                reason=reason,
                step=step,
            )
            (yield self._prepare(cut, [(CONTROLLER_STREAM, None, [event])]))
            self.data_plane.delete_rows(self.staging_partition, list(tagged))
        return cleared

    clear_superseded_rows = _sync(_clear_superseded_rows)
    clear_superseded_rows_async = _async(_clear_superseded_rows)

    # -- checkpoint and restore ------------------------------------------------------------

    def _checkpoint(
        self, cut: Cut, *, step: int, directory: str, keep: int | None = None
    ) -> Steps[CheckpointCommitted]:
        """A consistent cut of ledger, data plane and log (inside `barrier.checkpoint()`).

        Refuses while a group is finalizing or finalization_unknown, checks every sealed
        staging row exists, saves the data plane's checkpoint into a fresh folder under
        `directory` (which may be reused), appends CheckpointCommitted and stores a projection
        snapshot at its seq. `keep`: then retire all but the newest `keep` checkpoints
        (`retire_checkpoints`). The crash points are walked in DURABILITY.md §9.
        """
        self._require_cut(cut)
        require_checkpoint_folder(directory)
        if not cut.exclusive:
            raise LedgerRuleError(
                "checkpoint needs the barrier's exclusive checkpoint cut, found a mutation cut",
                hint="async with barrier.checkpoint() as cut: ledger.checkpoint(cut, ...)",
            )
        state = self._require_state()
        event = checkpoint_event(
            state,
            self.data_plane,
            self.staging_partition,
            self.log,
            step=step,
            directory=directory,
            epoch=self._current_epoch(),
            training_partition=self.training_partition,
        )
        (result,) = yield self._prepare(cut, [(CONTROLLER_STREAM, None, [event])])
        seq = result.seqs[0]
        state = self._require_state()
        self._versions = live_versions(state, self._versions)
        self._era += 1  # a read begun before may predate an append whose version went
        save_snapshot(self.log, seq, state, self._versions)
        logger.info(
            "checkpoint step %d at seq %d: %d groups, %d data-plane rows",
            step,
            seq,
            event.group_count,
            event.row_count,
        )
        if keep is not None:
            (yield from self._retire_checkpoints(cut, keep=keep))
        return event

    checkpoint = _sync(_checkpoint)
    checkpoint_async = _async(_checkpoint)

    def _retire_checkpoints(self, cut: Cut, *, keep: int) -> Steps[list[CheckpointRetired]]:
        """Give up every checkpoint but the newest `keep` (and rolled-back ones): one
        CheckpointRetired each, appended before its data-plane checkpoint is deleted.

        A retired checkpoint is never restored again. Run it after a checkpoint commits, so
        the newest committed one is always kept; a crash after the append leaves files that
        the next call deletes.
        """
        self._require_cut(cut)
        controller = list(self.log.read_stream(CONTROLLER_STREAM))
        events = retire_events(controller, self._skipped, keep=keep)
        if events:
            (yield self._prepare(cut, [(CONTROLLER_STREAM, None, events)]))
        already = [
            r.event
            for r in controller
            if isinstance(r.event, CheckpointRetired) and Path(r.event.data_plane_ref).exists()
        ]
        delete_retired([*already, *events])
        return events

    retire_checkpoints = _sync(_retire_checkpoints)
    retire_checkpoints_async = _async(_retire_checkpoints)

    def check_rows(self) -> None:
        """Every staging key a sealed attempt owns must be in the data plane (fail closed)."""
        check_rows(self._require_state(), self.data_plane, self.staging_partition)

    def _restore(
        self, cut: Cut, dataset: Dataset, *, step: int | None = None
    ) -> Steps[RestorePlan]:
        """Go back to a checkpoint (the newest with `step`, or the newest of all when None).

        Loads the checkpoint's data plane, folds the log up to the checkpoint, checks
        everything, then commits RestoreStarted (its seq closes the rolled-back range) and, in
        one atomic step, each group's restart events (by its stored granularity) with
        StagingCleared and RestoreCompleted; reconciles the staging rows and rehydrates every
        prompt, then returns the plan (see eventlog.recovery.restore).
        """
        self._require_cut(cut)
        if self._read_only:  # a restore takes an epoch and reloads the data plane it holds
            raise LedgerRuleError(
                "a read-only ledger cannot restore: it would take a fencing epoch (fencing "
                "the controller) and load a checkpoint into the data plane it was given",
                hint="restore with RecoveryLedger(log, data_plane).restore(cut, dataset)",
            )
        prepared = prepare_restore(
            self.log,
            self.data_plane,
            self.staging_partition,
            dataset,
            step,
            training_partition=self.training_partition,
        )
        try:
            (started,) = yield self._prepare(
                cut,
                # RestoreStarted first: its seq closes the rolled-back range; the epoch follows.
                [prepared.start, self._next_epoch("restore")],
                base=prepared.state,
            )
            plan, skipped, appends = finish_restore(prepared, started.seqs[0], started.versions[-1])
            self._versions = {**prepared.versions, CONTROLLER_STREAM: started.versions[-1]}
            # Absences read before the restore may be of streams appended since (by a
            # controller this restore fences): read again when asked.
            self._absent, self._era = set(), self._era + 1
            self._skipped = skipped
            self._prompts = dict(prepared.prompts)
            # The restart events were folded (and every rule checked) into `restored` from
            # the checkpoint state this ledger now holds: adopted as folded, not folded again.
            (yield self._prepare(cut, appends, folded=prepared.restored))
        except ConcurrencyError as exc:
            self._fenced = f"another writer appended to stream {exc.stream!r} during restore"
            raise
        except BaseException as exc:
            # RestoreStarted may have landed without its closing append: the state this
            # ledger adopted is the checkpoint's, whose attempts ran after it (as `open`
            # refuses such a log, this ledger refuses every command but a restore).
            self._fenced = f"the restore did not complete ({type(exc).__name__}): restore again"
            raise
        if plan.staging.clear:
            self.data_plane.delete_rows(plan.staging.partition, plan.staging.clear)
        if prepared.canonical_orphans:
            self.data_plane.delete_rows(self.training_partition, prepared.canonical_orphans)
        return plan

    restore = _sync(_restore)
    restore_async = _async(_restore)

    # -- one call each: what a controller author reaches for --------------------------------

    def stage(self, rollout_id: str, rows: Mapping[str, Row], *, weight_version: int) -> Receipt:
        """Stage an attempt's rows in one call; returns the receipt to seal it with.

        Puts the rows (keyed `{rollout_id}/NAME`, as `vocabulary.staging_key` names them)
        into the staging partition, each tagged with `rollout_id`, then, once the data plane
        acknowledged them, appends one TokensStaged per row to the attempt's stream: restore
        clears rows by these records.
        A row's token count is the length of its `token_ids`. Workers call it outside the
        barrier; not while a checkpoint saves the data plane.
        """
        if self._read_only:  # it would put rows and append, outside any epoch
            raise LedgerRuleError(
                f"attempt {rollout_id!r}: a read-only ledger cannot stage rows",
                hint="stage through the run's ledger (RecoveryLedger.open or restore)",
            )
        keys = list(rows)
        if not keys:
            return Receipt(rollout_id=rollout_id, staging_keys=[])
        _require_own_keys(rollout_id, keys, "")
        tags = {key: {"rollout_id": rollout_id, "call": str(call)} for call, key in enumerate(keys)}
        self.data_plane.put_rows(self.staging_partition, rows, tags)
        staged = [
            TokensStaged(
                rollout_id=rollout_id,
                partition=self.staging_partition,
                staging_key=key,
                token_count=_token_count(rows[key]),
                weight_version=weight_version,
            )
            for key in keys
        ]
        self.log.append(attempt_stream(rollout_id), staged, ANY)
        return Receipt(rollout_id=rollout_id, staging_keys=keys)

    def _fail(
        self, cut: Cut, group_id: str, generation_index: int, *, rollout_id: str, error: str
    ) -> Steps[list[AttemptRef]]:
        """A live failure in one call: record it, retry by the group's granularity, dispatch.

        `sibling`: only the failed sibling reruns; its siblings keep running. `prompt_group`:
        every unsealed sibling is abandoned and all rerun under one new attempt number.
        Returns the dispatched retries (hand them to workers). A failure of an attempt that
        is no longer current raises StaleAttemptError and appends nothing.
        """
        (
            yield from self._fail_attempt(
                cut, group_id, generation_index, rollout_id=rollout_id, error=error
            )
        )
        if self.group(group_id).granularity == Granularity.PROMPT_GROUP:
            reason = f"sibling {generation_index} failed ({rollout_id}): {error}"
            (yield from self._abandon_unsealed(cut, group_id, reason=reason))
        retries = yield from self._prepare_retry(cut, group_id)
        return (yield from self._dispatch(cut, group_id, [r.generation_index for r in retries]))

    fail = _sync(_fail)
    fail_async = _async(_fail)

    def unused_group_id(self, base: str) -> str:
        """`base`, else `base-r1`, `base-r2`, ...: the first id no group ever used.

        A group id names one group forever, even when a restore rolled its reservation back
        (its attempt streams outlive it), so a dataloader prompt reserved again after such a
        restore takes the id this returns.
        """
        candidate, n = base, 0
        while self._expected(group_stream(candidate)) is not NO_STREAM:
            n += 1
            candidate = f"{base}-r{n}"
        return candidate

    async def unused_group_id_async(self, base: str) -> str:
        """`unused_group_id` reading the log in a thread; the reserve that follows it finds
        the stream's absence known and reads nothing on the loop."""
        candidate, n = base, 0
        while await self._expected_async(group_stream(candidate)) is not NO_STREAM:
            n += 1
            candidate = f"{base}-r{n}"
        return candidate

    def _admit_restored(
        self, cut: Cut, plan: RestorePlan, *, target_step: int, start_weight_version: int
    ) -> Steps[list[GroupPlan]]:
        """Every group a restore plan brings back, as one list to resume: admitted groups as
        they were, and reserved ones admitted now (each admission once, at `target_step`)."""
        for admission in plan.reserved:
            (
                yield from self._admit(
                    cut,
                    admission.admission_id,
                    target_step=target_step,
                    start_weight_version=start_weight_version,
                )
            )
        return [*plan.admitted, *(group for a in plan.reserved for group in a.groups)]

    admit_restored = _sync(_admit_restored)
    admit_restored_async = _async(_admit_restored)


def _token_count(row: Row) -> int:
    ids = row.get("token_ids")
    return len(ids) if isinstance(ids, Sized) else 0


def require_checkpoint_folder(directory: str) -> None:
    """A checkpoint directory is a folder (or not there yet), refused before anything is saved.

    It may be reused: the data plane is saved into a fresh folder under it
    (`checkpoint.checkpoint_location`), never into the files of a checkpoint the log names.
    """
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise LedgerRuleError(
            f"checkpoint directory {directory!r} is a file, not a folder (nothing was appended)"
        )


def _agent_name(prompt: Prompt) -> str | None:
    extra = prompt.get("extra_env_info")
    if isinstance(extra, Mapping):
        ref = extra.get("agent_ref")
        if isinstance(ref, Mapping) and isinstance(ref.get("name"), str):
            return str(ref["name"])
    return None


def _require_own_keys(rollout_id: str, keys: Sequence[str], where: str) -> None:
    """Every key is named under `rollout_id` (`staging_key_attempt`): a row put under a key
    another attempt's row holds replaces that row, which its seal still owns."""
    foreign = [
        key for key in keys if not isinstance(key, str) or staging_key_attempt(key) != rollout_id
    ]
    if foreign:
        raise LedgerRuleError(
            f"{where}staging keys {foreign} are not named under attempt {rollout_id!r}",
            hint=f"key each row of an attempt {rollout_id}/NAME (vocabulary.staging_key)",
        )


def _refuse_unfinished_restore(found: RecordedEvent | None) -> None:
    """Opening after a restore that died midway would dispatch rollout ids its rolled-back
    records already ran, and leave the checkpoint's in-flight attempts dispatched with no
    worker: only a restore gives those up and numbers past them."""
    if found is not None:
        assert isinstance(found.event, RestoreStarted)
        raise ReconciliationError(
            f"the restore to the checkpoint of step {found.event.checkpoint_step} "
            f"(RestoreStarted at seq {found.seq}) did not complete",
            hint="restore again (RecoveryLedger.restore, or the controller's restart), not open",
        )
