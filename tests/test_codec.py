"""The codec: every event type round-trips; old schemas upcast; unknown/future ones fail."""

from __future__ import annotations

import dataclasses
import enum
import types
from pathlib import Path
from typing import Annotated, Any, ClassVar

import attrs
import msgspec
import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

import eventlog.events
from eventlog import EventLog, codec
from eventlog.errors import FutureSchemaError, InvalidEventError, SchemaError, UnknownEventTypeError
from eventlog.events import Event, event_type, event_types
from eventlog.log import resolve_url
from tests.reliability import drop_append_only
from tests.strategies import events_of
from tests.vocabulary import LogNote

assert eventlog.events  # the full vocabulary is registered by importing it

ALL_TYPES = sorted(event_types().items())


@pytest.mark.parametrize(("name", "cls"), ALL_TYPES, ids=[name for name, _ in ALL_TYPES])
@settings(max_examples=25, deadline=None, derandomize=True)
@given(data=st.data())
def test_every_event_type_round_trips_through_the_codec(
    name: str, cls: type[Event], data: st.DataObject
) -> None:
    event = data.draw(events_of(cls))
    type_name, schema, payload = codec.encode(event)
    assert (type_name, schema) == (name, cls.schema)
    assert codec.decode(type_name, schema, payload) == event


@event_type
class CodecRenamed(Event, frozen=True, kw_only=True):
    """v1 had `txt`; v2 renamed it `text` and added `words`."""

    schema: ClassVar[int] = 2
    text: str
    words: int


@event_type
class CodecBounded(Event, frozen=True, kw_only=True):
    index: Annotated[int, msgspec.Meta(ge=0)]


@codec.register_upcaster("CodecRenamed", 1)
def _v1_to_v2(data: dict[str, object]) -> dict[str, object]:
    text = str(data.pop("txt"))
    return {**data, "text": text, "words": len(text.split())}


def test_older_schema_is_upcast_to_the_current_one() -> None:
    old_payload = msgspec.msgpack.encode({"type": "CodecRenamed", "txt": "two words"})
    assert codec.decode("CodecRenamed", 1, old_payload) == CodecRenamed(text="two words", words=2)


def test_unknown_type_names_seq_and_type() -> None:
    with pytest.raises(UnknownEventTypeError, match="seq 17: unknown event type 'Nope'"):
        codec.decode("Nope", 1, b"\x80", seq=17)


def test_future_schema_names_seq_and_type() -> None:
    payload = codec.encode(LogNote(text="x"))[2]
    with pytest.raises(FutureSchemaError, match=r"seq 3: LogNote has schema v9"):
        codec.decode("LogNote", 9, payload, seq=3)


