"""Bytes <-> events: msgpack payloads, schema versions and upcasters.

A payload is the msgpack encoding of the event struct (its tag included, so a payload read
on its own still says what it is). A record of an older schema version is decoded to a plain
mapping, passed through the registered upcasters vN -> vN+1 until it reaches the current
version, then converted; a newer version or an unknown type is a typed error naming the seq.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import msgspec

from eventlog.errors import FutureSchemaError, InvalidEventError, SchemaError, UnknownEventTypeError
from eventlog.events import Event, event_types

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

_UPCASTERS: dict[tuple[str, int], Upcaster] = {}
_encoder = msgspec.msgpack.Encoder()
_decoders: dict[type[Event], msgspec.msgpack.Decoder[Any]] = {}
_raw_decoder = msgspec.msgpack.Decoder()
_json_encode = msgspec.json.Encoder(order="sorted").encode


def register_upcaster(type_name: str, from_schema: int) -> Callable[[Upcaster], Upcaster]:
    """Register the function that turns a `type_name` payload of `from_schema` into the next."""

    def register(fn: Upcaster) -> Upcaster:
        key = (type_name, from_schema)
        if key in _UPCASTERS:
            raise TypeError(f"an upcaster for {type_name} v{from_schema} is already registered")
        _UPCASTERS[key] = fn
        return fn

    return register


def vocabulary() -> dict[str, object]:
    """What decoding a record depends on: every registered event type's class ("type NAME")
    and every upcaster ("upcaster NAME vN"). Processes with the same vocabulary decode every
    record alike."""
    found: dict[str, object] = {f"type {name}": cls for name, cls in event_types().items()}
    found |= {f"upcaster {name} v{schema}": fn for (name, schema), fn in _UPCASTERS.items()}
    return found


def encode(event: Event) -> tuple[str, int, bytes]:
    """The record columns (type, schema, payload) for an event, checked to decode again.

    msgspec checks field constraints (non-empty ids, indices >= 0) only when decoding, so a
    struct built in code may violate them; decoding the payload once here guarantees the log
    never stores a record it cannot read back, for about a microsecond per event.
    """
    cls = type(event)
    known = _encodings.get(cls)
    if known is None:
        known = _encoding(cls)
    name, schema, check = known
    try:
        payload = _encode(event)
        check(payload)
    except (
        msgspec.ValidationError,
        msgspec.EncodeError,
        OverflowError,
        TypeError,
        UnicodeEncodeError,  # a lone surrogate in a string field
        RecursionError,  # a list that holds itself, or one nested too deeply to encode
    ) as exc:
        raise InvalidEventError(f"{name}: {exc}") from exc
    return name, schema, payload


def _encoding(cls: type[Event]) -> tuple[str, int, Callable[[bytes], Any]]:
    """Looked up once per class: only a registered class with a storable schema is cached,
    so the log never holds a record its readers would decode as another type, or whose
    schema column no reader (or `verify`) would take for the one that was chained."""
    name = cls.__struct_config__.tag
    shown = name if isinstance(name, str) else cls.__qualname__
    registered = event_types().get(name) if isinstance(name, str) else None
    if registered is not cls:
        where = f"{cls.__module__}.{cls.__qualname__}"
        if registered is None:
            raise InvalidEventError(
                f"{shown}: event class {where} is not registered (decorate it with "
                "@event_type): its records could not be read back"
            )
        raise InvalidEventError(
            f"{shown}: event class {where} is not the class registered for {shown!r} "
            f"({registered.__module__}.{registered.__qualname__}): its records would be "
            "read back as that one"
        )
    schema = cls.schema
    if schema.__class__ is not int or not 1 <= schema <= MAX_SCHEMA:
        raise InvalidEventError(
            f"{shown}: schema must be an int in 1..{MAX_SCHEMA}, found "
            f"{type(schema).__name__} {schema!r:.40}"
        )
    assert isinstance(name, str)
    known = _encodings[cls] = (name, schema, _decoder_for(cls).decode)
    return known


MAX_SCHEMA = 2**31 - 1
"""The largest schema version a record's column holds on every backend (a 32-bit INTEGER)."""


