"""The rollout worker's append path, without vLLM: a scripted engine and a real SQLite log.

What is pinned: the worker awaits the log's own coroutine from the step that appends (its
start, its per-call and final appends), with no wrapper coroutine in between (one frame less
on every resumption of an attempt), and its counters still count what landed.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from eventlog import EventLog
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.errors import ConcurrencyError
from eventlog.records import AppendRequest, AppendResult
from eventlog.recovery.vocabulary import attempt_stream
from eventlog.rollout.sampling import SampleDelta, Sampling
from eventlog.rollout.worker import RolloutWorker

TOKENS = 6


class ScriptedEngine:
    """Every sample yields TOKENS tokens, two per delta, then finishes ("length")."""

    model_name = "scripted"

    def tokenize(self, text: str) -> list[int]:
        return [1 + ord(c) % 200 for c in text]

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return " ".join(str(t) for t in token_ids)

    async def generate(
        self, prompt_token_ids: Sequence[int], sampling: Sampling, request_id: str
    ) -> AsyncIterator[SampleDelta]:
        for done in range(2, TOKENS + 1, 2):
            await asyncio.sleep(0)
            finish = "length" if done == TOKENS else None
            for index in range(sampling.n):
                yield SampleDelta(index, (done, done + 1), (-0.5, -0.5), finish)


class CallerOfEachAppend:
    """The shared log, noting which function awaited each append's coroutine."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.awaited_by: list[str] = []

    async def append_batch_async(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        # Running, this coroutine's frame is linked to the one that awaits it.
        self.awaited_by.append(sys._getframe(1).f_code.co_name)
        return await self.log.append_batch_async(requests)


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EventLog]:
    with EventLog.open(tmp_path / "run.db") as opened:
        yield opened


def test_the_worker_awaits_the_logs_coroutine_itself_and_counts_what_landed(
    log: EventLog,
) -> None:
    route = CallerOfEachAppend(log)
    worker = RolloutWorker(ScriptedEngine(), route, InMemoryDataPlane(), worker_id="w")
    sampling = Sampling(n=3, max_tokens=TOKENS, seed=1, ignore_eos=True)

    results = asyncio.run(
        worker.run_attempts("grp", [(0, 0), (1, 0), (2, 0)], "a prompt", sampling, "overlap")
    )

    assert all(r.finished for r in results)
    # One start for the three siblings, then per attempt its last TokensStaged + outcome.
    assert route.awaited_by == ["_start", "_append", "_append", "_append"]
    assert worker.stats.appends == 4
    assert worker.stats.events == 3 + 3 * 2 == log.head()
    assert 0 < worker.stats.log_busy_s <= worker.stats.busy_s
    assert worker.stats.log_busy_s <= worker.stats.log_wait_s
    for r in results:
        types = [e.type for e in log.read_stream(attempt_stream(r.rollout_id))]
        assert types == ["GenerationStarted", "TokensStaged", "GenerationFinished"]


def test_a_refused_append_is_waited_for_but_not_counted(log: EventLog) -> None:
    """A second worker on a rollout id that already started: its start is refused; the wait
    counts, the append and its events do not, and nothing is appended."""
    sampling = Sampling(n=1, max_tokens=TOKENS, seed=1, ignore_eos=True)
    first = RolloutWorker(ScriptedEngine(), log, InMemoryDataPlane(), worker_id="first")
    asyncio.run(first.run_attempt("grp", 0, 0, "a prompt", sampling, "overlap"))
    head = log.head()

    second = RolloutWorker(ScriptedEngine(), log, InMemoryDataPlane(), worker_id="second")
    with pytest.raises(ConcurrencyError):
        asyncio.run(second.run_attempt("grp", 0, 0, "a prompt", sampling, "overlap"))

    assert log.head() == head
    assert (second.stats.appends, second.stats.events) == (0, 0)
    assert second.stats.log_wait_s > 0
    assert second.stats.log_busy_s > 0


def test_puts_held_by_a_checkpoint_leave_the_loops_threads_free(log: EventLog) -> None:
    """A checkpoint holds the staging gate while the barrier drains; a mutation inside the
    barrier runs its blocking step on the loop's default executor. Puts blocked on the gate
    must not take those threads (they took all of them, and the run deadlocked): here four
    puts wait on a held gate while a two-thread default executor still serves a call."""
    worker = RolloutWorker(ScriptedEngine(), log, InMemoryDataPlane(), worker_id="w")
    sampling = Sampling(n=1, max_tokens=TOKENS, seed=1, ignore_eos=True)

    async def main() -> int:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=2))
        worker.gate.hold()
        attempts = [
            asyncio.create_task(worker.run_attempt("grp", i, 0, "a prompt", sampling, "overlap"))
            for i in range(4)
        ]
        while worker.stats.generated_tokens < 4 * TOKENS:  # every attempt is at its put
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        try:
            served = await asyncio.wait_for(asyncio.to_thread(lambda: 42), timeout=5)
        finally:
            worker.gate.release()  # also when the call was not served: nothing left waiting
        await asyncio.wait_for(asyncio.gather(*attempts), timeout=10)
        return served

    assert asyncio.run(main()) == 42
    assert worker.stats.staged_rows == 4
