"""Failure injection for the demo and the tests: an attempt that errors, a worker that dies.

Both trigger after an attempt has generated K tokens (counted over all its calls), so a
fault can land between two staged calls. A *failure* is an ordinary error inside one attempt:
the worker records `GenerationFailed` and its siblings carry on. A *kill* stands for the
worker process dying (SIGKILL, OOM, lost host): from that moment the worker writes nothing
more, for any attempt it was running, and refuses new work. What the log and the data plane
then hold is exactly what a real kill leaves behind, because every write the worker made
before it was already durable (appends and `put_rows` return only when acknowledged).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eventlog.recovery.errors import RolloutError


class InjectedFailure(RolloutError):
    """An attempt failed on purpose (FaultPlan.fail_after_tokens)."""


class WorkerKilled(RolloutError):
    """The worker 'died' (FaultPlan.kill_after_tokens): it appended nothing after this point."""


@dataclass
class FaultPlan:
    """Faults to inject, by rollout id -> number of generated tokens that triggers them."""

    fail_after_tokens: dict[str, int] = field(default_factory=dict)
    kill_after_tokens: dict[str, int] = field(default_factory=dict)

    def check(self, rollout_id: str, generated: int) -> None:
        """Raise the fault due for `rollout_id` once it has generated `generated` tokens."""
        kill_at = self.kill_after_tokens.get(rollout_id)
        if kill_at is not None and generated >= kill_at:
            raise WorkerKilled(
                f"attempt {rollout_id!r}: worker killed after {generated} generated tokens "
                f"(injected at {kill_at})"
            )
        fail_at = self.fail_after_tokens.get(rollout_id)
        if fail_at is not None and generated >= fail_at:
            raise InjectedFailure(
                f"attempt {rollout_id!r}: injected failure after {generated} generated tokens "
                f"(injected at {fail_at})"
            )
