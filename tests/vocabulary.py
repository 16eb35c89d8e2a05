"""Event types the log's own tests append (the log is domain-agnostic)."""

from __future__ import annotations

from eventlog.events import Event, event_type


@event_type
class LogNote(Event, frozen=True, kw_only=True):
    text: str
    n: int = 0
