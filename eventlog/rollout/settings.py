"""The shape of a controller run, importable without torch or vLLM (the demo's parent uses it)."""

from __future__ import annotations

from dataclasses import dataclass

from eventlog.recovery.errors import ConfigError


@dataclass(frozen=True)
class LoopSettings:
    """The shape of a run; the defaults fit a 2-core CPU with the tiny model."""

    steps: int = 3
    groups_per_step: int = 4
    siblings: int = 4
    max_tokens: int = 24
    lookahead: int = 1
    """Steps generated ahead of the one that trains next."""
    workers: int = 2
    slots: int = 8
    """Attempts in flight at once over all workers (the rest wait, by priority)."""
    max_attempts: int = 4
    """Attempts per sibling before its group is discarded."""
    seed: int = 0
    temperature: float = 1.0

    def __post_init__(self) -> None:
        for name in ("steps", "groups_per_step", "siblings", "max_tokens", "workers", "slots"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: expected >= 1, found {getattr(self, name)}")
        if self.lookahead < 0:
            raise ConfigError(f"lookahead: expected >= 0, found {self.lookahead}")
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts: expected >= 1, found {self.max_attempts}")
