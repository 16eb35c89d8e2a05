"""eventlog: an append-only, hash-chained event log on SQLite or PostgreSQL.

The package root is the log alone; the rollout-recovery domain built on it lives in
`eventlog.recovery` (with `eventlog.dataplane` and `eventlog.rollout` beside it).

Its names load on first use (PEP 562), so a program that imports one module of the package
starts without the rest: the `eventlog` command takes Ctrl-C as soon as it starts.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing's own, without importing typing (3 ms before Ctrl-C is caught)
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


if not TYPE_CHECKING:  # a type checker sees the imports above, and no catch-all

    def __getattr__(name: str) -> object:
        """A public name, loaded from its home; or a submodule (`eventlog.codec` after
        `import eventlog`, as when the package imported its modules eagerly)."""
        home = _HOMES.get(name)
        if home is not None:
            value = getattr(importlib.import_module(home), name)
        elif not name.isidentifier():  # '.', 'cli.db': no submodule of this package
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        else:
            try:
                value = importlib.import_module(f"{__name__}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{__name__}.{name}":
                    raise
                raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_HOMES})


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
