"""The rollout worker against a real vLLM engine, a real SQLite log and a data plane.

What is pinned: the attempt stream is written while tokens stream (not at the end), the rows
staged are exactly what the engine produced, a failed or killed attempt leaves evidence but no
receipt, and siblings sharing one engine call still get one stream each.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from eventlog import EventLog
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.errors import ConcurrencyError
from eventlog.recovery.vocabulary import (
    GenerationFailed,
    GenerationFinished,
    GenerationStarted,
    TokensStaged,
    attempt_stream,
    staging_key,
)
from eventlog.rollout.agents import RewardInput, digit_reward, get_agent, prompt_overlap_reward
from eventlog.rollout.faults import FaultPlan, WorkerKilled
from eventlog.rollout.sampling import SampleDelta, Sampling
from eventlog.rollout.worker import RolloutWorker
from tests.fixtures.tq import ClearableDataPlane
from tests.fixtures.vllm import VllmSession, stream_types

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

PROMPT = "Question: what is 2 + 3? Answer:"
MAX_TOKENS = 8


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EventLog]:
    with EventLog.open(tmp_path / "run.db") as opened:
        yield opened


class Deltas:
    """Records every delta the worker saw, and what the attempt stream held at that moment."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.tokens: dict[tuple[str, int], list[int]] = defaultdict(list)
        self.logprobs: dict[tuple[str, int], list[float]] = defaultdict(list)
        self.stream_at_first_token: dict[tuple[str, int], list[str]] = {}

    def __call__(self, rollout_id: str, call: int, delta: SampleDelta) -> None:
        key = (rollout_id, call)
        if key not in self.stream_at_first_token:
            self.stream_at_first_token[key] = stream_types(self.log, rollout_id)
        self.tokens[key].extend(delta.token_ids)
        self.logprobs[key].extend(delta.logprobs)


def sampling(seed: int, n: int = 1) -> Sampling:
    # ignore_eos: every call runs to max_tokens, so token counts (and fault points) are exact.
    return Sampling(n=n, max_tokens=MAX_TOKENS, seed=seed, ignore_eos=True)


def test_attempt_events_are_appended_while_tokens_stream_not_at_the_end(
    vllm_session: VllmSession, log: EventLog
) -> None:
    seen = Deltas(log)
    worker = RolloutWorker(vllm_session.engine, log, InMemoryDataPlane(), on_delta=seen)

    result = vllm_session.run(
        worker.run_attempt("grp", 0, 0, PROMPT, sampling(seed=11), "two_turn_digits")
    )

    assert result.finished and result.rollout_id == "grp_g0"
    # Before the first token of call 0 the start is durable; before call 1's first token,
    # call 0's row is staged and recorded.
    assert seen.stream_at_first_token[("grp_g0", 0)] == ["GenerationStarted"]
    assert seen.stream_at_first_token[("grp_g0", 1)] == ["GenerationStarted", "TokensStaged"]
    assert stream_types(log, "grp_g0") == [
        "GenerationStarted",
        "TokensStaged",
        "TokensStaged",
        "GenerationFinished",
    ]


def test_staged_rows_hold_exactly_the_tokens_and_logprobs_the_engine_produced(
    vllm_session: VllmSession, log: EventLog, data_plane: ClearableDataPlane
) -> None:
    seen = Deltas(log)
    worker = RolloutWorker(vllm_session.engine, log, data_plane, weight_version=3, on_delta=seen)
    engine = vllm_session.engine
    agent = get_agent("two_turn_digits")

    result = vllm_session.run(
        worker.run_attempt("exact", 1, 2, PROMPT, sampling(seed=5), agent.name)
    )

    rid = "exact_g1-a2"
    keys = [staging_key(rid, 0), staging_key(rid, 1)]
    assert result.receipt is not None
    assert result.receipt.rollout_id == rid and result.receipt.staging_keys == keys
    rows = data_plane.read_rows(worker.partition, keys)
    prompt_ids = engine.tokenize(PROMPT)
    prefixes = [prompt_ids, engine.tokenize(agent.follow_up)]
    trajectory: list[int] = []
    for call, key in enumerate(keys):
        row = rows[key]
        generated = seen.tokens[(rid, call)]
        assert len(generated) == MAX_TOKENS
        ids, mask, logprobs = row["token_ids"], row["mask"], row["logprobs"]
        assert isinstance(ids, torch.Tensor) and isinstance(mask, torch.Tensor)
        assert isinstance(logprobs, torch.Tensor)
        assert ids.tolist() == prefixes[call] + generated
        assert mask.tolist() == [0.0] * len(prefixes[call]) + [1.0] * MAX_TOKENS
        assert ids[mask == 1].tolist() == generated
        assert torch.equal(
            logprobs[mask == 1], torch.tensor(seen.logprobs[(rid, call)], dtype=torch.float32)
        )
        assert row["prev_len"] == len(trajectory)
        assert row["weight_version"] == 3
        trajectory += ids.tolist()

    staged = [r.event for r in log.read_stream(attempt_stream(rid)) if r.type == "TokensStaged"]
    assert [e.staging_key for e in staged if isinstance(e, TokensStaged)] == keys
    assert all(isinstance(e, TokensStaged) and e.token_count == MAX_TOKENS for e in staged)
    finished = list(log.read_stream(attempt_stream(rid)))[-1].event
    assert isinstance(finished, GenerationFinished)
    assert finished.token_count == 2 * MAX_TOKENS == result.token_count
    assert finished.staging_keys == keys and finished.reward == result.reward


