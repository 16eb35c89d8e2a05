"""Agents: how many model calls an attempt makes, and how its completion is rewarded.

An agent is looked up by name (the group's `agent_name`), so a run can mix tasks with
different rewards. Rewards are pure functions of the prompt and the completion: the same
tokens always earn the same reward, which makes a rerun auditable. Two built-in agents serve
the tests and the demo; `register_agent` adds more.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

from eventlog.recovery.errors import ConfigError


@dataclass(frozen=True)
class RewardInput:
    """What a reward function sees of one finished attempt."""

    prompt_text: str
    prompt_token_ids: tuple[int, ...]
    completion_text: str
    """Every generated token of every call, decoded (environment text between calls excluded)."""
    completion_token_ids: tuple[int, ...]
    finish_reason: str
    """The last call's finish reason ("stop" or "length")."""


RewardFn = Callable[[RewardInput], float]


@dataclass(frozen=True)
class Agent:
    """One kind of rollout: its model calls per attempt and its reward."""

    name: str
    reward: RewardFn
    calls: int = 1
    """Model calls per attempt; each call after the first continues the whole trajectory."""
    follow_up: str = ""
    """Environment text appended to the trajectory before each call after the first."""
    mask_truncated: bool = False
    """Set mask_sample (exclude from training) when the last call stopped at max_tokens."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("agent name: expected a non-empty str, found ''")
        if self.calls < 1:
            raise ConfigError(f"agent {self.name!r}: calls must be >= 1, found {self.calls}")
        if self.calls > 1 and not self.follow_up:
            raise ConfigError(
                f"agent {self.name!r}: {self.calls} calls need a follow_up text between calls"
            )

    def mask_sample(self, finish_reason: str) -> bool:
        """Whether the attempt's row is kept out of the loss."""
        return self.mask_truncated and finish_reason == "length"


def prompt_overlap_reward(inputs: RewardInput) -> float:
    """Share of the prompt's distinct tokens that the completion repeats (0..1)."""
    wanted = set(inputs.prompt_token_ids)
    if not wanted:
        return 0.0
    return len(wanted & set(inputs.completion_token_ids)) / len(wanted)


def digit_reward(inputs: RewardInput) -> float:
    """Digits in the completion, four or more earning the full reward (0..1)."""
    digits = sum(ch.isdigit() for ch in inputs.completion_text)
    return min(1.0, digits / 4)


_lock = threading.Lock()
_AGENTS: dict[str, Agent] = {}


def register_agent(agent: Agent, *, replace: bool = False) -> Agent:
    """Make `agent` available by name; a second agent of the same name is an error."""
    with _lock:
        existing = _AGENTS.get(agent.name)
        if existing is not None and existing != agent and not replace:
            raise ConfigError(f"agent {agent.name!r} is already registered with another definition")
        _AGENTS[agent.name] = agent
    return agent


def get_agent(name: str | None) -> Agent:
    """The agent registered under `name` (None means the default, `overlap`)."""
    key = DEFAULT_AGENT if name is None else name
    with _lock:
        agent = _AGENTS.get(key)
        known = sorted(_AGENTS)
    if agent is None:
        raise ConfigError(f"agent {key!r}: expected one of {known}, found no such agent")
    return agent


def agent_names() -> list[str]:
    """Every registered agent name, sorted."""
    with _lock:
        return sorted(_AGENTS)


def checked_reward(agent: Agent, inputs: RewardInput) -> float:
    """Run the agent's reward and insist on a finite float."""
    value = agent.reward(inputs)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"agent {agent.name!r}: reward must be a finite number, found {value!r}")
    return float(value)


DEFAULT_AGENT = "overlap"

register_agent(Agent(name="overlap", reward=prompt_overlap_reward))
register_agent(
    Agent(
        name="two_turn_digits",
        reward=digit_reward,
        calls=2,
        follow_up="\nQuestion: what is 2 + 3? Answer:",
        mask_truncated=True,
    )
)
