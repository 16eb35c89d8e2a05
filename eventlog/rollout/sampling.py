"""What a rollout worker asks of an engine, without importing vLLM.

The worker, the agents and the tests name these types; only `eventlog.rollout.engine`
turns them into vLLM calls, so code that never generates never loads vLLM.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from eventlog.recovery.errors import ConfigError

ParamValue = str | int | float | bool | None


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters of one engine call (a subset of vLLM's, recorded in the log).

    With ``n > 1`` and a seed, sample ``i`` is drawn with seed ``seed + i`` (vLLM's rule), so
    a sibling rerun alone with that seed reproduces its tokens.
    """

    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ConfigError(f"sampling.n: expected >= 1, found {self.n}")
        if self.max_tokens < 1:
            raise ConfigError(f"sampling.max_tokens: expected >= 1, found {self.max_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"sampling.temperature: expected >= 0, found {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"sampling.top_p: expected in (0, 1], found {self.top_p}")

    def as_record(self) -> dict[str, ParamValue]:
        """The parameters as a flat dict of scalars, for GenerationStarted."""
        return {
            "n": self.n,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "ignore_eos": self.ignore_eos,
        }


@dataclass(frozen=True)
class SampleDelta:
    """New tokens of one sample of a request since its previous delta."""

    index: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    """The sampled token's own logprob at each new position."""
    finish_reason: str | None
    """Set on the sample's last delta ("stop", "length", "abort"); None while it runs."""


class TokenEngine(Protocol):
    """An engine a rollout worker can drive (`eventlog.rollout.engine.VllmEngine`)."""

    @property
    def model_name(self) -> str:
        """The model as recorded in GenerationStarted."""
        ...

    def tokenize(self, text: str) -> list[int]:
        """Token ids of `text`, no special tokens added."""
        ...

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """Text of `token_ids`, special tokens dropped."""
        ...

    def generate(
        self, prompt_token_ids: Sequence[int], sampling: Sampling, request_id: str
    ) -> AsyncIterator[SampleDelta]:
        """Stream deltas of every sample until each has its own finish_reason."""
        ...
