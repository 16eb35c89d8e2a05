"""Failure injection for the demo and the tests: an attempt that errors, a worker that dies,
a straggler.

Both trigger after an attempt has generated K tokens (counted over all its calls), so a
fault can land between two staged calls. A *failure* is an ordinary error inside one attempt:
the worker records `GenerationFailed` and its siblings carry on. A *kill* stands for the
worker process dying (SIGKILL, OOM, lost host): from that moment the worker writes nothing
more, for any attempt it was running, and refuses new work. What the log and the data plane
then hold is exactly what a real kill leaves behind, because every write the worker made
before it was already durable (appends and `put_rows` return only when acknowledged).

A *stall* is a straggler: every attempt of one sibling waits, before it generates, until
another sibling's result is sealed or the trainer's weights reach a version. It makes a
schedule certain where timing would only make it likely (the demo's checkpoint catching a
group half-sealed). The controller reports its seals here, so stalls need in-process workers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eventlog.recovery.errors import RolloutError
from eventlog.recovery.vocabulary import logical_id, parse_rollout_id


class InjectedFailure(RolloutError):
    """An attempt failed on purpose (FaultPlan.fail_after_tokens)."""


class WorkerKilled(RolloutError):
    """The worker 'died' (FaultPlan.kill_after_tokens): it appended nothing after this point."""


@dataclass
class FaultPlan:
    """Faults to inject, by rollout id -> number of generated tokens that triggers them."""

    fail_after_tokens: dict[str, int] = field(default_factory=dict)
    kill_after_tokens: dict[str, int] = field(default_factory=dict)
    stall_until_sealed: dict[str, str] = field(default_factory=dict)
    """Logical id of a stalled sibling -> the logical id whose seal releases it."""
    stall_until_weights: dict[str, int] = field(default_factory=dict)
    """Logical id of a stalled sibling -> the weight version that releases it."""
    sealed: set[str] = field(default_factory=set)
    """Logical ids sealed so far (`seal_landed`); shared by the copies a pool makes."""

    def without_kills(self) -> FaultPlan:
        """The plan for a worker that replaces a killed one: a kill names the attempt that
        brought a worker down, and that attempt is gone with it. Stalls and seals are shared."""
        return FaultPlan(
            fail_after_tokens=dict(self.fail_after_tokens),
            stall_until_sealed=self.stall_until_sealed,
            stall_until_weights=self.stall_until_weights,
            sealed=self.sealed,
        )

    def seal_landed(self, rollout_id: str) -> None:
        """The controller sealed this attempt's result: siblings stalled on it may go."""
        self.sealed.add(_logical(rollout_id))

    def stalled(self, rollout_id: str, weight_version: int) -> bool:
        """True while an attempt of a stalled sibling must still wait."""
        logical = _logical(rollout_id)
        after = self.stall_until_sealed.get(logical)
        if after is not None and after not in self.sealed:
            return True
        version = self.stall_until_weights.get(logical)
        return version is not None and weight_version < version

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


def _logical(rollout_id: str) -> str:
    parts = parse_rollout_id(rollout_id)
    return rollout_id if parts is None else logical_id(parts.group_id, parts.generation_index)
