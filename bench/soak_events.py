"""The event the soak harness appends (its own module, so `--events-module` can name it)."""

from __future__ import annotations

from eventlog.events import Event, event_type


@event_type
class SoakNote(Event, frozen=True, kw_only=True):
    """Who wrote it and a counter, padded to a realistic size."""

    writer: str
    n: int
    pad: str = ""
