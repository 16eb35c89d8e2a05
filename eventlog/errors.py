"""One error hierarchy for everything eventlog raises on purpose.

Every message names the thing that was wrong (seq, stream, group, sibling, key path),
what was expected and what was found, so that a one-line CLI report is enough to act on.
"""

from __future__ import annotations

from typing import Any


class EventLogError(Exception):
    """Base of every error eventlog raises deliberately; the CLI prints these as one line."""

    hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its class and args, rebuilt without its constructor, then given its
        fields as pickle's state (so an error that refers to itself keeps doing so): Python
        calls `cls(*args)`, which fails for every error whose constructor takes other
        arguments than its message, and a Ray actor's ConcurrencyError reached the caller
        as an unpickling failure."""
        return (rebuilt, (type(self), self.args, {}), dict(vars(self)))


def rebuilt(
    cls: type[BaseException], args: tuple[Any, ...], fields: dict[str, Any]
) -> BaseException:
    """An exception of `cls` with these args and fields, its constructor not called."""
    error = cls.__new__(cls)
    error.args = args
    vars(error).update(fields)
    return error


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


class InputError(EventLogError):
    """The caller's input is invalid (an event, an argument, a configuration); nothing was done."""


class InvalidEventError(InputError):
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


class DamagedRecordError(IntegrityError):
    """A stored record's column holds a value of the wrong storage type (edited outside eventlog).

    Raised by the store when it reads the record, before anything decodes it, so a reader
    never replays a record whose envelope it cannot trust.
    """

    def __init__(self, message: str, *, seq: int, column: str) -> None:
        self.column = column
        super().__init__(message, seq=seq)


class StorageError(EventLogError):
    """The database failed an operation (PEP 249's DatabaseError, translated by the store).

    The original driver exception is kept as ``__cause__``; the message names the target.
    """


class StorageUnavailableError(StorageError):
    """The database cannot do the work now: a lock held past the busy timeout, a lost
    connection, a full disk, a read-only file. Nothing of the failed call was committed, so
    retrying the same append (with the same event ids) is safe once the cause is gone."""


class StorageIntegrityError(StorageError):
    """The database refused a write that breaks one of its constraints or triggers
    (PEP 249's IntegrityError; e.g. an UPDATE of a record, which the log never does)."""


class StorageDamagedError(StorageError):
    """The database file is not a database or is damaged (SQLite's `malformed` / `notadb`)."""


class LogClosedError(EventLogError):
    """The log was closed while an operation was pending or after it was closed."""
