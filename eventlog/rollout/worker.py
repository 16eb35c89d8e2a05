"""A rollout worker: runs attempts on one engine, stages their tokens, reports what it did.

For each attempt the worker writes the stream ``attempt/<rollout_id>``:
``GenerationStarted`` before the first token is asked for; inside a long call, at most one
``GenerationProgress`` (tokens so far) per `progress_every_s`; one ``TokensStaged`` per model
call, appended only after the data plane acknowledged that call's row (and before the next call
starts); then ``GenerationFinished`` (finish reason, generated tokens, reward, staging keys) or
``GenerationFailed`` (the error). The last call's ``TokensStaged`` shares one commit with the
outcome: one fsync less per attempt on the critical path, same order in the stream. A row put
but not yet named by a ``TokensStaged`` when a worker dies is still attributable: its tags
carry ``rollout_id`` and ``call``.
It returns an `AttemptResult`: the receipt (rollout id + staging keys in call order), the
reward and mask_sample. It never seals: whether a result becomes the sibling's result is the
controller's decision, on the ``group/`` stream.

Workers append to the log themselves rather than through the controller's ledger (in a Ray
actor, through an `AttemptLog` route: `eventlog.rollout.actor`). The attempt streams
are theirs alone (the controller never writes them), so there is no contention on versions;
each worker appends with exact expected versions (``NO_STREAM`` for the start), which makes
two workers running the same rollout id a ConcurrencyError instead of a silent interleave.
Writing directly keeps the order "row acknowledged, then TokensStaged durable" true even when
the controller is down, and it is what restore needs: TokensStaged names the attempt that
owns each staging row, so unreferenced rows are cleared by attempt, with evidence. Workers on
other hosts open the same PostgreSQL URL; in one process they share the controller's
`EventLog`, whose group commit batches their appends with everyone else's.

Siblings of one prompt may share one engine call (``run_attempts``, vLLM's ``n``); each
sibling is still its own attempt with its own stream, and a failure of one does not stop the
others. Calls after the first (multi-call agents) run per sibling. Faults (see
`eventlog.rollout.faults`) are injected here; the demo runs workers in process, and a kill is
simulated by a worker that stops writing at once, which leaves the log and the data plane as
a SIGKILL would.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from eventlog.dataplane.protocol import DataPlane
from eventlog.events import Event
from eventlog.records import NO_STREAM, AppendRequest, AppendResult
from eventlog.recovery.config import DEFAULT_STAGING_PARTITION
from eventlog.recovery.errors import ConfigError, RolloutError
from eventlog.recovery.vocabulary import (
    GenerationFailed,
    GenerationFinished,
    GenerationProgress,
    GenerationStarted,
    Receipt,
    TokensStaged,
    attempt_stream,
    rollout_id_for,
    staging_key,
)
from eventlog.rollout.agents import Agent, RewardInput, checked_reward, get_agent
from eventlog.rollout.faults import FaultPlan, WorkerKilled
from eventlog.rollout.sampling import SampleDelta, Sampling, TokenEngine

logger = logging.getLogger(__name__)


DEFAULT_PROGRESS_EVERY_S = 5.0
STALL_POLL_S = 0.01
"""How often a stalled attempt (FaultPlan.stall_until_*) looks whether it may go."""

_PUTS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="eventlog-put")
"""Where staging puts run. Not the loop's default executor: a checkpoint holds the gate while
the barrier drains, and puts blocked on it there took every thread (6 on 2 cores) that a
mutation inside the barrier needed for its own blocking step; the checkpoint then waited
for that mutation and the mutation for a thread."""

TokenObserver = Callable[[str, int, SampleDelta], None]
"""Called with (rollout id, call index, delta) for every delta, before fault checks."""


class AttemptLog(Protocol):
    """Where a worker's attempt events go: the `EventLog` itself, or a route to it.

    A worker in the controller's process appends to the shared `EventLog`; a worker in a Ray
    actor appends through `eventlog.rollout.actor` (its own log connection, or forwarded to
    the controller). Either way an append returns only once the events are durable.
    """

    async def append_batch_async(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        """Append atomically; the results once durable (errors raise, nothing appended)."""
        ...


@dataclass(frozen=True)
class AttemptResult:
    """What a worker reports for one attempt; the controller decides whether to seal it."""

    group_id: str
    generation_index: int
    attempt: int
    rollout_id: str
    finished: bool
    """True for GenerationFinished, False for GenerationFailed."""
    receipt: Receipt | None
    """Rollout id and staging keys in call order; None when the attempt failed."""
    reward: float | None
    mask_sample: bool | None
    finish_reason: str | None
    token_count: int
    """Tokens the model generated over all calls (environment text excluded)."""
    error: str | None = None


class StagingGate:
    """Holds staging back while a data-plane checkpoint saves, after the puts in flight end.

    A checkpoint saves the data plane's rows with a digest; a put landing meanwhile would make
    the digest describe rows that were not saved. Workers put through `staging()`; the
    checkpoint calls `hold()` (blocking: run it in a thread) and `release()` after.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._puts = 0
        self._holds = 0

    @contextlib.contextmanager
    def staging(self) -> Iterator[None]:
        with self._changed:
            # > 0, not truthy: a cancelled checkpoint may release an actor's hold before the
            # hold's thread took it (-1 until it does); puts go on meanwhile.
            while self._holds > 0:
                self._changed.wait()
            self._puts += 1
        try:
            yield
        finally:
            with self._changed:
                self._puts -= 1
                self._changed.notify_all()

    def hold(self) -> None:
        """Stop new puts; return once none is in flight."""
        with self._changed:
            self._holds += 1
            while self._puts:
                self._changed.wait()

    def release(self) -> None:
        with self._changed:
            self._holds -= 1
            self._changed.notify_all()


