"""eventlog: the durable, auditable memory of an asynchronous RL post-training run."""

from eventlog.barrier import Cut, MutationBarrier
from eventlog.config import RecoveryConfig, load_config, resolve_granularity
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
from eventlog.ledger import RecoveryLedger, SiblingResult
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
from eventlog.restore import Dataset, RestorePlan

__all__ = [
    "ANY",
    "NO_STREAM",
    "AppendRequest",
    "AppendResult",
    "ConcurrencyError",
    "Cut",
    "Dataset",
    "DuplicateEventError",
    "Event",
    "EventLog",
    "EventLogError",
    "IntegrityError",
    "InvalidEventError",
    "LogRevisionError",
    "MutationBarrier",
    "Proposed",
    "Record",
    "RecordedEvent",
    "RecoveryConfig",
    "RecoveryLedger",
    "RestorePlan",
    "SchemaError",
    "SiblingResult",
    "UnknownEventTypeError",
    "event_type",
    "load_config",
    "resolve_granularity",
]
