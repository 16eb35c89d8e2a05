"""The controller loop: prompt groups out to rollout workers, results sealed, steps trained.

Each step the controller reserves K prompt groups of N siblings (one admission, stamped with
the step they will train), dispatches every sibling to the worker pool, and seals results as
they come back: one by one for `sibling` groups, all at once for `prompt_group` groups. A
failed or killed attempt is retried by the group's stored granularity: `sibling` reruns that
sibling only, `prompt_group` abandons every sibling and reruns them all; results of attempts
that were superseded meanwhile are rejected and recorded (StaleResultRejected). A fully
sealed group is finalized into canonical training rows once none of its attempts is still
running; when every group of a step is finalized, the step trains (the replay buffer selects
and consumes them by id) and a checkpoint is taken inside the barrier's exclusive section.

The loop runs `lookahead` steps ahead (asynchronous RL): the next step's groups generate while
the current one finishes, with lower priority, so a checkpoint usually finds them half done.
That is what a restore is for: after a crash the controller goes back to the newest
checkpoint (log + data plane) and redispatches exactly the siblings the restore plan names.

Every change is a ledger command; the controller never writes the log any other way.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from eventlog.dataplane.protocol import DataPlane
from eventlog.errors import EventLogError
from eventlog.log import EventLog
from eventlog.recovery.barrier import Cut, MutationBarrier
from eventlog.recovery.config import RecoveryConfig
from eventlog.recovery.errors import ConfigError, LedgerRuleError, StaleAttemptError
from eventlog.recovery.ledger import RecoveryLedger
from eventlog.recovery.outbox import AckReceiver, Outbox
from eventlog.recovery.restore import GroupPlan, Prompt, RestorePlan
from eventlog.recovery.vocabulary import (
    AttemptRef,
    PromptRef,
    SiblingResult,
    rollout_id_for,
)
from eventlog.rollout.faults import FaultPlan, WorkerKilled
from eventlog.rollout.pool import AttemptSkipped, RolloutPool, WorkerPool
from eventlog.rollout.rows import TRAINING_PARTITION, StepReport, canonical_rows, step_report
from eventlog.rollout.sampling import Sampling, TokenEngine
from eventlog.rollout.settings import LoopSettings
from eventlog.rollout.worker import AttemptResult

__all__ = ["Controller", "LoopSettings", "PromptSource", "RunReport", "StepReport"]

logger = logging.getLogger(__name__)


class PromptSource(Protocol):
    """The dataset as the controller sees it: which samples make a step, and each by id."""

    def get(self, sample_id: str) -> Prompt: ...

    def sample_ids(self, step: int, count: int) -> list[str]:
        """The samples that become step `step`'s prompt groups, in group order (stable)."""
        ...