@dataclass
class WorkerStats:
    """Counters and clocks for one worker, cumulative over its attempts."""

    attempts: int = 0
    finished: int = 0
    failed: int = 0
    generated_tokens: int = 0
    staged_rows: int = 0
    events: int = 0
    appends: int = 0
    busy_s: float = 0.0
    """Wall time while at least one attempt was running."""
    log_wait_s: float = 0.0
    """Sum of the time every append was awaited (overlapping appends each count)."""
    log_busy_s: float = 0.0
    """Wall time while at least one append was pending."""
    stage_wait_s: float = 0.0
    """Sum of the time every put_rows was awaited."""

    @property
    def events_per_token(self) -> float:
        return self.events / self.generated_tokens if self.generated_tokens else 0.0

    @property
    def log_share(self) -> float:
        """Share of the busy wall time during which the worker was waiting for the log."""
        return self.log_busy_s / self.busy_s if self.busy_s else 0.0


class _BusyClock:
    """Measures the wall time during which at least one section is open."""

    def __init__(self) -> None:
        self.total = 0.0
        self._open = 0
        self._since = 0.0

    @contextlib.contextmanager
    def section(self) -> Iterator[None]:
        self.open()
        try:
            yield
        finally:
            self.close()

    def open(self) -> float:
        """Open a section (`close` it in a `finally`); the time it was opened."""
        now = time.perf_counter()
        if self._open == 0:
            self._since = now
        self._open += 1
        return now

    def close(self) -> float:
        """Close a section; the time it was closed."""
        now = time.perf_counter()
        self._open -= 1
        if self._open == 0:
            self.total += now - self._since
        return now


@dataclass
class _Run:
    """One attempt in flight."""

    group_id: str
    generation_index: int
    attempt: int
    seed: int | None
    trajectory: list[int]
    rollout_id: str = ""
    version: int = -1
    generated: list[int] = field(default_factory=list)
    staging_keys: list[str] = field(default_factory=list)
    unrecorded: list[Event] = field(default_factory=list)
    """TokensStaged of the last call: its row is acknowledged; appended with the final event."""
    progress_at: float = 0.0
    """When the attempt last showed progress (its start, or its last GenerationProgress)."""

    def __post_init__(self) -> None:
        self.rollout_id = rollout_id_for(self.group_id, self.generation_index, self.attempt)

    @property
    def stream(self) -> str:
        return attempt_stream(self.rollout_id)


class _FanOut:
    """Splits one n-sample engine call into one delta stream per sample."""

    def __init__(self, n: int) -> None:
        self._queues: list[asyncio.Queue[SampleDelta | BaseException]] = [
            asyncio.Queue() for _ in range(n)
        ]
        self._attached = set(range(n))

    async def feed(self, source: AsyncIterator[SampleDelta]) -> None:
        try:
            async with contextlib.aclosing(source) as deltas:  # type: ignore[type-var]
                async for delta in deltas:
                    if delta.index in self._attached:
                        self._queues[delta.index].put_nowait(delta)
                    if not self._attached:
                        return  # every sample stopped listening: closing aborts the request
        except Exception as exc:
            for index in self._attached:
                self._queues[index].put_nowait(exc)

    async def sample(self, index: int) -> AsyncIterator[SampleDelta]:
        try:
            while True:
                item = await self._queues[index].get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            self._attached.discard(index)