def test_reward_and_mask_sample_come_from_the_attempts_agent(
    vllm_session: VllmSession, log: EventLog
) -> None:
    seen = Deltas(log)
    worker = RolloutWorker(vllm_session.engine, log, InMemoryDataPlane(), on_delta=seen)
    engine = vllm_session.engine

    overlap = vllm_session.run(worker.run_attempt("rw", 0, 0, PROMPT, sampling(1), "overlap"))
    digits = vllm_session.run(
        worker.run_attempt("rw", 1, 0, PROMPT, sampling(2), "two_turn_digits")
    )

    prompt_ids = tuple(engine.tokenize(PROMPT))
    overlap_ids = tuple(seen.tokens[("rw_g0", 0)])
    assert overlap.reward == prompt_overlap_reward(
        RewardInput(PROMPT, prompt_ids, engine.detokenize(overlap_ids), overlap_ids, "length")
    )
    digit_ids = tuple(seen.tokens[("rw_g1", 0)] + seen.tokens[("rw_g1", 1)])
    assert digits.reward == digit_reward(
        RewardInput(PROMPT, prompt_ids, engine.detokenize(digit_ids), digit_ids, "length")
    )
    # Both stopped at max_tokens; only two_turn_digits masks truncated samples.
    assert overlap.finish_reason == digits.finish_reason == "length"
    assert overlap.mask_sample is False
    assert digits.mask_sample is True


def test_failed_attempt_records_generation_failed_and_its_staged_row_has_no_receipt(
    vllm_session: VllmSession, log: EventLog
) -> None:
    plane = InMemoryDataPlane()
    # Fails on the second call's second token: call 0 is already staged by then.
    faults = FaultPlan(fail_after_tokens={"bad_g0": MAX_TOKENS + 2})
    worker = RolloutWorker(vllm_session.engine, log, plane, faults=faults)

    result = vllm_session.run(
        worker.run_attempt("bad", 0, 0, PROMPT, sampling(3), "two_turn_digits")
    )

    assert not result.finished
    assert result.receipt is None and result.reward is None and result.mask_sample is None
    assert result.error is not None and "injected failure" in result.error
    assert stream_types(log, "bad_g0") == ["GenerationStarted", "TokensStaged", "GenerationFailed"]
    failed = list(log.read_stream(attempt_stream("bad_g0")))[-1].event
    assert isinstance(failed, GenerationFailed) and "InjectedFailure" in failed.error
    # The row of the completed call stays in the data plane, owned by no receipt.
    assert sorted(plane.list_keys(worker.partition)) == [staging_key("bad_g0", 0)]
    assert worker.stats.failed == 1 and worker.stats.finished == 0


def test_killed_worker_leaves_generation_started_without_an_end_and_writes_nothing_more(
    vllm_session: VllmSession, log: EventLog
) -> None:
    plane = InMemoryDataPlane()
    # Dies on the first token of its second call: call 0 is staged by then.
    faults = FaultPlan(kill_after_tokens={"dead_g0": MAX_TOKENS + 1})
    worker = RolloutWorker(vllm_session.engine, log, plane, faults=faults)

    with pytest.raises(WorkerKilled, match="dead_g0"):
        vllm_session.run(worker.run_attempt("dead", 0, 0, PROMPT, sampling(4), "two_turn_digits"))
    head = log.head()

    assert stream_types(log, "dead_g0") == ["GenerationStarted", "TokensStaged"]
    # Its staged row remains, and no receipt names it (none was returned).
    assert list(plane.list_keys(worker.partition)) == [staging_key("dead_g0", 0)]
    assert worker.killed
    with pytest.raises(WorkerKilled):
        vllm_session.run(worker.run_attempt("dead", 1, 0, PROMPT, sampling(5), "overlap"))
    assert log.head() == head
    assert log.stream_version(attempt_stream("dead_g1")) is None


