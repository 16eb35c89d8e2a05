"""Rollout workers behind a priority queue of slots; a killed worker is replaced at once.

The controller has more attempts to run than it wants in flight at once, and some are more
urgent than others: the attempts of the step the trainer waits for (and their retries) must
not queue behind the look-ahead steps. Attempts therefore wait for a slot in priority order
(lowest first, FIFO among equals), then run on the next live worker.

A worker that was killed (`WorkerKilled`) writes nothing more; its in-flight attempts fail
with WorkerKilled, which the pool passes on so the controller can retry them. The pool swaps
the dead worker for a fresh one (same engine, new worker id) before handing out another slot,
so no attempt ever starts on a dead worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

from eventlog.dataplane.protocol import DataPlane
from eventlog.log import EventLog
from eventlog.recovery.errors import ConfigError, RolloutError
from eventlog.rollout.faults import FaultPlan, WorkerKilled
from eventlog.rollout.sampling import Sampling, TokenEngine
from eventlog.rollout.worker import AttemptResult, RolloutWorker, StagingGate

logger = logging.getLogger(__name__)

Priority = tuple[int, ...]


class AttemptSkipped(RolloutError):
    """An attempt was no longer wanted when its slot came up; it never started."""


class PrioritySlots:
    """A counting semaphore whose waiters are served lowest priority value first."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ConfigError(f"slots: expected >= 1, found {slots}")
        self._free = slots
        self._waiters: list[tuple[Priority, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    async def acquire(self, priority: Priority) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._order), waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot was handed over just as we were cancelled
            raise

    def release(self) -> None:
        while self._waiters:
            _, _, waiter = heapq.heappop(self._waiters)
            if not waiter.done():
                waiter.set_result(None)  # the slot passes straight to the next waiter
                return
        self._free += 1


class RolloutPool(Protocol):
    """What the controller asks of its workers: in process (`WorkerPool`) or Ray actors."""

    weight_version: int
    replaced: list[tuple[str, str]]

    def set_weight_version(self, version: int) -> None: ...

    def staging_paused(self) -> contextlib.AbstractAsyncContextManager[None]:
        """No worker puts a row inside (for a data-plane checkpoint)."""
        ...

    async def run(
        self,
        priority: Sequence[int],
        group_id: str,
        generation_index: int,
        attempt: int,
        prompt: str,
        sampling: Sampling,
        agent_name: str | None,
        *,
        wanted: Callable[[], bool] | None = None,
    ) -> AttemptResult: ...


class WorkerPool:
    """Workers sharing one engine; attempts wait for a slot by priority, then run."""

    def __init__(
        self,
        engine: TokenEngine,
        log: EventLog,
        data_plane: DataPlane,
        *,
        workers: int,
        slots: int,
        partition: str,
        faults: FaultPlan | None = None,
        name: str = "worker",
    ) -> None:
        if workers < 1:
            raise ConfigError(f"workers: expected >= 1, found {workers}")
        self.engine = engine
        self.log = log
        self.data_plane = data_plane
        self.partition = partition
        self.name = name
        self._faults = faults or FaultPlan()
        self._serial = itertools.count()
        self._slots = PrioritySlots(slots)
        self._turn = itertools.count()
        self.weight_version = 0
        self.gate = StagingGate()
        self.workers: list[RolloutWorker] = [self._new_worker(self._faults) for _ in range(workers)]
        self.replaced: list[tuple[str, str]] = []
        """(dead worker id, replacement worker id), in the order they happened."""

    def _new_worker(self, faults: FaultPlan) -> RolloutWorker:
        return RolloutWorker(
            self.engine,
            self.log,
            self.data_plane,
            worker_id=f"{self.name}-{next(self._serial)}",
            partition=self.partition,
            weight_version=self.weight_version,
            faults=faults,
            gate=self.gate,
        )

    @contextlib.asynccontextmanager
    async def staging_paused(self) -> AsyncIterator[None]:
        # A thread cannot be stopped: a caller cancelled while the hold waits for the puts in
        # flight leaves it to be taken later, and it is released as soon as it is (else the
        # workers waited for the gate forever). A plain executor future, not a task: the
        # loop's shutdown cancels tasks, not this.
        hold = asyncio.get_running_loop().run_in_executor(None, self.gate.hold)
        try:
            await asyncio.shield(hold)
        except asyncio.CancelledError:
            hold.add_done_callback(self._release_taken)
            raise
        try:
            yield
        finally:
            self.gate.release()

    def _release_taken(self, hold: asyncio.Future[None]) -> None:
        if not hold.cancelled() and hold.exception() is None:
            self.gate.release()

    def set_weight_version(self, version: int) -> None:
        """The trainer synced new weights: later calls of every worker record this version."""
        self.weight_version = version
        for worker in self.workers:
            worker.weight_version = version

    def _replace_dead(self) -> None:
        for position, worker in enumerate(self.workers):
            if worker.killed:
                fresh = self._new_worker(self._faults.without_kills())
                self.workers[position] = fresh
                self.replaced.append((worker.worker_id, fresh.worker_id))
                logger.warning("worker %s died; started %s", worker.worker_id, fresh.worker_id)

    def _pick(self) -> RolloutWorker:
        self._replace_dead()
        return self.workers[next(self._turn) % len(self.workers)]

    async def run(
        self,
        priority: Sequence[int],
        group_id: str,
        generation_index: int,
        attempt: int,
        prompt: str,
        sampling: Sampling,
        agent_name: str | None,
        *,
        wanted: Callable[[], bool] | None = None,
    ) -> AttemptResult:
        """Run one attempt once a slot is free; WorkerKilled when its worker died under it.

        `wanted` is asked when the slot comes up: an attempt abandoned while it waited is
        skipped (AttemptSkipped) instead of generating tokens nobody will seal.
        """
        await self._slots.acquire(tuple(priority))
        try:
            if wanted is not None and not wanted():
                raise AttemptSkipped(
                    f"group {group_id!r}, sibling {generation_index}, attempt {attempt}: "
                    "superseded before it started"
                )
            worker = self._pick()
            try:
                return await worker.run_attempt(
                    group_id, generation_index, attempt, prompt, sampling, agent_name
                )
            except WorkerKilled:
                self._replace_dead()
                raise
        finally:
            self._slots.release()
