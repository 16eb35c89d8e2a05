"""Rollout workers as Ray actors: one engine per actor, its attempt events routed to the log.

A real run puts the controller on one host and its engines on many; each engine lives in a
`RolloutActor` (a Ray actor in the Ray cluster TransferQueue runs on, ``num_gpus=1`` where
the cluster has a GPU), which runs the same `RolloutWorker` the controller's process would.
The actor stages rows in the data plane itself; where its attempt events go is the one
choice, `EventRoute`:

- ``direct``: the actor opens the log (its own connection and group commit) and appends its
  ``attempt/<rollout_id>`` streams. That needs a log every host reaches, so only PostgreSQL.
- ``forwarded``: the actor hands each append to the controller, which appends it to its own
  `EventLog` (group commit with everything else) and acknowledges; works on SQLite too.
  The hand-over is the actor call's own streaming reply (one item per append) and an
  ``ack``/``reject`` call back, so the actor waits for durability exactly as if it appended.
  The controller sends an actor the answers that became ready in one turn of its loop as one
  call (`RolloutActor.answer_all`): a group commit lands many forwarded appends at once, and
  a Ray call per answer, each submitted on the loop, made that turn the loop's longest.

Either way every event carries an id the actor chose (`ChosenIds`), so an append retried
after a lost reply finds the original and never duplicates; the worker's ordering rules hold
unchanged (it awaits each append before the next step), and a second worker on the same
rollout id still fails on the stream's expected version.

Ray is imported here and in the data plane's adapter only; nothing else needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import ray

from eventlog.dataplane.protocol import DataPlane
from eventlog.errors import EventLogError
from eventlog.log import EventLog
from eventlog.records import AppendRequest, AppendResult
from eventlog.recovery.config import DEFAULT_STAGING_PARTITION
from eventlog.recovery.errors import ConfigError, RolloutError
from eventlog.rollout.faults import FaultPlan, WorkerKilled
from eventlog.rollout.pool import AttemptSkipped, PrioritySlots
from eventlog.rollout.routes import ChosenIds, EventRoute, check_route
from eventlog.rollout.sampling import Sampling, TokenEngine
from eventlog.rollout.worker import AttemptLog, AttemptResult, RolloutWorker, StagingGate

logger = logging.getLogger(__name__)


class ForwardedAppendError(RolloutError):
    """The controller refused a forwarded append (its error is re-raised controller side)."""


class RemoteAttemptError(RolloutError):
    """An attempt call failed inside its actor; `error_type` names the actor-side error."""

    def __init__(self, message: str, *, error_type: str) -> None:
        super().__init__(message)
        self.error_type = error_type


@dataclass(frozen=True)
class Forward:
    """One append the actor asks the controller to make (an item of a call's reply)."""

    token: int
    requests: list[AppendRequest]


Answer = tuple[int, list[AppendResult] | None, str | None]
"""(a `Forward`'s token, its results or None, why it was refused or None)."""


@dataclass(frozen=True)
class CallOutcome:
    """The last item of a call's reply: its results, or the error that ended it."""

    results: list[AttemptResult] | None
    error_type: str | None = None
    error: str | None = None
    replaced: tuple[str, str] | None = None
    """(dead worker id, replacement worker id) when an injected kill brought the worker down."""


_OUTBOX: ContextVar[asyncio.Queue[Forward]] = ContextVar("eventlog_actor_outbox")


class _Forwarder:
    """The actor side of ``forwarded``: each append waits for the controller's answer."""

    def __init__(self) -> None:
        self._tokens = itertools.count()
        self._pending: dict[int, asyncio.Future[list[AppendResult]]] = {}

    async def append_batch_async(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        token = next(self._tokens)
        waiter: asyncio.Future[list[AppendResult]] = asyncio.get_running_loop().create_future()
        self._pending[token] = waiter
        _OUTBOX.get().put_nowait(Forward(token, list(requests)))
        try:
            return await waiter
        finally:
            self._pending.pop(token, None)

    def answer(self, token: int, results: list[AppendResult] | None, error: str | None) -> None:
        waiter = self._pending.get(token)
        if waiter is None or waiter.done():
            return  # the call was cancelled meanwhile
        if results is None:
            waiter.set_exception(ForwardedAppendError(error or "forwarded append refused"))
        else:
            waiter.set_result(results)


@dataclass(frozen=True)
class VllmEngineFactory:
    """Builds the actor's vLLM engine inside the actor's process (picklable: just the config)."""

    model: str
    seed: int = 0

    def __call__(self) -> TokenEngine:
        from eventlog.rollout.engine import EngineConfig, VllmEngine

        return VllmEngine.start(EngineConfig(model=self.model, seed=self.seed))


@dataclass(frozen=True)
class TransferQueueFactory:
    """Joins the cluster's TransferQueue from inside the actor."""

    def __call__(self) -> DataPlane:
        from eventlog.dataplane.transferqueue import join_transferqueue

        return join_transferqueue()


@dataclass(frozen=True)
class ActorSpec:
    """What one actor runs: its engine and data plane (built in the actor) and its route."""

    engine: Callable[[], TokenEngine]
    data_plane: Callable[[], DataPlane] = field(default_factory=TransferQueueFactory)
    route: EventRoute = "forwarded"
    log_target: str | None = None
    """The log's URL (``direct`` only)."""
    partition: str = DEFAULT_STAGING_PARTITION
    faults: FaultPlan = field(default_factory=FaultPlan)

    def __post_init__(self) -> None:
        # An actor's copy of the plan hears neither the controller's seals nor new weights
        # while an attempt waits (its version comes with the next call): a stall never ends.
        stalled = sorted({*self.faults.stall_until_sealed, *self.faults.stall_until_weights})
        if stalled:
            raise ConfigError(
                f"faults: stalls need in-process workers, found rollout actors ({stalled})"
            )


class RolloutActor:
    """The Ray actor body: one engine, one live worker at a time, calls served concurrently."""

    def __init__(self, spec: ActorSpec, name: str) -> None:
        self.spec = spec
        self.name = name
        self.engine = spec.engine()
        self.data_plane = spec.data_plane()
        self._forwarder = _Forwarder()
        self._direct: EventLog | None = None
        sink: AttemptLog = self._forwarder
        if spec.route == "direct":
            assert spec.log_target is not None
            self._direct = EventLog.open(spec.log_target, create=False)
            sink = self._direct
        self._sink = ChosenIds(sink)
        self._serial = itertools.count()
        self.gate = StagingGate()
        self.worker = self._new_worker(spec.faults)

    def _new_worker(self, faults: FaultPlan) -> RolloutWorker:
        return RolloutWorker(
            self.engine,
            self._sink,
            self.data_plane,
            worker_id=f"{self.name}-{next(self._serial)}",
            partition=self.spec.partition,
            faults=faults,
            gate=self.gate,
        )

    async def run_attempts(
        self,
        group_id: str,
        attempts: list[tuple[int, int]],
        prompt: str,
        sampling: Sampling,
        agent_name: str | None,
        weight_version: int,
    ) -> AsyncIterator[Forward | CallOutcome]:
        """Run attempts; yields a `Forward` per append (``forwarded``), then a `CallOutcome`."""
        outbox: asyncio.Queue[Forward] = asyncio.Queue()
        _OUTBOX.set(outbox)  # the worker's tasks inherit this context
        worker = self.worker
        worker.weight_version = weight_version
        task = asyncio.create_task(
            worker.run_attempts(group_id, attempts, prompt, sampling, agent_name)
        )
        try:
            while True:
                getter = asyncio.ensure_future(outbox.get())
                try:
                    await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    getter.cancel()
                if getter.done() and not getter.cancelled():
                    yield getter.result()
                    continue
                while not outbox.empty():
                    yield outbox.get_nowait()
                break
        finally:  # the caller cancelled the call: stop the attempts, as a lost host would
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        try:
            yield CallOutcome(results=task.result())
        except WorkerKilled as killed:
            yield CallOutcome(None, "WorkerKilled", str(killed), self._replace_dead(worker))
        except Exception as exc:
            yield CallOutcome(None, type(exc).__name__, str(exc))

    def _replace_dead(self, worker: RolloutWorker) -> tuple[str, str] | None:
        """A killed worker writes nothing more; the next call runs on a fresh one."""
        if self.worker is not worker:
            return None  # another call of the same worker already replaced it
        self.worker = self._new_worker(self.spec.faults.without_kills())
        return worker.worker_id, self.worker.worker_id

    async def hold_staging(self) -> None:
        """Stop this actor's puts; return once none is in flight (a checkpoint is saving)."""
        await asyncio.to_thread(self.gate.hold)

    def release_staging(self) -> None:
        self.gate.release()

    def answer_all(self, answers: list[Answer]) -> None:
        """The controller's answers to `Forward`s, in the order given: each one's results,
        or why it refused."""
        for token, results, error in answers:
            self._forwarder.answer(token, results, error)

    def stats(self) -> dict[str, float]:
        """The live worker's counters, and the commits of a direct actor's own log."""
        stats: dict[str, float] = dict(vars(self.worker.stats))
        stats["commits"] = self._direct.commits if self._direct is not None else 0
        return stats

    def worker_id(self) -> str:
        return self.worker.worker_id

    def close(self) -> None:
        if self._direct is not None:
            self._direct.close()
        close = getattr(self.engine, "close", None)
        if callable(close):
            close()


def actor_options(*, num_cpus: float = 0.25) -> dict[str, object]:
    """Ray resources of one actor: a whole GPU where the cluster has one, else a CPU share."""
    gpus = ray.cluster_resources().get("GPU", 0.0)  # type: ignore[no-untyped-call]
    options: dict[str, object] = {"num_cpus": num_cpus, "max_concurrency": 1000}
    if gpus >= 1:
        options["num_gpus"] = 1
    return options


_RemoteActor: Any = ray.remote(RolloutActor)


def start_actors(
    specs: Sequence[ActorSpec], *, name: str = "actor", num_cpus: float = 0.25
) -> list[Any]:
    """Start one actor per spec in the running Ray cluster; return once every one is up.

    Fails here, not in the first attempt, when an actor cannot start (engine, log, TQ).
    """
    if not specs:
        raise ConfigError("workers: expected >= 1 actor, found 0")
    for spec in specs:
        check_route(spec.route, spec.log_target)
    options = actor_options(num_cpus=num_cpus)
    actors = [
        _RemoteActor.options(**options).remote(spec, f"{name}{i}") for i, spec in enumerate(specs)
    ]
    try:
        ray.get([a.worker_id.remote() for a in actors])
    except Exception:
        stop_actors(actors)
        raise
    return actors


def stop_actors(actors: Sequence[Any]) -> None:
    """Close each actor's engine and log, then end the actors."""
    try:
        ray.get([a.close.remote() for a in actors], timeout=60)
    except Exception:
        logger.warning("closing rollout actors failed", exc_info=True)
    for actor in actors:
        ray.kill(actor)


class ActorPool:
    """Rollout actors behind the same priority slots as `WorkerPool`; appends forwarded here.

    `log` is where ``forwarded`` appends land: the controller's `EventLog` (group commit with
    its own appends). A worker killed inside an actor is replaced there (same engine, new
    worker id).
    """

    def __init__(self, log: AttemptLog, actors: Sequence[Any], *, slots: int) -> None:
        if not actors:
            raise ConfigError("workers: expected >= 1 actor, found 0")
        self.log = log
        self.actors = list(actors)
        self.weight_version = 0
        self.replaced: list[tuple[str, str]] = []
        self.running = 0
        """Attempts in actor calls right now."""
        self._slots = PrioritySlots(slots)
        self._turn = itertools.count()
        self._answers: dict[int, tuple[Any, list[Answer]]] = {}
        """Per actor (by id), its handle and the answers not sent yet: sent together at the
        loop's next turn."""

    def set_weight_version(self, version: int) -> None:
        self.weight_version = version

    @contextlib.asynccontextmanager
    async def staging_paused(self) -> AsyncIterator[None]:
        """No actor puts a row inside (for a data-plane checkpoint).

        Every actor is released even when the caller is cancelled while the holds are in
        flight: a hold the actor went on to take was otherwise never released, and the
        actor's workers waited for it forever (the next controller's run stalled).
        """
        holds = [a.hold_staging.remote() for a in self.actors]
        try:
            await asyncio.gather(*holds)
            yield
        finally:
            for actor in self.actors:
                actor.release_staging.remote()

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
        """Run one attempt once a slot is free (see `WorkerPool.run`)."""
        await self._slots.acquire(tuple(priority))
        try:
            if wanted is not None and not wanted():
                raise AttemptSkipped(
                    f"group {group_id!r}, sibling {generation_index}, attempt {attempt}: "
                    "superseded before it started"
                )
            actor = self.actors[next(self._turn) % len(self.actors)]
            results = await self.call(
                actor, group_id, [(generation_index, attempt)], prompt, sampling, agent_name
            )
            return results[0]
        finally:
            self._slots.release()

    async def call(
        self,
        actor: Any,
        group_id: str,
        attempts: list[tuple[int, int]],
        prompt: str,
        sampling: Sampling,
        agent_name: str | None,
    ) -> list[AttemptResult]:
        """One actor call: append what it forwards, answer it, return its results."""
        refused: EventLogError | None = None
        replies = actor.run_attempts.options(num_returns="streaming").remote(
            group_id, attempts, prompt, sampling, agent_name, self.weight_version
        )
        outcome: CallOutcome | None = None
        self.running += len(attempts)
        try:
            async for ref in replies:
                item = await ref
                if isinstance(item, Forward):
                    try:
                        results = await self.log.append_batch_async(item.requests)
                    except EventLogError as exc:
                        refused = exc
                        self._answer(actor, (item.token, None, str(exc)))
                    else:
                        self._answer(actor, (item.token, results, None))
                else:
                    outcome = item
        except asyncio.CancelledError:
            ray.cancel(replies)  # the actor stops the attempts (and their forwarded appends)
            raise
        finally:
            self.running -= len(attempts)
        if outcome is None:
            raise RolloutError(f"group {group_id!r}: the rollout actor ended without an outcome")
        if outcome.replaced is not None:
            self.replaced.append(outcome.replaced)
        if outcome.results is not None:
            return outcome.results
        if refused is not None:
            raise refused  # the controller's own error (e.g. ConcurrencyError), not a copy
        if outcome.error_type == "WorkerKilled":
            raise WorkerKilled(outcome.error or "worker killed")
        if outcome.error_type == "ConfigError":
            raise ConfigError(outcome.error or "bad attempt")
        raise RemoteAttemptError(
            f"group {group_id!r}: {outcome.error_type}: {outcome.error}",
            error_type=outcome.error_type or "Exception",
        )

    def _answer(self, actor: Any, answer: Answer) -> None:
        """Queue an answer; the first queued for an actor this turn schedules the send."""
        key = id(actor)
        queued = self._answers.get(key)
        if queued is None:
            queued = self._answers[key] = (actor, [])
            asyncio.get_running_loop().call_soon(self._send_answers, key)
        queued[1].append(answer)

    def _send_answers(self, key: int) -> None:
        actor, answers = self._answers.pop(key)
        actor.answer_all.remote(answers)

    def stats(self) -> list[dict[str, float]]:
        return list(ray.get([a.stats.remote() for a in self.actors]))