def test_an_event_violating_its_constraints_is_refused_before_it_is_stored(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log.db") as log:
        with pytest.raises(
            InvalidEventError, match=r"stream 's': item 1: CodecBounded: .*\$\.index"
        ):
            log.append("s", [CodecBounded(index=0), CodecBounded(index=-1)])
        with pytest.raises(InvalidEventError, match="item 0: CodecRenamed: can't serialize ints"):
            log.append("s", [CodecRenamed(text="x", words=2**70)])
        assert log.head() == 0


def test_corrupt_payload_is_a_schema_error_naming_the_seq() -> None:
    with pytest.raises(SchemaError, match="seq 5: LogNote v1 payload does not decode"):
        codec.decode("LogNote", 1, b"\xc1garbage", seq=5)


def test_reading_a_record_of_an_unknown_type_fails_with_its_seq(tmp_path: Path) -> None:
    target = str(tmp_path / "log.db")
    with EventLog.open(target) as log:
        log.append("s", [LogNote(text="a"), LogNote(text="b")])
    engine = sa.create_engine(resolve_url(target))
    with engine.begin() as conn:
        drop_append_only(conn)
        conn.execute(sa.text("UPDATE events SET type = 'FromTheFuture' WHERE seq = 2"))
    engine.dispose()
    with EventLog.open(target) as log:
        with pytest.raises(UnknownEventTypeError) as caught:
            list(log.read())
        assert caught.value.seq == 2 and caught.value.type_name == "FromTheFuture"
        assert [r.type for r in log.read_records()] == ["LogNote", "FromTheFuture"]


def test_only_the_class_registered_for_a_type_name_is_stored(log: EventLog) -> None:
    """A class never registered, or one whose tag names another registered class, would be
    stored as a record its readers cannot decode, or decode as the other class."""

    class CodecUnregistered(Event, frozen=True, kw_only=True):
        x: int

    def impostor() -> type[Event]:
        class LogNote(Event, frozen=True, kw_only=True):  # the tag of tests.vocabulary's
            text: int

        return LogNote

    with pytest.raises(InvalidEventError, match=r"item 0: CodecUnregistered: .*is not registered"):
        log.append("s", [CodecUnregistered(x=1)])
    with pytest.raises(
        InvalidEventError,
        match=r"item 1: LogNote: .*not the class registered for 'LogNote' "
        r"\(tests\.vocabulary\.LogNote\)",
    ):
        log.append("s", [LogNote(text="ok"), impostor()(text=5)])
    assert log.head() == 0
    assert log.append("s", [LogNote(text="ok")]).seqs == [1]  # the registered one still is


@event_type
class CodecSchemaBool(Event, frozen=True, kw_only=True):
    schema: ClassVar[int] = True
    text: str


@event_type
class CodecSchemaText(Event, frozen=True, kw_only=True):
    schema = "2"  # type: ignore[assignment]
    text: str


@event_type
class CodecSchemaHuge(Event, frozen=True, kw_only=True):
    schema: ClassVar[int] = 2**63
    text: str


@event_type
class CodecSchemaZero(Event, frozen=True, kw_only=True):
    schema: ClassVar[int] = 0
    text: str


@pytest.mark.parametrize(
    "cls",
    [CodecSchemaBool, CodecSchemaText, CodecSchemaHuge, CodecSchemaZero],
    ids=["bool", "text", "2**63", "zero"],
)
def test_a_schema_no_record_can_hold_as_written_is_refused_naming_the_type(
    log: EventLog, cls: type[CodecSchemaBool]
) -> None:
    """The schema column is a 32-bit INTEGER a reader compares with `==`: anything but a
    plain int in 1..2**31-1 is stored as another value than the one chained, or not at all."""
    with pytest.raises(
        InvalidEventError,
        match=rf"stream 's': item 0: {cls.__name__}: schema must be an int in 1\.\.2147483647",
    ):
        log.append("s", [cls(text="x")])
    assert log.head() == 0


# -- an event's builtins (what every audit command prints or exports) ---------------------


class _Shade(enum.Enum):
    DARK = "dark"
    LIGHT = "light"


@dataclasses.dataclass(frozen=True)
class _Box:
    tags: frozenset[str]


@attrs.frozen
class _Crate:
    tags: frozenset[str]


class _Packed(msgspec.Struct, frozen=True, array_like=True, tag=True):
    tags: frozenset[str]


class _Sets(Event, frozen=True, kw_only=True):
    tags: frozenset[str]
    shades: frozenset[_Shade] = frozenset()
    in_list: list[frozenset[str]] = msgspec.field(default_factory=list)
    in_dict: dict[str, frozenset[str]] = msgspec.field(default_factory=dict)
    box: _Box | None = None
    crate: _Crate | None = None
    packed: _Packed | None = None


LETTERS = frozenset("zyxwvutsrqponm")
IN_ORDER = sorted(LETTERS)


def test_a_sets_items_are_in_the_order_of_their_json_at_any_depth() -> None:
    """The builtins of a set keep its iteration order, which for text hangs on each
    process's hash seed: two runs of one command, or its workers, printed one set two ways."""
    event = _Sets(
        tags=LETTERS,
        shades=frozenset(_Shade),
        in_list=[LETTERS],
        in_dict={"k": LETTERS},
        box=_Box(LETTERS),
        crate=_Crate(LETTERS),
        packed=_Packed(LETTERS),
    )
    assert codec.to_builtins(event) == {
        "tags": IN_ORDER,
        "shades": ["dark", "light"],
        "in_list": [IN_ORDER],
        "in_dict": {"k": IN_ORDER},
        "box": {"tags": IN_ORDER},
        "crate": {"tags": IN_ORDER},
        "packed": ["_Packed", IN_ORDER],
    }


def test_set_items_are_ordered_by_their_json_encoding() -> None:
    """By the bytes of their JSON (UTF-8): text that is not ASCII sorts after ASCII."""
    assert codec.to_builtins(_Sets(tags=frozenset({"\u00e9", "z", "a"})))["tags"] == [
        "a",
        "z",
        "\u00e9",
    ]


class _Kind(Event, frozen=True, kw_only=True, tag_field="kind"):
    type: str


class _PackedEvent(Event, frozen=True, kw_only=True, array_like=True):
    a: int
    b: str = "x"


class _Untagged(Event, frozen=True, kw_only=True, array_like=True, tag=False):
    a: int


def test_an_events_builtins_are_its_fields_by_name_without_its_tag() -> None:
    """Its own tag field, not a field named "type"; an array_like event's values named."""
    assert codec.to_builtins(_Kind(type="t")) == {"type": "t"}
    assert codec.to_builtins(_PackedEvent(a=1)) == {"a": 1, "b": "x"}
    assert codec.to_builtins(_Untagged(a=1)) == {"a": 1}


def test_a_type_whose_hints_no_longer_resolve_is_taken_to_hold_sets() -> None:
    """The safe answer: its values are walked (by what they hold, not their hints)."""
    module = types.ModuleType("vanishing_events")
    exec(
        "from __future__ import annotations\n"
        "from eventlog.events import Event\n"
        "class Later:\n"
        "    pass\n"
        "class Gone(Event, frozen=True, kw_only=True):\n"
        "    tags: frozenset[str]\n"
        "    later: Later | None = None\n",
        module.__dict__,
    )
    cls = module.Gone
    event = cls(tags=LETTERS)
    del module.Later
    assert codec.holds_sets(cls)
    assert codec.to_builtins(event) == {"tags": IN_ORDER, "later": None}


def test_a_type_tagged_by_text_that_is_not_ascii_decodes_in_a_fresh_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """msgspec (0.23) decoded such a tag only once the tag had been encoded in the process:
    the writer had, a fresh reader had not and refused every record (exit 3)."""
    from eventlog import events

    tag = "".join(["\u00e9", "v"])  # a string no encoding has touched yet
    accent: Any = msgspec.defstruct("Accent", [("x", int)], bases=(Event,), tag=tag, kw_only=True)
    monkeypatch.setitem(events._EVENT_TYPES, tag, accent)
    event_type(accent)
    payload = msgspec.msgpack.encode({"type": "\u00e9v", "x": 1})  # as another process wrote
    assert codec.decode(tag, 1, payload) == accent(x=1)


class _Foreign(Event, frozen=True, kw_only=True):
    raw: msgspec.Raw
    ext: msgspec.msgpack.Ext


def test_raw_and_ext_fields_have_builtins_and_no_json_of_their_own() -> None:
    """msgspec has no builtins for them (every read command was exit 70): a Raw field is
    what it holds, an Ext its code and data; msgspec's JSON of such an event is not its
    builtins' (a Raw written as it is, an Ext not at all), so readers take the long way."""
    payload = msgspec.msgpack.encode(
        {"type": "_Foreign", "raw": {"k": [1, 2]}, "ext": msgspec.msgpack.Ext(5, b"ab")}
    )
    event = msgspec.msgpack.decode(payload, type=_Foreign)
    assert codec.to_builtins(event) == {"raw": {"k": [1, 2]}, "ext": {"code": 5, "data": "YWI="}}
    assert not codec.json_as_builtins(_Foreign)
    assert codec.json_as_builtins(LogNote)
    with pytest.raises(TypeError):  # any other value msgspec has no builtins for stays refused
        codec.value_builtins([object()])
