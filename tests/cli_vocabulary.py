"""Event types the CLI tests append (prefixed `Cli` so they never clash with other tests')."""

from __future__ import annotations

import uuid

import msgspec

from eventlog.events import Event, event_type


@event_type
class CliNote(Event, frozen=True, kw_only=True):
    text: str
    n: int = 0


@event_type
class CliBare(Event, frozen=True, kw_only=True):
    """An event without fields: its JSON is the type tag alone."""


@event_type
class CliLabelled(Event, frozen=True, kw_only=True):
    """A set: its items are printed in one order whatever the process's hash seed."""

    labels: frozenset[str]


@event_type
class CliPacked(Event, frozen=True, kw_only=True, array_like=True):
    """Encoded as an array: printed by its fields' names."""

    count: int
    unit: str = "tokens"


@event_type
class CliKinded(Event, frozen=True, kw_only=True, tag_field="kind"):
    """Tagged by another field than the others' "type"."""

    text: str


class CliRef(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    weight: float


@event_type
class CliMeasured(Event, frozen=True, kw_only=True):
    name: str
    value: float
    ok: bool
    tags: list[str]
    ref: CliRef | None = None
    trace_id: uuid.UUID | None = None


class CliAttempt(msgspec.Struct, frozen=True, kw_only=True):
    rollout_id: str


@event_type
class CliDispatched(Event, frozen=True, kw_only=True):
    """Names attempts by `rollout_id`, nested in a list, as the real dispatch events do."""

    group_id: str
    attempts: list[CliAttempt]
