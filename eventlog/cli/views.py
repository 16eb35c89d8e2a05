"""Records as people and scripts see them: the record view, its JSON form and its table."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from rich.console import Console
from rich.text import Text

from eventlog import codec
from eventlog.cli.output import json_line, printable
from eventlog.cli.times import format_ns, short_time
from eventlog.errors import SchemaError
from eventlog.events import Event
from eventlog.records import Record, RecordedEvent
from eventlog.store.base import RecordRow, record_of_row


class Mark(msgspec.Struct, frozen=True):
    """What a domain says about a record that no longer counts (e.g. rolled back by a restore).

    `text` is the table's mark column; `fields` are merged into the record's JSON object.
    """

    text: str
    fields: dict[str, Any]


class RecordView(msgspec.Struct, frozen=True):
    """The CLI's one record envelope: fields as JSON-friendly builtins (or raw when
    undecodable), and the mark a domain put on it."""

    seq: int
    stream: str
    version: int
    event_id: uuid.UUID
    type: str
    schema: int
    recorded_at: int
    data: Any
    unknown: bool = False
    mark: Mark | None = None


def view_record(record: Record, *, allow_unknown: bool, mark: Mark | None = None) -> RecordView:
    """Decode a record; with `allow_unknown`, an unreadable one is shown raw instead of failing."""
    try:
        event = codec.decode(record.type, record.schema, record.payload, seq=record.seq)
        data: Any = codec.to_builtins(event)
        unknown = False
    except SchemaError:
        if not allow_unknown:
            raise
        data, unknown = raw_data(record.payload, record.type), True
    return _view(record, data, unknown, mark)


def view_decoded(record: RecordedEvent, mark: Mark | None = None) -> RecordView:
    """A record the log already decoded (from `read` or `subscribe`)."""
    return _view(record, codec.to_builtins(record.event), False, mark)


def _view(
    record: Record | RecordedEvent, data: Any, unknown: bool, mark: Mark | None
) -> RecordView:
    return RecordView(
        seq=record.seq,
        stream=record.stream,
        version=record.version,
        event_id=record.event_id,
        type=record.type,
        schema=record.schema,
        recorded_at=record.recorded_at,
        data=data,
        unknown=unknown,
        mark=mark,
    )


def raw_data(payload: bytes, type_name: str) -> Any:
    """A payload decoded without a schema, as JSON-friendly builtins (None if not msgpack),
    less its tag. With no class the tag field is unknown, but msgspec writes it first: the
    first entry is the tag when it is named `type` or holds the record's type name."""
    try:
        data = codec.raw_fields(payload)
        if isinstance(data, dict) and data:
            key, value = next(iter(data.items()))
            if key == "type" or value == type_name:
                del data[key]
        return codec.value_builtins(data, sets=False)
    except (msgspec.DecodeError, TypeError, ValueError):
        return None


def json_object(view: RecordView) -> dict[str, Any]:
    """The `--json` form: seq, stream, version, event_id, type, recorded_at, data.

    recorded_at is ISO-8601 UTC with nanoseconds. A record shown raw also has "unknown": true
    and its "schema" version; a marked one, the mark's fields (e.g. "rolled_back": true).
    """
    obj: dict[str, Any] = {
        "seq": view.seq,
        "stream": view.stream,
        "version": view.version,
        "event_id": view.event_id,  # msgspec writes a UUID as its canonical text
        "type": view.type,
        "recorded_at": format_ns(view.recorded_at),
        "data": view.data,
    }
    if view.unknown:
        obj["unknown"] = True
        obj["schema"] = view.schema
    if view.mark is not None:
        obj |= view.mark.fields
    return obj


class JsonHead(msgspec.Struct):
    """The `json_object` keys before "data", for `write_json_line`."""

    seq: int
    stream: str
    version: int
    event_id: str
    type: str
    recorded_at: str


LINE_ENCODER = msgspec.json.Encoder()
_tag_prefixes: dict[type[Event], bytes] = {}


def _tag_prefix(cls: type[Event]) -> bytes:
    """How msgspec's JSON of an event of `cls` starts: `{"type":"Name"` (empty for a tag
    field other than "type", or a type whose JSON is not its builtins' (a set, a Raw or Ext
    field): those take the long way)."""
    config = cls.__struct_config__
    fast = config.tag_field == "type" and codec.json_as_builtins(cls)
    prefix = b'{"type":' + LINE_ENCODER.encode(config.tag) if fast else b""
    _tag_prefixes[cls] = prefix
    return prefix


def write_json_line(out: bytearray, head: JsonHead, event: Event) -> bool:
    """Append `json_line(json_object(view))` of an unmarked record that decoded to `event`
    (and a newline) to `out`, from one encoding of `head` and one of `event`, without the
    builtins, view and dict `json_object` goes through (two thirds of `replay --json`).

    The data is the event's own JSON less its type tag, which msgspec writes first, as
    `codec.to_builtins` drops it. False, with `out` as it was, when the event's JSON does not
    start with that tag or cannot be written: the caller takes the long way.
    """
    cls = type(event)
    prefix = _tag_prefixes.get(cls)
    if prefix is None:
        prefix = _tag_prefix(cls)
    if not prefix:  # before encoding: msgspec may not encode it at all (an Ext field)
        return False
    start = len(out)
    LINE_ENCODER.encode_into(head, out, -1)
    out[-1:] = b',"data":'  # the head's closing brace
    data = len(out)
    try:
        LINE_ENCODER.encode_into(event, out, -1)
    except TypeError:  # a field typed Any holding what JSON cannot write (an Ext)
        del out[start:]
        return False
    after = data + len(prefix)
    if not out.startswith(prefix, data):
        del out[start:]
        return False
    if out[after : after + 1] == b",":
        del out[data + 1 : after + 1]  # `{"type":"Name",` -> `{`
    elif len(out) == after + 1:  # `{"type":"Name"}`: no field
        del out[data + 1 : after]
    else:
        del out[start:]
        return False
    out += b"}\n"
    return True


