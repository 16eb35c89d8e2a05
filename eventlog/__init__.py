"""eventlog: the durable, auditable memory of an asynchronous RL post-training run."""

from eventlog.errors import (
    ConcurrencyError,
    DuplicateEventError,
    EventLogError,
    IntegrityError,
    InvalidEventError,
    LogRevisionError,
    SchemaError,
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
    "IntegrityError",
    "InvalidEventError",
    "LogRevisionError",
    "Proposed",
    "Record",
    "RecordedEvent",
    "SchemaError",
    "UnknownEventTypeError",
    "event_type",
]
