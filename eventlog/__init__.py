"""eventlog: an append-only, hash-chained event log on SQLite or PostgreSQL.

The package root is the log alone; the rollout-recovery domain built on it lives in
`eventlog.recovery` (with `eventlog.dataplane` and `eventlog.rollout` beside it).
"""

from eventlog.errors import (
    ConcurrencyError,
    DuplicateEventError,
    EventLogError,
    InputError,
    IntegrityError,
    InvalidEventError,
    LogRevisionError,
    SchemaError,
    StorageError,
    StorageIntegrityError,
    StorageUnavailableError,
    UnknownEventTypeError,
)
from eventlog.events import Event, event_type
from eventlog.log import EventLog
from eventlog.records import (
    ANY,
    NO_STREAM,
    AppendRequest,
    AppendResult,
    Proposed,
    Record,
    RecordedEvent,
)

__all__ = [
    "ANY",
    "NO_STREAM",
    "AppendRequest",
    "AppendResult",
    "ConcurrencyError",
    "DuplicateEventError",
    "Event",
    "EventLog",
    "EventLogError",
    "InputError",
    "IntegrityError",
    "InvalidEventError",
    "LogRevisionError",
    "Proposed",
    "Record",
    "RecordedEvent",
    "SchemaError",
    "StorageError",
    "StorageIntegrityError",
    "StorageUnavailableError",
    "UnknownEventTypeError",
    "event_type",
]
