"""The base of every event and the registry of event types, by tag.

Schema evolution (msgspec's rules, made explicit):
- adding a field with a default is compatible and keeps the schema version;
- removing, renaming or changing the meaning/type of a field bumps `schema` by one and
  registers an upcaster (codec.register_upcaster) that turns a payload of the old version
  into the new one. Versions only grow; old records stay readable forever.
"""

from __future__ import annotations

from typing import ClassVar, TypeVar

import msgspec


class Event(msgspec.Struct, frozen=True, kw_only=True, tag=True, forbid_unknown_fields=False):
    """Base of every event; the class name is the record's `type`, `schema` its version."""

    schema: ClassVar[int] = 1


_EVENT_TYPES: dict[str, type[Event]] = {}


E = TypeVar("E", bound=type[Event])


def event_type(cls: E) -> E:
    """Register an event class in the vocabulary (by its tag, the class name)."""
    name = cls.__struct_config__.tag
    if not isinstance(name, str):  # pragma: no cover - tag=True always gives the name
        raise TypeError(f"{cls.__name__} must be tagged with a string")
    existing = _EVENT_TYPES.get(name)
    if existing is not None and existing is not cls:
        raise TypeError(f"event type {name!r} is registered twice")
    # msgspec (0.23) decodes a tag that is not ASCII only once the tag's UTF-8 form is
    # cached on it, which encoding it does: else a fresh process read none of these records.
    msgspec.json.encode(name)
    _EVENT_TYPES[name] = cls
    return cls


def event_types() -> dict[str, type[Event]]:
    """Every registered event type by name (a copy)."""
    return dict(_EVENT_TYPES)
