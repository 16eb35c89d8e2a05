"""The codec: every event type round-trips; old schemas upcast; unknown/future ones fail."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar

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
