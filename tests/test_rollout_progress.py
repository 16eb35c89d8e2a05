"""Progress while generating: inside a long model call a worker records GenerationProgress
(tokens so far, weight version) at a bounded rate, on a real vLLM engine and a real log.

The worker's clock is a test clock that ticks once per token delta, so the rate bound is
exact: at most one progress record per attempt per `progress_every_s` ticks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlog import EventLog
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.recovery.vocabulary import GenerationProgress, attempt_stream
from eventlog.rollout.sampling import SampleDelta, Sampling
from eventlog.rollout.worker import RolloutWorker
from tests.fixtures.vllm import VllmSession

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

PROMPT = "Question: what is 2 + 3? Answer:"


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EventLog]:
    with EventLog.open(tmp_path / "run.db") as opened:
        yield opened


class TickPerDelta:
    """The worker's clock: one second per token delta; the trainer syncs weights at delta 4."""

    def __init__(self) -> None:
        self.now = 0.0
        self.deltas: list[tuple[int, int, bool]] = []
        """(tokens so far, weight version, last delta of its call) per delta."""
        self.worker: RolloutWorker | None = None
        self.tokens = 0

    def __call__(self) -> float:
        return self.now

    def on_delta(self, rollout_id: str, call: int, delta: SampleDelta) -> None:
        assert self.worker is not None
        self.now += 1.0
        self.tokens += len(delta.token_ids)
        if len(self.deltas) == 3:
            self.worker.weight_version = 7
        self.deltas.append(
            (self.tokens, self.worker.weight_version, delta.finish_reason is not None)
        )


def _worker(log: EventLog, session: VllmSession, every: float | None) -> TickPerDelta:
    clock = TickPerDelta()
    worker = RolloutWorker(session.engine, log, InMemoryDataPlane(), on_delta=clock.on_delta)
    worker.progress_every_s = every
    worker.clock = clock
    clock.worker = worker
    return clock


def test_a_long_call_records_progress_at_a_bounded_rate(
    vllm_session: VllmSession, log: EventLog
) -> None:
    clock = _worker(log, vllm_session, every=3.0)
    assert clock.worker is not None
    sampling = Sampling(n=1, max_tokens=24, seed=5, ignore_eos=True)
    vllm_session.run(clock.worker.run_attempt("grp", 0, 0, PROMPT, sampling))
    records = list(log.read_stream(attempt_stream("grp_g0")))
    types = [r.type for r in records]
    progress = [r.event for r in records if isinstance(r.event, GenerationProgress)]
    # Every third tick since the start, never on a call's last delta (its outcome follows).
    expected = [
        (tokens, weight)
        for tick, (tokens, weight, last) in enumerate(clock.deltas, start=1)
        if tick % 3 == 0 and not last
    ]
    assert len(clock.deltas) >= 7 and len(expected) >= 2
    assert [(p.token_count, p.weight_version) for p in progress] == expected
    assert {p.weight_version for p in progress} == {0, 7}
    assert types[0] == "GenerationStarted" and types[-1] == "GenerationFinished"
    assert types[1 : 1 + len(progress)] == ["GenerationProgress"] * len(progress)


def test_progress_off_writes_none(vllm_session: VllmSession, log: EventLog) -> None:
    clock = _worker(log, vllm_session, every=None)
    assert clock.worker is not None
    sampling = Sampling(n=2, max_tokens=12, seed=5, ignore_eos=True)
    vllm_session.run(clock.worker.run_attempts("grp", [(0, 0), (1, 0)], PROMPT, sampling))
    assert log.last_seq(["GenerationProgress"]) == 0
    assert log.last_seq(["GenerationFinished"]) > 0