_encode = _encoder.encode
_encodings: dict[type[Event], tuple[str, int, Callable[[bytes], Any]]] = {}
"""Per event class: its type name, schema and validating decoder (looked up once, not per
event: an append encodes every event through here)."""


def _decoder_for(cls: type[Event]) -> msgspec.msgpack.Decoder[Any]:
    decoder = _decoders.get(cls)
    if decoder is None:
        decoder = _decoders[cls] = msgspec.msgpack.Decoder(cls)
    return decoder


def decode(type_name: str, schema: int, payload: bytes, *, seq: int | None = None) -> Event:
    """The event stored in a record; raises SchemaError naming seq and type when it can't."""
    current = _current.get(type_name)
    if current is not None and current[0] == schema:
        try:
            return current[1].decode(payload)  # type: ignore[no-any-return]
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise SchemaError(
                f"{_where(seq)}: {type_name} v{schema} payload does not decode: {exc}",
                seq=seq,
                type_name=type_name,
            ) from exc
    where = _where(seq)
    cls = event_types().get(type_name)
    if cls is None:
        raise UnknownEventTypeError(
            f"{where}: unknown event type {type_name!r}",
            seq=seq,
            type_name=type_name,
        )
    try:
        if schema == cls.schema:
            decoder = _current[type_name] = (schema, _decoder_for(cls))
            return decoder[1].decode(payload)  # type: ignore[no-any-return]
        if schema > cls.schema:
            raise FutureSchemaError(
                f"{where}: {type_name} has schema v{schema}, this program reads up to "
                f"v{cls.schema}; upgrade eventlog to read it",
                seq=seq,
                type_name=type_name,
            )
        data = _raw_decoder.decode(payload)
        if not isinstance(data, dict):
            raise SchemaError(f"{where}: {type_name} payload is not a mapping", seq=seq)
        for version in range(schema, cls.schema):
            upcast = _UPCASTERS.get((type_name, version))
            if upcast is None:
                raise SchemaError(
                    f"{where}: no upcaster from {type_name} v{version} to v{version + 1}",
                    seq=seq,
                    type_name=type_name,
                )
            data = upcast(data)
        return msgspec.convert(data, cls)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SchemaError(
            f"{where}: {type_name} v{schema} payload does not decode: {exc}",
            seq=seq,
            type_name=type_name,
        ) from exc


_current: dict[str, tuple[int, msgspec.msgpack.Decoder[Any]]] = {}
"""Per type name seen in a record: its current schema and decoder (a registered type's
class never changes), so a record of the current schema skips the registry lookup."""


def _where(seq: int | None) -> str:
    return f"seq {seq}" if seq is not None else "record"


def to_builtins(event: Event) -> dict[str, Any]:
    """The event's fields as JSON-friendly builtins, by name (an array_like event's too),
    without its tag; each set's items in the order of their JSON, the same in every process
    (a set's own order of text hangs on the process's hash seed)."""
    cls = type(event)
    built = value_builtins(event, sets=holds_sets(cls))
    config = cls.__struct_config__
    tag = config.tag_field  # (None where a type switched its tag off)
    if config.array_like:  # [tag, the field values in order, trailing defaults left out]
        return dict(zip(cls.__struct_encode_fields__, built[tag is not None :], strict=False))
    data: dict[str, Any] = built
    if tag is not None:
        del data[tag]
    return data


def value_builtins(value: Any, *, sets: bool = True) -> Any:
    """`value` as JSON-friendly builtins: dict keys as text (as JSON has them), a Raw field
    as what it holds, an Ext as its code and data, and, where it may hold sets, each set's
    items in the order of their JSON."""
    built = msgspec.to_builtins(value, str_keys=True, enc_hook=_foreign)
    return _sets_in_order(value, built) if sets else built


