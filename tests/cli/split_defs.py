"""An event class defined here and registered by another module (`split_reg`)."""

from __future__ import annotations

from typing import ClassVar

from eventlog.events import Event


class SplitNote(Event, frozen=True, kw_only=True):
    schema: ClassVar[int] = 1
    text: str
