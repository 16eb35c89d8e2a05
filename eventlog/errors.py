"""One error hierarchy for everything eventlog raises on purpose.

Every message names the thing that was wrong (seq, stream, group, sibling, key path),
what was expected and what was found, so that a one-line CLI report is enough to act on.
"""

from __future__ import annotations


class EventLogError(Exception):
    """Base of every error eventlog raises deliberately; the CLI prints these as one line."""

    hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint


class ConcurrencyError(EventLogError):
    """The stream's version was not the one the caller expected; nothing was written."""

    def __init__(self, stream: str, expected: object, actual: int | None) -> None:
        self.stream = stream
        self.expected = expected
        self.actual = actual
        shown = "no stream" if actual is None else f"version {actual}"
        super().__init__(f"stream {stream!r}: expected {expected}, found {shown}")


class DuplicateEventError(EventLogError):
    """An event id is already stored with different content."""

    def __init__(self, event_id: str, stream: str, seq: int) -> None:
        self.event_id = event_id
        self.stream = stream
        self.seq = seq
        super().__init__(
            f"event id {event_id} is already stored at seq {seq} (stream {stream!r}) "
            "with different content"
        )


class InvalidEventError(EventLogError):
    """An event or append request is malformed (bad field, bad stream name, bad JSON)."""


class SchemaError(EventLogError):
    """A stored record cannot be decoded: unknown type, future schema, or corrupt payload."""

    def __init__(
        self, message: str, *, seq: int | None = None, type_name: str | None = None
    ) -> None:
        self.seq = seq
        self.type_name = type_name
        super().__init__(message)


class UnknownEventTypeError(SchemaError):
    """A record's type tag is not in this program's vocabulary."""


class FutureSchemaError(SchemaError):
    """A record was written by a newer program with a schema version this one cannot read."""


class LogRevisionError(EventLogError):
    """The database is at a schema revision this program cannot use as is."""


class IntegrityError(EventLogError):
    """verify() found a broken chain, a gap or a duplicate."""

    def __init__(self, message: str, *, seq: int) -> None:
        self.seq = seq
        super().__init__(message)


class LogClosedError(EventLogError):
    """The log was closed while an operation was pending or after it was closed."""


class LedgerRuleError(EventLogError):
    """A recovery-ledger command broke a domain rule; nothing was appended."""


class BarrierError(EventLogError):
    """The mutation barrier was misused (nested section, stale cut)."""


class ReconciliationError(EventLogError):
    """The log and the data plane disagree in a way restore must not paper over."""


class ConfigError(EventLogError):
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