def test_killed_worker_stops_every_sibling_of_a_shared_engine_call_at_once(
    vllm_session: VllmSession, log: EventLog
) -> None:
    plane = InMemoryDataPlane()
    faults = FaultPlan(kill_after_tokens={"both_g1": 3})
    worker = RolloutWorker(vllm_session.engine, log, plane, faults=faults)

    with pytest.raises(WorkerKilled):
        vllm_session.run(
            worker.run_attempts("both", [(0, 0), (1, 0)], PROMPT, sampling(6, n=2), "overlap")
        )

    # Both samples advance in the same engine steps: neither finished its call.
    assert stream_types(log, "both_g0") == ["GenerationStarted"]
    assert stream_types(log, "both_g1") == ["GenerationStarted"]
    assert plane.list_partitions() == []


def test_siblings_sharing_one_engine_call_each_write_their_own_attempt_stream(
    vllm_session: VllmSession, log: EventLog
) -> None:
    seen = Deltas(log)
    worker = RolloutWorker(vllm_session.engine, log, InMemoryDataPlane(), on_delta=seen)
    attempts = [(0, 0), (1, 0), (2, 1), (3, 0)]

    results = vllm_session.run(
        worker.run_attempts("sib", attempts, PROMPT, sampling(20, n=4), "overlap")
    )

    expected = ["sib_g0", "sib_g1", "sib_g2-a1", "sib_g3"]
    assert [r.rollout_id for r in results] == expected
    assert all(r.finished and r.reward is not None and r.mask_sample is False for r in results)
    for i, rid in enumerate(expected):
        assert stream_types(log, rid) == ["GenerationStarted", "TokensStaged", "GenerationFinished"]
        started = next(iter(log.read_stream(attempt_stream(rid)))).event
        assert isinstance(started, GenerationStarted)
        assert started.sampling_params["seed"] == 20 + i
        assert started.generation_index == attempts[i][0] and started.attempt == attempts[i][1]
    # Different seeds, different samples.
    assert len({tuple(seen.tokens[(rid, 0)]) for rid in expected}) == len(expected)


def test_a_sibling_rerun_alone_with_its_recorded_seed_reproduces_its_tokens(
    vllm_session: VllmSession, log: EventLog
) -> None:
    seen = Deltas(log)
    worker = RolloutWorker(vllm_session.engine, log, InMemoryDataPlane(), on_delta=seen)
    vllm_session.run(
        worker.run_attempts("rep", [(0, 0), (1, 0), (2, 0)], PROMPT, sampling(30, n=3), "overlap")
    )
    started = next(iter(log.read_stream(attempt_stream("rep_g2")))).event
    assert isinstance(started, GenerationStarted)
    seed = started.sampling_params["seed"]
    assert isinstance(seed, int)

    vllm_session.run(worker.run_attempt("rep", 2, 1, PROMPT, sampling(seed), "overlap"))

    assert seen.tokens[("rep_g2-a1", 0)] == seen.tokens[("rep_g2", 0)]


def test_an_attempt_that_already_started_cannot_start_again_and_nothing_is_appended(
    vllm_session: VllmSession, log: EventLog
) -> None:
    worker = RolloutWorker(vllm_session.engine, log, InMemoryDataPlane())
    vllm_session.run(worker.run_attempt("dup", 0, 0, PROMPT, sampling(1), "overlap"))
    head = log.head()
    other = RolloutWorker(vllm_session.engine, log, InMemoryDataPlane(), worker_id="other")

    with pytest.raises(ConcurrencyError, match="attempt/dup_g0"):
        vllm_session.run(
            other.run_attempts("dup", [(1, 0), (0, 0)], PROMPT, sampling(2, n=2), "overlap")
        )

    assert log.head() == head
    assert log.stream_version(attempt_stream("dup_g1")) is None


def test_worker_stats_count_events_per_generated_token_and_time_waiting_for_the_log(
    vllm_session: VllmSession, log: EventLog
) -> None:
    worker = RolloutWorker(vllm_session.engine, log, InMemoryDataPlane())

    vllm_session.run(
        worker.run_attempts("st", [(i, 0) for i in range(4)], PROMPT, sampling(40, n=4), "overlap")
    )

    stats = worker.stats
    assert stats.generated_tokens == 4 * MAX_TOKENS
    # One start, one staged call and one finish per attempt.
    assert stats.events == 4 * 3 == log.head()
    assert stats.events_per_token == pytest.approx(12 / 32)
    assert 0 < stats.log_busy_s <= stats.busy_s
    assert 0 < stats.log_share <= 1
