"""Errors of the rollout-recovery domain (ledger, barrier, reconciliation, data plane, workers)."""

from __future__ import annotations

from eventlog.errors import ConcurrencyError, EventLogError, InputError


class LedgerRuleError(EventLogError):
    """A recovery-ledger command broke a domain rule; nothing was appended."""


class BarrierError(EventLogError):
    """The mutation barrier was misused (nested section, stale cut)."""


class ReconciliationError(EventLogError):
    """The log and the data plane disagree in a way restore must not paper over."""


class ControllerFencedError(ConcurrencyError):
    """Another controller took a newer fencing epoch: this ledger's command appended nothing.

    A ConcurrencyError on the epoch stream, with both epochs named; reopen or restore the
    ledger (which takes a newer epoch in turn) only if this controller should take over.
    """

    def __init__(self, stream: str, *, held_epoch: int, current_epoch: int, by: str) -> None:
        super().__init__(stream, held_epoch - 1, current_epoch - 1)
        self.held_epoch = held_epoch
        self.current_epoch = current_epoch
        self.args = (
            f"this controller holds fencing epoch {held_epoch}, but epoch {current_epoch} "
            f"was taken{by} (stream {stream!r}); it is superseded and appended nothing",
        )


class ProjectionVersionError(ReconciliationError):
    """A checkpoint was written by code with another projection version (not a divergence)."""


class ConfigError(InputError):
    """The recovery configuration is invalid; the message names the key path."""


class DataPlaneError(EventLogError):
    """The data plane failed or returned something other than what was asked for."""


class MissingRowsError(DataPlaneError):
    """Rows that were asked for by key are not in the data plane."""

    def __init__(self, partition: str, keys: list[str]) -> None:
        self.partition = partition
        self.keys = keys
        shown = ", ".join(keys[:5]) + (f" … ({len(keys)} in all)" if len(keys) > 5 else "")
        super().__init__(f"partition {partition!r}: missing staging keys {shown}")


class StaleAttemptError(LedgerRuleError):
    """A result names an attempt that is no longer current (superseded, abandoned or failed).

    Expected traffic, not a bug: a late worker result. Nothing is appended; pass the error to
    ``RecoveryLedger.record_rejected_result`` to make the rejection visible in the audit.
    """

    def __init__(
        self,
        message: str,
        *,
        group_id: str,
        generation_index: int,
        rollout_id: str,
        current_rollout_id: str | None,
    ) -> None:
        self.group_id = group_id
        self.generation_index = generation_index
        self.rollout_id = rollout_id
        self.current_rollout_id = current_rollout_id
        super().__init__(message)


class PromptIdentityError(ReconciliationError):
    """A prompt rehydrated from the dataset is not the one the group was reserved for."""


class RolloutError(EventLogError):
    """A rollout worker or its vLLM engine failed to run an attempt."""


class DemoError(EventLogError):
    """`eventlog demo` could not complete its run (a controller failed, or a kill never came)."""
