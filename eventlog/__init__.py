"""eventlog: an append-only, hash-chained event log on SQLite or PostgreSQL.

The package root is the log alone; the rollout-recovery domain built on it lives in
`eventlog.recovery` (with `eventlog.dataplane` and `eventlog.rollout` beside it).

Its names load on first use (PEP 562), so a program that imports one module of the package
starts without the rest: the `eventlog` command takes Ctrl-C as soon as it starts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_HOMES = {
    **dict.fromkeys(
        (
            "ConcurrencyError",
            "DuplicateEventError",
            "EventLogError",
            "InputError",
            "IntegrityError",
            "InvalidEventError",
            "LogRevisionError",
            "SchemaError",
            "StorageError",
            "StorageIntegrityError",
            "StorageUnavailableError",
            "UnknownEventTypeError",
        ),
        "eventlog.errors",
    ),
    "Event": "eventlog.events",
    "event_type": "eventlog.events",
    "EventLog": "eventlog.log",
    **dict.fromkeys(
        (
            "ANY",
            "NO_STREAM",
            "AppendRequest",
            "AppendResult",
            "Proposed",
            "Record",
            "RecordedEvent",
        ),
        "eventlog.records",
    ),
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'eventlog' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


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