class RolloutWorker:
    """Runs attempts on one engine; writes attempt streams and staging rows, never seals."""

    progress_every_s: float | None = DEFAULT_PROGRESS_EVERY_S
    """At most one GenerationProgress per attempt per this many seconds, written inside a
    model call when a token arrives (None: none). Bounded so the log's share stays small."""
    clock: Callable[[], float] = staticmethod(time.monotonic)
    """The clock progress is timed by."""

    def __init__(
        self,
        engine: TokenEngine,
        log: AttemptLog,
        data_plane: DataPlane,
        *,
        worker_id: str | None = None,
        partition: str = DEFAULT_STAGING_PARTITION,
        weight_version: int = 0,
        faults: FaultPlan | None = None,
        on_delta: TokenObserver | None = None,
        gate: StagingGate | None = None,
    ) -> None:
        self.engine = engine
        self.gate = gate or StagingGate()
        """Shared by the workers of one pool: a checkpoint holds their puts back."""
        self.log = log
        self.data_plane = data_plane
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
        self.partition = partition
        self.weight_version = weight_version
        """Recorded with every call; the trainer's sync updates it between (or during) attempts."""
        self.faults = faults or FaultPlan()
        self.on_delta = on_delta
        self.stats = WorkerStats()
        self._killed: WorkerKilled | None = None
        self._busy = _BusyClock()
        self._log_busy = _BusyClock()

    @property
    def killed(self) -> bool:
        """True once an injected kill fired: the worker writes nothing more."""
        return self._killed is not None

    async def run_attempt(
        self,
        group_id: str,
        generation_index: int,
        attempt: int,
        prompt: str | Sequence[int],
        sampling: Sampling,
        agent_name: str | None = None,
    ) -> AttemptResult:
        """Run one attempt of one sibling (``sampling.n`` must be 1)."""
        if sampling.n != 1:
            raise ConfigError(
                f"attempt {rollout_id_for(group_id, generation_index, attempt)!r}: "
                f"sampling.n must be 1 for one attempt, found {sampling.n} (use run_attempts)"
            )
        results = await self.run_attempts(
            group_id, [(generation_index, attempt)], prompt, sampling, agent_name
        )
        return results[0]

    async def run_attempts(
        self,
        group_id: str,
        attempts: Sequence[tuple[int, int]],
        prompt: str | Sequence[int],
        sampling: Sampling,
        agent_name: str | None = None,
    ) -> list[AttemptResult]:
        """Run attempts (generation index, attempt) of one group's prompt in one engine call.

        Sample ``i`` of the call belongs to ``attempts[i]`` and is drawn with seed
        ``sampling.seed + i``. Results come back in the order of `attempts`. Raises
        WorkerKilled (after writing nothing more) when an injected kill fires.
        """
        if self._killed is not None:
            raise WorkerKilled(f"worker {self.worker_id!r} was killed: {self._killed}")
        if not attempts:
            return []
        if len({index for index, _ in attempts}) != len(attempts):
            raise ConfigError(f"group {group_id!r}: generation indices repeat in {list(attempts)}")
        if sampling.n not in (1, len(attempts)):
            raise ConfigError(
                f"group {group_id!r}: sampling.n must be 1 or {len(attempts)} (one sample per "
                f"attempt), found {sampling.n}"
            )
        agent = get_agent(agent_name)
        prompt_ids = list(prompt) if not isinstance(prompt, str) else self.engine.tokenize(prompt)
        if not prompt_ids:
            raise ConfigError(f"group {group_id!r}: the prompt has no tokens")
        call = replace(sampling, n=len(attempts))
        runs = [
            _Run(
                group_id=group_id,
                generation_index=index,
                attempt=number,
                seed=None if call.seed is None else call.seed + i,
                trajectory=list(prompt_ids),
            )
            for i, (index, number) in enumerate(attempts)
        ]
        try:
            with self._busy.section():
                await self._start(runs, agent, call)
                await self._stall(runs)
                return await self._generate(runs, agent, call, prompt_ids)
        finally:
            self.stats.busy_s = self._busy.total

    # -- the steps of an attempt -----------------------------------------------------------

    async def _start(self, runs: list[_Run], agent: Agent, call: Sampling) -> None:
        """GenerationStarted for every attempt, in one atomic append (each stream must be new)."""
        requests = []
        for run in runs:
            params = {**call.as_record(), "seed": run.seed, "agent_calls": agent.calls}
            started = GenerationStarted(
                rollout_id=run.rollout_id,
                group_id=run.group_id,
                generation_index=run.generation_index,
                attempt=run.attempt,
                worker=self.worker_id,
                model=self.engine.model_name,
                weight_version=self.weight_version,
                sampling_params=params,
            )
            requests.append(AppendRequest(run.stream, [started], NO_STREAM))
        pending = self.log.append_batch_async(requests)
        since = self._log_busy.open()
        try:
            results = await pending
        finally:
            self._waited(since)
        self._appended(len(requests))
        for run, result in zip(runs, results, strict=True):
            run.version = result.versions[-1]
            run.progress_at = self.clock()
        self.stats.attempts += len(runs)

    async def _stall(self, runs: list[_Run]) -> None:
        """Wait while an injected stall holds any of these attempts (a straggler)."""
        while any(self.faults.stalled(run.rollout_id, self.weight_version) for run in runs):
            if self._killed is not None:
                raise self._killed
            await asyncio.sleep(STALL_POLL_S)

    async def _generate(
        self, runs: list[_Run], agent: Agent, call: Sampling, prompt_ids: list[int]
    ) -> list[AttemptResult]:
        fan_out = _FanOut(len(runs))
        request_id = f"{runs[0].rollout_id}/c0" if len(runs) == 1 else f"{runs[0].group_id}/c0"
        feeder = asyncio.create_task(
            fan_out.feed(self.engine.generate(prompt_ids, call, request_id))
        )
        tasks = [
            asyncio.create_task(self._attempt(run, agent, call, prompt_ids, fan_out.sample(i)))
            for i, run in enumerate(runs)
        ]
        try:
            done = await asyncio.gather(*tasks)
        except BaseException:
            for task in (*tasks, feeder):
                task.cancel()
            await asyncio.gather(*tasks, feeder, return_exceptions=True)
            raise
        await feeder
        return list(done)

    async def _attempt(
        self,
        run: _Run,
        agent: Agent,
        call: Sampling,
        prompt_ids: list[int],
        first: AsyncIterator[SampleDelta],
    ) -> AttemptResult:
        finish_reason = ""
        try:
            for index in range(agent.calls):
                weight_version = self.weight_version
                if index == 0:
                    prefix, source = list(prompt_ids), first
                else:
                    prefix = self.engine.tokenize(agent.follow_up)
                    run.trajectory.extend(prefix)
                    again = replace(call, n=1, seed=_call_seed(run.seed, index))
                    source = self.engine.generate(
                        run.trajectory, again, staging_key(run.rollout_id, index)
                    )
                ids, logprobs, finish_reason = await self._consume(run, index, source)
                staged = await self._stage(run, index, prefix, ids, logprobs, weight_version)
                if index < agent.calls - 1:
                    await self._append(run, staged)
                else:  # one commit for the last TokensStaged and the outcome
                    run.unrecorded.append(staged)
            reward_input = RewardInput(
                prompt_text=self.engine.detokenize(prompt_ids),
                prompt_token_ids=tuple(prompt_ids),
                completion_text=self.engine.detokenize(run.generated),
                completion_token_ids=tuple(run.generated),
                finish_reason=finish_reason,
            )
            reward = checked_reward(agent, reward_input)
            mask_sample = agent.mask_sample(finish_reason)
            await self._append(
                run,
                GenerationFinished(
                    rollout_id=run.rollout_id,
                    finish_reason=finish_reason,
                    token_count=len(run.generated),
                    reward=reward,
                    staging_keys=list(run.staging_keys),
                ),
            )
        except WorkerKilled as killed:
            self._killed = self._killed or killed
            logger.warning("%s", killed)
            raise
        except Exception as exc:
            return await self._fail(run, exc)
        self.stats.finished += 1
        return AttemptResult(
            group_id=run.group_id,
            generation_index=run.generation_index,
            attempt=run.attempt,
            rollout_id=run.rollout_id,
            finished=True,
            receipt=Receipt(rollout_id=run.rollout_id, staging_keys=list(run.staging_keys)),
            reward=reward,
            mask_sample=mask_sample,
            finish_reason=finish_reason,
            token_count=len(run.generated),
        )

    async def _consume(
        self, run: _Run, call: int, source: AsyncIterator[SampleDelta]
    ) -> tuple[list[int], list[float], str]:
        """Collect one call's tokens until this sample's own finish_reason."""
        ids: list[int] = []
        logprobs: list[float] = []
        async with contextlib.aclosing(source) as deltas:  # type: ignore[type-var]
            async for delta in deltas:
                ids.extend(delta.token_ids)
                logprobs.extend(delta.logprobs)
                run.generated.extend(delta.token_ids)
                self.stats.generated_tokens += len(delta.token_ids)
                if self.on_delta is not None:
                    self.on_delta(run.rollout_id, call, delta)
                if self._killed is not None:
                    raise self._killed
                self.faults.check(run.rollout_id, len(run.generated))
                if delta.finish_reason is not None:
                    run.trajectory.extend(ids)
                    return ids, logprobs, delta.finish_reason
                await self._progress(run, call)
        raise RolloutError(
            f"attempt {run.rollout_id!r}, call {call}: the engine stream ended without a "
            "finish_reason"
        )

    async def _progress(self, run: _Run, call: int) -> None:
        """GenerationProgress when `progress_every_s` has passed since the attempt's last sign
        of life; one clock read per token otherwise."""
        every = self.progress_every_s
        if every is None:
            return
        now = self.clock()
        if now - run.progress_at < every:
            return
        run.progress_at = now
        progress = GenerationProgress(
            rollout_id=run.rollout_id,
            call=call,
            token_count=len(run.generated),
            weight_version=self.weight_version,
        )
        await self._append(run, progress)

    async def _stage(
        self,
        run: _Run,
        call: int,
        prefix: list[int],
        ids: list[int],
        logprobs: list[float],
        weight_version: int,
    ) -> TokensStaged:
        """Put the call's row (tokens added since the previous row); return its TokensStaged."""
        key = staging_key(run.rollout_id, call)
        prev_len = len(run.trajectory) - len(prefix) - len(ids)
        row = {
            "token_ids": torch.tensor(prefix + ids, dtype=torch.int64),
            "logprobs": torch.tensor([0.0] * len(prefix) + logprobs, dtype=torch.float32),
            "mask": torch.tensor([0.0] * len(prefix) + [1.0] * len(ids), dtype=torch.float32),
            "prev_len": torch.tensor(prev_len, dtype=torch.int64),
            "weight_version": torch.tensor(weight_version, dtype=torch.int64),
        }
        tags = {"rollout_id": run.rollout_id, "call": str(call)}
        if self._killed is not None:
            raise self._killed
        started = time.perf_counter()
        put = functools.partial(self._put, key, row, tags)
        await asyncio.get_running_loop().run_in_executor(_PUTS, put)
        self.stats.stage_wait_s += time.perf_counter() - started
        self.stats.staged_rows += 1
        run.staging_keys.append(key)
        return TokensStaged(
            rollout_id=run.rollout_id,
            partition=self.partition,
            staging_key=key,
            token_count=len(ids),
            weight_version=weight_version,
        )

    def _put(self, key: str, row: dict[str, torch.Tensor], tags: dict[str, str]) -> None:
        with self.gate.staging():
            self.data_plane.put_rows(self.partition, {key: row}, {key: tags})

    async def _fail(self, run: _Run, exc: Exception) -> AttemptResult:
        """Record GenerationFailed; if even that fails the stream stays open (= abandoned)."""
        error = f"{type(exc).__name__}: {exc}"
        logger.warning("attempt %s failed: %s", run.rollout_id, error)
        self.stats.failed += 1
        try:
            await self._append(run, GenerationFailed(rollout_id=run.rollout_id, error=error))
        except WorkerKilled:
            raise
        except Exception:
            logger.exception("attempt %s: could not record GenerationFailed", run.rollout_id)
        return AttemptResult(
            group_id=run.group_id,
            generation_index=run.generation_index,
            attempt=run.attempt,
            rollout_id=run.rollout_id,
            finished=False,
            receipt=None,
            reward=None,
            mask_sample=None,
            finish_reason=None,
            token_count=len(run.generated),
            error=error,
        )

    async def _append(self, run: _Run, event: Event) -> None:
        """Append `event` (after any unrecorded TokensStaged) at the stream's exact version."""
        if self._killed is not None:
            raise self._killed
        events = [*run.unrecorded, event]
        # The log's coroutine is awaited here, not through a timing wrapper: one coroutine
        # frame less on every resumption of the attempt, and no context-manager generator.
        pending = self.log.append_batch_async([AppendRequest(run.stream, events, run.version)])
        since = self._log_busy.open()
        try:
            results = await pending
        finally:
            self._waited(since)
        self._appended(len(events))
        run.unrecorded.clear()
        run.version = results[0].versions[-1]

    def _waited(self, since: float) -> None:
        """An append awaited since `since` is over (called in a `finally`: a failed
        append's wait counts too)."""
        self.stats.log_wait_s += self._log_busy.close() - since
        self.stats.log_busy_s = self._log_busy.total

    def _appended(self, events: int) -> None:
        """Count one append that landed."""
        self.stats.appends += 1
        self.stats.events += events


def _call_seed(seed: int | None, call: int) -> int | None:
    """The seed of a later call of an attempt: derived, so a rerun repeats it exactly."""
    return None if seed is None else (seed * 1_000_003 + call) % (2**31)
