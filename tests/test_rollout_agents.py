"""Agents, rewards, sampling parameters and fault plans: the worker's inputs, checked early."""

from __future__ import annotations

import math

import pytest

from eventlog.recovery.errors import ConfigError
from eventlog.rollout.agents import (
    Agent,
    RewardInput,
    checked_reward,
    digit_reward,
    get_agent,
    prompt_overlap_reward,
    register_agent,
)
from eventlog.rollout.faults import FaultPlan, InjectedFailure, WorkerKilled
from eventlog.rollout.sampling import Sampling


def reward_input(completion_text: str = "", completion_ids: tuple[int, ...] = ()) -> RewardInput:
    return RewardInput("prompt", (1, 2, 3, 4), completion_text, completion_ids, "length")


def test_an_unknown_agent_is_an_error_naming_it_and_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"'no_such_agent'.*overlap"):
        get_agent("no_such_agent")


def test_no_agent_name_means_the_default_agent() -> None:
    assert get_agent(None).name == "overlap"


def test_an_agent_name_cannot_be_registered_twice_with_different_definitions() -> None:
    register_agent(Agent(name="test_twice", reward=digit_reward))
    register_agent(Agent(name="test_twice", reward=digit_reward))  # same definition: fine
    with pytest.raises(ConfigError, match="test_twice"):
        register_agent(Agent(name="test_twice", reward=prompt_overlap_reward))


def test_a_multi_call_agent_needs_text_between_its_calls() -> None:
    with pytest.raises(ConfigError, match="follow_up"):
        Agent(name="x", reward=digit_reward, calls=2)


def test_built_in_rewards_are_deterministic_functions_of_the_completion() -> None:
    assert prompt_overlap_reward(reward_input(completion_ids=(2, 4, 9))) == 0.5
    assert prompt_overlap_reward(reward_input(completion_ids=())) == 0.0
    assert digit_reward(reward_input("a1b2")) == 0.5
    assert digit_reward(reward_input("123456")) == 1.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, True, "1.0"])
def test_a_reward_that_is_not_a_finite_number_is_an_error_naming_the_agent(bad: object) -> None:
    agent = Agent(name="broken", reward=lambda _: bad)  # type: ignore[arg-type, return-value]
    with pytest.raises(ConfigError, match="'broken'"):
        checked_reward(agent, reward_input())


def test_mask_sample_is_set_only_for_truncated_attempts_of_agents_that_ask_for_it() -> None:
    masking = Agent(name="m", reward=digit_reward, mask_truncated=True)
    keeping = Agent(name="k", reward=digit_reward)
    assert masking.mask_sample("length") is True
    assert masking.mask_sample("stop") is False
    assert keeping.mask_sample("length") is False


@pytest.mark.parametrize(
    ("field", "value"),
    [("n", 0), ("max_tokens", 0), ("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5)],
)
def test_bad_sampling_parameters_are_errors_naming_the_parameter(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"sampling.{field}"):
        Sampling(**{field: value})  # type: ignore[arg-type]


def test_a_fault_fires_once_its_attempt_has_generated_enough_tokens() -> None:
    plan = FaultPlan(fail_after_tokens={"g_g0": 3}, kill_after_tokens={"g_g1": 2})
    plan.check("g_g0", 2)
    plan.check("g_g2", 100)
    with pytest.raises(InjectedFailure, match="g_g0"):
        plan.check("g_g0", 3)
    with pytest.raises(WorkerKilled, match="g_g1"):
        plan.check("g_g1", 5)