def uuid_text(raw: bytes) -> str:
    """16 bytes as canonical UUID text (what msgspec writes for a uuid.UUID)."""
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def row_json(row: RecordRow, *, allow_unknown: bool, mark: Mark | None) -> bytes:
    """A stored row's `--json` object by the long way: `view_record`, then `json_object`."""
    record = record_of_row(row)
    view = view_record(record, allow_unknown=allow_unknown, mark=mark)
    return LINE_ENCODER.encode(json_object(view))


def summary(data: Any) -> str:
    """The event's fields as `key=value` pairs on one line (values as compact JSON)."""
    if not isinstance(data, dict):
        return "" if data is None else json_line(data)
    parts = []
    for key, value in data.items():
        shown = value if isinstance(value, str) and value.isprintable() else json_line(value)
        parts.append(f"{key}={shown}")
    return " ".join(parts)


class RecordLines:
    """Records as an aligned table, printed a chunk at a time so memory stays bounded.

    On a terminal the lines are styled with rich and cut to the screen's width; into a pipe
    or file they are plain text and never cut (rich costs ~80 us a line, too slow for 10^6).
    Column widths come from the first chunk and only grow, so chunks stay aligned.
    """

    STREAM_CAP = 40
    TYPE_CAP = 28

    def __init__(
        self,
        console: Console,
        seq_width: int,
        *,
        header: bool = True,
        chunk: int = 200,
        mark_title: str | None = None,
    ) -> None:
        self.console = console
        self.mark_title = mark_title
        """With a title, a column of marks after the time (blank for unmarked records)."""
        self.mark_width = 0
        self.styled = console.is_terminal
        self.seq_width = max(seq_width, 3)
        self.header = header
        self.chunk = chunk
        self.rows: list[RecordView] = []
        self.stream_width = 0
        self.type_width = 0
        self.printed = 0

    def add(self, view: RecordView) -> None:
        self.rows.append(view)
        if len(self.rows) >= self.chunk:
            self.flush()

    def _type_label(self, view: RecordView) -> str:
        return f"{view.type} v{view.schema}?" if view.unknown else view.type

    def flush(self) -> None:
        if not self.rows:
            return
        stream_width = max(len(v.stream) for v in self.rows)
        type_width = max(len(self._type_label(v)) for v in self.rows)
        self.stream_width = max(self.stream_width, min(stream_width, self.STREAM_CAP), 6)
        self.type_width = max(self.type_width, min(type_width, self.TYPE_CAP), 4)
        if self.mark_title is not None:
            marks = [len(v.mark.text) for v in self.rows if v.mark is not None]
            self.mark_width = max(self.mark_width, len(self.mark_title), *marks)
        if self.styled:
            self._print_styled()
        else:
            self._print_plain()
        self.printed += len(self.rows)
        self.rows.clear()

    def _cells(self, view: RecordView) -> tuple[str, str, str, str, str, str]:
        stream, type_label = printable(view.stream), printable(self._type_label(view))
        if self.styled:
            stream = _ellipsis(stream, self.stream_width)
            type_label = _ellipsis(type_label, self.type_width)
        moment = short_time(view.recorded_at)
        if self.mark_title is not None:
            mark = view.mark.text if view.mark is not None else ""
            moment = f"{moment}  {mark:<{self.mark_width}}"
        return (
            f"{view.seq:>{self.seq_width}}",
            moment,
            f"{stream:<{self.stream_width}}",
            f"{view.version:>4}",
            f"{type_label:<{self.type_width}}",
            summary(view.data),
        )

    def _header_cells(self) -> tuple[str, ...]:
        moment = f"{'time (UTC)':<23}"
        if self.mark_title is not None:
            moment = f"{moment}  {self.mark_title:<{self.mark_width}}"
        return (
            f"{'seq':>{self.seq_width}}",
            moment,
            f"{'stream':<{self.stream_width}}",
            f"{'ver':>4}",
            f"{'type':<{self.type_width}}",
            "fields",
        )

    def _print_plain(self) -> None:
        lines = []
        if self.header and self.printed == 0:
            lines.append("  ".join(self._header_cells()))
        lines.extend("  ".join(self._cells(view)).rstrip() for view in self.rows)
        out = self.console.file
        out.write("\n".join(lines) + "\n")
        out.flush()

    def _print_styled(self) -> None:
        lines = []
        if self.header and self.printed == 0:
            lines.append(Text("  ".join(self._header_cells()), style="bold"))
        for view in self.rows:
            seq, moment, stream, version, type_label, fields = self._cells(view)
            lines.append(
                Text.assemble(
                    (seq, "bold"),
                    "  ",
                    (moment, "dim"),
                    "  ",
                    (stream, "green"),
                    "  ",
                    version,
                    "  ",
                    (type_label, "red" if view.unknown else "cyan"),
                    "  ",
                    (fields, "dim" if view.unknown else ""),
                    style="dim" if view.mark is not None else "",
                )
            )
        self.console.print(Text("\n").join(lines), no_wrap=True, overflow="ellipsis", crop=True)


def _ellipsis(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