@dataclass
class RunReport:
    """What one controller process did (the log holds the full story)."""

    started_at_step: int = 0
    restore: RestorePlan | None = None
    steps: list[StepReport] = field(default_factory=list)
    rejected_results: int = 0
    retried_attempts: int = 0
    discarded_groups: list[str] = field(default_factory=list)
    replaced_workers: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class _Group:
    """What the controller keeps in memory about one group (the ledger owns its state)."""

    group_id: str
    step: int
    order: int
    sample_id: str
    text: str
    agent: str | None
    granularity: str
    settled: asyncio.Future[str]
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    buffered: dict[int, AttemptResult] = field(default_factory=dict)
    """prompt_group results of current attempts, until every sibling's is in."""
    discard_reason: str | None = None
    settling: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One result or failure handled at a time: its ledger commands form one sequence."""


def prompt_text(prompt: Prompt) -> str:
    text = prompt.get("text")
    if not isinstance(text, str) or not text:
        raise ConfigError(
            f"prompt {prompt.get('prompt_id')!r}: expected a non-empty 'text', found {text!r}"
        )
    return text


class Controller:
    """One controller process: a fresh run from checkpoint 0, or a restore and the rest of it."""

    def __init__(
        self,
        *,
        log: EventLog,
        data_plane: DataPlane,
        engine: TokenEngine | None,
        source: PromptSource,
        config: RecoveryConfig,
        settings: LoopSettings,
        checkpoint_dir: str | os.PathLike[str],
        faults: FaultPlan | None = None,
        owner: str | None = None,
        restore_step: int | None = None,
        pool: RolloutPool | None = None,
        acknowledge: AckReceiver | None = None,
    ) -> None:
        if config.rollout_recovery is None:
            raise ConfigError(
                "rollout_recovery: the controller needs the section (it resolves granularity)"
            )
        self.log = log
        self.data_plane = data_plane
        self.source = source
        self.config = config
        self.settings = settings
        self.checkpoint_dir = Path(checkpoint_dir)
        self.owner = owner or f"controller@{socket.gethostname()}:{os.getpid()}"
        self.restore_step = restore_step
        """Which checkpoint a restart goes back to: its step, or None for the newest."""
        self.staging = config.token_capture.staging_partition
        self.faults = faults or FaultPlan()
        """Injected faults; the controller tells it of each seal (a stall may wait for one)."""
        self.barrier = MutationBarrier("controller")
        self.pool: RolloutPool
        if pool is not None:  # e.g. rollout actors (eventlog.rollout.actor.ActorPool)
            self.pool = pool
        elif engine is None:
            raise ConfigError("controller: pass an engine (in-process workers) or a pool")
        else:
            self.pool = WorkerPool(
                engine,
                log,
                data_plane,
                workers=settings.workers,
                slots=settings.slots,
                partition=self.staging,
                faults=self.faults,
            )
        self.report = RunReport()
        self.acknowledge = acknowledge
        """Where sealed results are acknowledged exactly once (the agent environment), if any."""
        self.outbox: Outbox | None = None
        self._ledger: RecoveryLedger | None = None
        self._groups: dict[str, _Group] = {}
        self._steps: dict[int, list[str]] = {}
        self._crash: asyncio.Future[None] | None = None

    @property
    def ledger(self) -> RecoveryLedger:
        if self._ledger is None:
            raise LedgerRuleError("the controller has not started: call run()")
        return self._ledger

    # -- the loop ----------------------------------------------------------------------------

    async def run(self) -> RunReport:
        """Run (or finish) the whole run; raises on the first error of any attempt's handling."""
        self._crash = asyncio.get_running_loop().create_future()
        try:
            start = await self._begin()
            self._acknowledged()  # after a restore: what a crash left unsent
            self.report.started_at_step = start
            last = self.settings.steps
            for step in range(start + 1, last + 1):
                for ahead in range(step, min(step + self.settings.lookahead, last) + 1):
                    await self._open_step(ahead)
                await self._wait_step(step)
                await self._train(step)
                await self._checkpoint(step)
                self._acknowledged()  # and what a busy environment refused meanwhile
        finally:
            await self._cancel_all()
            self.report.replaced_workers = list(self.pool.replaced)
        return self.report

    async def _begin(self) -> int:
        """A fresh run checkpoints step 0 at once; a log with history means restore."""
        if self.log.head() == 0:
            self._ledger = RecoveryLedger.open(self.log, self.data_plane, config=self.config)
            await self._checkpoint(0)
            return 0
        ledger = RecoveryLedger(self.log, self.data_plane, config=self.config)
        async with self.barrier.mutation("restore") as cut:
            plan = await ledger.restore_async(cut, self.source, step=self.restore_step)
        self._ledger = ledger
        self.report.restore = plan
        logger.info(
            "restored checkpoint step %d: %s", plan.checkpoint_step, plan.counts or "no groups"
        )
        # Admitted groups first: they may be the only work that can advance the trainer.
        for group_plan in plan.admitted:
            if group_plan.target_step is None:
                raise LedgerRuleError(f"group {group_plan.group_id!r}: admitted without a step")
            await self._resume(group_plan, group_plan.target_step)
        for admission in plan.reserved:
            step = _admission_step(admission.admission_id)
            async with self.barrier.mutation("admit") as cut:
                await ledger.admit_async(
                    cut, admission.admission_id, target_step=step, start_weight_version=step - 1
                )
            for group_plan in admission.groups:
                await self._resume(group_plan, step)
        for entry in ledger.replay.entries():
            if entry.target_step is not None:
                self._steps.setdefault(entry.target_step, []).append(entry.group_id)
        self.pool.set_weight_version(plan.checkpoint_step)
        return plan.checkpoint_step

    async def _resume(self, plan: GroupPlan, step: int) -> None:
        """Take a restored group back: redispatch exactly what the plan says, keep the rest."""
        state = self.ledger.group(plan.group_id)
        group = self._register(plan.group_id, step, state.prompt_ref.sample_id, plan.prompt)
        for kept in plan.sealed:  # sealed before the crash: a stall waiting on one may go
            self.faults.seal_landed(kept.rollout_id)
        if plan.redispatch:
            async with self.barrier.mutation("dispatch") as cut:
                refs = await self.ledger.dispatch_async(cut, plan.group_id, plan.redispatch_indices)
            self._launch(group, refs)
        else:
            await self._settle_if_quiet(group)

    def _register(self, group_id: str, step: int, sample_id: str, prompt: Prompt) -> _Group:
        ids = self.source.sample_ids(step, self.settings.groups_per_step)
        group = _Group(
            group_id=group_id,
            step=step,
            order=ids.index(sample_id) if sample_id in ids else len(ids),
            sample_id=sample_id,
            text=prompt_text(prompt),
            agent=self.ledger.group(group_id).agent_name,
            granularity=self.ledger.group(group_id).granularity,
            settled=asyncio.get_running_loop().create_future(),
        )
        self._groups[group_id] = group
        self._steps.setdefault(step, []).append(group_id)
        return group

    async def _fresh_group_id(self, step: int, order: int) -> str:
        """`step{S}-g{J}`, suffixed when a rolled-back reservation already used that id."""
        return await self.ledger.unused_group_id_async(f"step{step}-g{order}")

    async def _open_step(self, step: int) -> None:
        """Reserve, admit and dispatch a step's groups (once; a restore may have done it)."""
        if self._steps.get(step):
            return
        sample_ids = self.source.sample_ids(step, self.settings.groups_per_step)
        weight = self.pool.weight_version
        admission: str | None = None
        opened: list[tuple[_Group, list[AttemptRef]]] = []
        async with self.barrier.mutation("reserve") as cut:
            for order, sample_id in enumerate(sample_ids):
                prompt = self.source.get(sample_id)
                group_id = await self._fresh_group_id(step, order)
                if admission is None:
                    admission = f"step{step}" + group_id.removeprefix(f"step{step}-g{order}")
                task = prompt.get("task_name")
                await self.ledger.reserve_async(
                    cut,
                    group_id=group_id,
                    prompt=prompt,
                    prompt_ref=PromptRef(
                        sample_id=sample_id, task_name=task if isinstance(task, str) else None
                    ),
                    expected_generations=self.settings.siblings,
                    start_weight_version=weight,
                    admitted=False,
                    admission_id=admission,
                )
            assert admission is not None
            admitted = await self.ledger.admit_async(
                cut, admission, target_step=step, start_weight_version=weight
            )
            for group_id, sample_id in zip(admitted, sample_ids, strict=True):
                group = self._register(group_id, step, sample_id, self.ledger.prompt(group_id))
                opened.append((group, await self.ledger.dispatch_async(cut, group_id)))
        logger.info("step %d: %d groups dispatched (%s)", step, len(opened), admission)
        # Sibling 0 of every group first, then sibling 1...: with slots scarcer than attempts,
        # every group makes progress (the slots' priority only orders attempts that wait).
        for group, ref in sorted(
            ((g, r) for g, refs in opened for r in refs),
            key=lambda pair: (pair[1].generation_index, pair[0].order),
        ):
            self._launch(group, [ref])

    async def _wait_step(self, step: int) -> None:
        """Until every group of `step` is finalized or discarded (or an attempt crashed)."""
        assert self._crash is not None
        pending = [self._groups[g].settled for g in self._steps.get(step, []) if g in self._groups]
        waiting: asyncio.Future[object] = asyncio.ensure_future(asyncio.gather(*pending))
        crashed: asyncio.Future[object] = self._crash  # type: ignore[assignment]
        done, _ = await asyncio.wait({waiting, crashed}, return_when=asyncio.FIRST_COMPLETED)
        if crashed in done:
            waiting.cancel()
            crashed.result()  # raises the handler's error
        await waiting

    # -- attempts ----------------------------------------------------------------------------

    def _sampling(self, group: _Group, index: int) -> Sampling:
        """Seeded by sample and sibling: a rerun (any attempt) draws the same tokens."""
        mix = zlib.crc32(f"{group.sample_id}/{index}".encode())
        seed = (self.settings.seed * 1_000_003 + mix) % (2**31)
        return Sampling(
            n=1,
            max_tokens=self.settings.max_tokens,
            temperature=self.settings.temperature,
            seed=seed,
        )

    def _launch(self, group: _Group, refs: Sequence[AttemptRef]) -> None:
        for ref in refs:
            task = asyncio.create_task(self._attempt(group, ref), name=f"attempt {ref.rollout_id}")
            group.tasks.add(task)

    async def _attempt(self, group: _Group, ref: AttemptRef) -> None:
        this = asyncio.current_task()
        try:
            await self._run_and_handle(group, ref)
            if this is not None:
                group.tasks.discard(this)
            await self._settle_if_quiet(group)
        except Exception as exc:
            logger.exception("attempt %s: the controller cannot go on", ref.rollout_id)
            if self._crash is not None and not self._crash.done():
                self._crash.set_exception(exc)
        finally:
            if this is not None:
                group.tasks.discard(this)

    async def _run_and_handle(self, group: _Group, ref: AttemptRef) -> None:
        expected = rollout_id_for(group.group_id, ref.generation_index, ref.attempt)
        if ref.rollout_id != expected:
            raise LedgerRuleError(
                f"group {group.group_id!r}, sibling {ref.generation_index}: rollout id "
                f"{ref.rollout_id!r}, expected {expected!r}"
            )
        try:
            result = await self.pool.run(
                (group.step, ref.generation_index, group.order),
                group.group_id,
                ref.generation_index,
                ref.attempt,
                group.text,
                self._sampling(group, ref.generation_index),
                group.agent,
                wanted=lambda: self._wanted(group.group_id, ref),
            )
        except AttemptSkipped:
            logger.info("attempt %s skipped: superseded before it started", ref.rollout_id)
        except WorkerKilled as exc:
            await self._on_failure(group, ref, f"WorkerKilled: {exc}")
        else:
            if result.finished:
                await self._on_result(group, result)
            else:
                await self._on_failure(group, ref, result.error or "attempt failed")

    def _wanted(self, group_id: str, ref: AttemptRef) -> bool:
        """Still the sibling's current, dispatched attempt (else skip it before it starts)."""
        current = self.ledger.group(group_id).siblings[ref.generation_index].current
        return current.rollout_id == ref.rollout_id and current.status == "dispatched"

    async def _on_result(self, group: _Group, result: AttemptResult) -> None:
        await self._seal_result(group, result)
        self._acknowledged()

    def _acknowledged(self) -> None:
        """Record pending acknowledgements of new seals and send what is not delivered; a
        receiver that fails leaves them pending for the next seal (or the next restart)."""
        if self.acknowledge is None:
            return
        if self.outbox is None:
            self.outbox = Outbox(self.log, self.acknowledge)
        self.outbox.record_seals()
        try:
            self.outbox.deliver()
        except Exception as exc:  # the environment is down: keep training, retry later
            logger.warning("acknowledgements stay pending: %s: %s", type(exc).__name__, exc)

    async def _seal_result(self, group: _Group, result: AttemptResult) -> None:
        if result.reward is None or result.mask_sample is None:
            raise LedgerRuleError(
                f"attempt {result.rollout_id!r}: finished without reward or mask_sample"
            )
        ledger = self.ledger
        # The seal's read of the attempt stream, before the group's turn: holding the group
        # through the read as well made its siblings' seals wait for every read in turn.
        await ledger.read_staged_async(result.receipt)
        async with group.lock, self.barrier.mutation("seal") as cut:
            try:
                if group.granularity == "sibling":
                    await ledger.seal_sibling_async(
                        cut,
                        group.group_id,
                        result.generation_index,
                        rollout_id=result.rollout_id,
                        receipt=result.receipt,
                        reward=result.reward,
                        mask_sample=result.mask_sample,
                    )
                    self.faults.seal_landed(result.rollout_id)
                    return
                ledger.check_result(group.group_id, result.generation_index, result.rollout_id)
            except StaleAttemptError as stale:
                await ledger.record_rejected_result_async(cut, stale)
                self.report.rejected_results += 1
                return
            group.buffered[result.generation_index] = result
            await self._seal_group_if_complete(cut, group)

    async def _seal_group_if_complete(self, cut: Cut, group: _Group) -> None:
        state = self.ledger.group(group.group_id)
        results: list[SiblingResult] = []
        for sibling in state.siblings:
            got = group.buffered.get(sibling.generation_index)
            if got is None or got.rollout_id != sibling.current.rollout_id:
                return
            assert got.reward is not None and got.mask_sample is not None
            results.append(
                SiblingResult(
                    generation_index=got.generation_index,
                    rollout_id=got.rollout_id,
                    receipt=got.receipt,
                    reward=got.reward,
                    mask_sample=got.mask_sample,
                )
            )
        await self.ledger.seal_group_async(cut, group.group_id, results)
        for result in results:
            self.faults.seal_landed(result.rollout_id)
        group.buffered.clear()

    async def _on_failure(self, group: _Group, ref: AttemptRef, error: str) -> None:
        """Retry by the group's granularity; a failure of a superseded attempt changes nothing."""
        ledger, gid, index = self.ledger, group.group_id, ref.generation_index
        refs: list[AttemptRef] = []
        async with group.lock, self.barrier.mutation("retry") as cut:
            if not self._wanted(gid, ref):
                logger.info("attempt %s ended (%s) after it was superseded", ref.rollout_id, error)
                return
            await ledger.fail_attempt_async(cut, gid, index, rollout_id=ref.rollout_id, error=error)
            if group.granularity == "prompt_group":
                await ledger.abandon_unsealed_async(
                    cut, gid, reason=f"sibling {index} failed ({ref.rollout_id}): {error}"
                )
                for held in group.buffered.values():  # finished, but now superseded
                    try:
                        ledger.check_result(gid, held.generation_index, held.rollout_id)
                    except StaleAttemptError as stale:
                        await ledger.record_rejected_result_async(cut, stale)
                        self.report.rejected_results += 1
                group.buffered.clear()
            state = ledger.group(gid)
            spent = [
                s.generation_index
                for s in state.siblings
                if s.current.status in ("failed", "abandoned")
                and s.current.attempt + 1 >= self.settings.max_attempts
            ]
            if spent:
                group.discard_reason = (
                    f"siblings {spent} used all {self.settings.max_attempts} attempts "
                    f"(last error: {error})"
                )
                return
            refs = await ledger.prepare_retry_async(cut, gid)
            await ledger.dispatch_async(cut, gid, [r.generation_index for r in refs])
        self.report.retried_attempts += len(refs)
        logger.info("group %s: retrying %s after %s", gid, [r.rollout_id for r in refs], error)
        self._launch(group, refs)

    # -- finalization, training, checkpoints -------------------------------------------------

    async def _settle_if_quiet(self, group: _Group) -> None:
        """Finalize (or discard) a group once none of its attempts is still running."""
        if group.tasks or group.settled.done() or group.settling:
            return
        group.settling = True
        try:
            await self._settle(group)
        finally:
            group.settling = False

    async def _settle(self, group: _Group) -> None:
        gid = group.group_id
        if group.discard_reason is not None:
            async with self.barrier.mutation("discard") as cut:
                await self.ledger.discard_async(cut, gid, reason=group.discard_reason)
            self.report.discarded_groups.append(gid)
            group.settled.set_result("discarded")
            return
        if self.ledger.group(gid).status != "ready_to_finalize":
            return
        async with self.barrier.mutation("discard") as cut:
            dropped = await self.ledger.discard_if_few_valid_rows_async(cut, gid)
        if dropped is not None:
            self.report.discarded_groups.append(gid)
            group.settled.set_result("discarded")
            return
        async with self.barrier.mutation("finalize") as cut:
            inputs = await self.ledger.start_finalization_async(cut, gid, owner=self.owner)
            try:  # data-plane calls in a thread: the loop keeps serving other groups
                rows, min_weight = await asyncio.to_thread(
                    canonical_rows, self.data_plane, self.staging, inputs
                )
                await asyncio.to_thread(self.data_plane.put_rows, TRAINING_PARTITION, rows)
            except EventLogError as exc:
                await self.ledger.mark_finalization_unknown_async(
                    cut, gid, owner=self.owner, error=str(exc)
                )
                raise
            # Records and then deletes the staging rows: the canonical rows hold them now.
            await self.ledger.finalize_async(
                cut, gid, owner=self.owner, min_weight_version=min_weight
            )
        group.settled.set_result("finalized")

    async def _train(self, step: int) -> None:
        """Stand-in for the trainer: select the step's groups by id, read their rows, consume."""
        ready = [e for e in self.ledger.replay.entries("ready") if e.target_step == step]
        ids = [e.group_id for e in ready]
        row_ids = [r for e in ready for r in e.canonical_row_ids]
        if not ids:
            logger.warning("step %d: nothing to train (every group was discarded)", step)
            self.report.steps.append(StepReport(step, 0, 0, 0, 0.0, 0))
            return
        async with self.barrier.mutation("train") as cut:
            await self.ledger.replay.select_async(cut, ids, step=step)
            rows = await asyncio.to_thread(self.data_plane.read_rows, TRAINING_PARTITION, row_ids)
            # Records the trained rows as cleared (RowsCleared), then deletes them.
            await self.ledger.replay.consume_async(cut, ids, step=step)
        report = step_report(step, len(ids), rows)
        self.report.steps.append(report)
        self.pool.set_weight_version(step)
        logger.info("trained step %d: %s", step, report)

    async def _checkpoint(self, step: int) -> None:
        # Named by log position too: a rolled-back checkpoint of the same step keeps its files.
        directory = self.checkpoint_dir / f"step-{step:04d}-seq{self.log.head()}"
        # Workers stage rows outside the barrier: hold their puts while the rows are saved.
        async with self.pool.staging_paused(), self.barrier.checkpoint() as cut:
            # Rows of failed and abandoned attempts go now, not in the checkpoint. Both save
            # to the data plane (seconds at scale): in a thread, so the loop keeps running
            # (nothing else mutates inside the exclusive section).
            await asyncio.to_thread(self.ledger.clear_superseded_rows, cut, step=step)
            await asyncio.to_thread(
                self.ledger.checkpoint, cut, step=step, directory=str(directory)
            )

    async def _cancel_all(self) -> None:
        tasks = [t for g in self._groups.values() for t in g.tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _admission_step(admission_id: str) -> int:
    """The step an admission of this controller was made for (`step{S}` or `step{S}-r{n}`)."""
    head = admission_id.removeprefix("step").split("-", 1)[0]
    if not head.isdigit():
        raise LedgerRuleError(f"admission {admission_id!r}: not one this controller made")
    return int(head)