def _foreign(value: Any) -> Any:
    """The builtins msgspec has no form for: a Raw field (msgpack, as events are decoded)
    and a msgpack extension."""
    if isinstance(value, msgspec.Raw):
        return _raw_decoder.decode(value)
    if isinstance(value, msgspec.msgpack.Ext):
        return {"code": value.code, "data": value.data}
    raise TypeError(f"Encoding objects of type {type(value).__name__} is unsupported")


_SETS = (msgspec.inspect.SetType, msgspec.inspect.FrozenSetType)
_AS_IS = (msgspec.inspect.RawType, msgspec.inspect.ExtType)


@functools.cache
def holds_sets(cls: type[Event]) -> bool:
    """Whether an event of `cls` may hold a set or frozenset, at any depth (True where its
    type hints no longer resolve: the safe answer)."""
    return _holds(cls, _SETS)


@functools.cache
def json_as_builtins(cls: type[Event]) -> bool:
    """Whether msgspec's own JSON of an event of `cls` is the JSON of its builtins: no set
    (written in its iteration order), no Raw or Ext field (written as it is, or not at all);
    False where its type hints no longer resolve."""
    return not _holds(cls, _SETS + _AS_IS)


def _holds(cls: type[Event], kinds: tuple[type[msgspec.inspect.Type], ...]) -> bool:
    try:
        info = msgspec.inspect.type_info(cls)
    except Exception:
        return True
    return _holds_kind(info, kinds, set())


def _holds_kind(
    info: msgspec.inspect.Type, kinds: tuple[type[msgspec.inspect.Type], ...], seen: set[type]
) -> bool:
    inspect = msgspec.inspect
    if isinstance(info, kinds):
        return True
    if isinstance(
        info,
        inspect.StructType | inspect.DataclassType | inspect.TypedDictType | inspect.NamedTupleType,
    ):
        if info.cls in seen:  # a recursive type: looked at already
            return False
        seen.add(info.cls)
        return any(_holds_kind(f.type, kinds, seen) for f in info.fields)
    inner = [getattr(info, name, None) for name in ("item_type", "key_type", "value_type", "type")]
    inner += [*getattr(info, "types", ()), *getattr(info, "item_types", ())]
    return any(_holds_kind(t, kinds, seen) for t in inner if isinstance(t, inspect.Type))


def _sets_in_order(value: Any, built: Any) -> Any:
    """`built` (the builtins of `value`) with each set's items sorted by their JSON."""
    if isinstance(value, set | frozenset):
        return sorted(map(_sets_in_order, value, built), key=_json_encode)
    if isinstance(value, list | tuple):
        return list(map(_sets_in_order, value, built))
    if isinstance(value, dict):
        return dict(zip(built, map(_sets_in_order, value.values(), built.values()), strict=True))
    if isinstance(value, msgspec.Struct):
        config, names = value.__struct_config__, value.__struct_fields__
        if config.array_like:  # [tag if tagged, the field values in order]
            start = int(config.tag_field is not None)
            kept = zip(names, built[start:], strict=False)
            return built[:start] + [_sets_in_order(getattr(value, n), b) for n, b in kept]
        encoded = zip(names, value.__struct_encode_fields__, strict=True)
        return built | {
            k: _sets_in_order(getattr(value, n), built[k]) for n, k in encoded if k in built
        }
    if dataclasses.is_dataclass(value):
        fields = [f.name for f in dataclasses.fields(value)]
    else:  # an attrs class (by its public `__attrs_attrs__`), or a value that holds no set
        fields = [a.name for a in getattr(type(value), "__attrs_attrs__", ())]
        if not fields:
            return built
    return built | {n: _sets_in_order(getattr(value, n), built[n]) for n in fields if n in built}


def raw_fields(payload: bytes) -> object:
    """A payload decoded without its schema (for `replay --allow-unknown`)."""
    return _raw_decoder.decode(payload)
