"""`eventlog export`: the log as tables for pandas, polars or DuckDB.

One table per event type (the envelope, then one typed column per field of the event) and a
flat `records` table (the envelope and the fields as JSON), in Parquet, JSON lines or CSV.
Column types come from the event classes (msgspec's type info): integers, floats, strings
and booleans stay typed (nullable where the field is optional); nested values (structs,
lists, maps) are JSON strings. Written a batch at a time: memory stays flat in log length.
A domain adds marks (e.g. rolled back by a restore) as a `records` column via `make_export`.
"""

from __future__ import annotations

import copy
import csv
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Protocol

import click
import msgspec

from eventlog import codec
from eventlog.cli.exits import CliUsageError
from eventlog.cli.output import seq_progress, stdout_console
from eventlog.cli.replay import Marker
from eventlog.cli.targets import open_log
from eventlog.cli.times import format_ns
from eventlog.cli.views import raw_data
from eventlog.errors import SchemaError
from eventlog.events import Event, event_types
from eventlog.store.base import RecordRow

ColumnKind = str  # "int", "float", "str", "bool", "json", "time"

ENVELOPE: list[tuple[str, ColumnKind]] = [
    ("seq", "int"),
    ("stream", "str"),
    ("version", "int"),
    ("event_id", "str"),
    ("type", "str"),
    ("schema", "int"),
    ("recorded_at", "time"),
]
BATCH = 10_000


def _kind(info: msgspec.inspect.Type) -> tuple[ColumnKind, bool]:
    """The column kind of a field's type, and whether it may be null."""
    nullable = False
    if isinstance(info, msgspec.inspect.UnionType):
        others = [t for t in info.types if not isinstance(t, msgspec.inspect.NoneType)]
        nullable = len(others) < len(info.types)
        if len(others) != 1:
            return "json", nullable
        info = others[0]
    if isinstance(info, msgspec.inspect.BoolType):
        return "bool", nullable
    if isinstance(info, msgspec.inspect.IntType):
        return "int", nullable
    if isinstance(info, msgspec.inspect.FloatType):
        return "float", nullable
    if isinstance(
        info, msgspec.inspect.StrType | msgspec.inspect.LiteralType | msgspec.inspect.EnumType
    ):
        return "str", nullable
    return "json", nullable


@functools.cache
def event_columns(cls: type[Event]) -> list[tuple[str, str, ColumnKind, bool]]:
    """(field, column, kind, nullable) of each field of an event class, in declaration order;
    a field named like an envelope column gets the column `field_<name>`."""
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    taken = {name for name, _ in ENVELOPE}
    return [
        (f.name, f"field_{f.name}" if f.name in taken else f.name, *_kind(f.type))
        for f in info.fields
    ]


_json = msgspec.json.Encoder(order="sorted")


def json_text(value: Any) -> str:
    """Builtins as compact JSON with sorted keys (msgspec; json.dumps' ASCII escapes are
    kept for text that is not ASCII, so such a value reads the same as before)."""
    found = _json.encode(value)
    if found.isascii():
        return found.decode()
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _cell(kind: ColumnKind, value: Any) -> Any:
    if value is None:
        return None
    if kind == "json":
        return json_text(value)
    return value


def uuid_text(raw: bytes) -> str:
    """16 id bytes as the canonical UUID text (what str(uuid.UUID(bytes=raw)) gives)."""
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


Columns = dict[str, list[Any]]
"""A batch of rows as one list per column (every list the same length), in table order."""


class Table(Protocol):
    """One output table; `write` takes a batch of rows as columns."""

    def write(self, columns: Columns) -> None: ...

    def close(self) -> None: ...


class _JsonLines:
    def __init__(self, path: Path, columns: list[tuple[str, ColumnKind, bool]]) -> None:
        self.file: IO[str] = path.open("w", encoding="utf-8")
        self.encoder = msgspec.json.Encoder()

    def write(self, columns: Columns) -> None:
        names = list(columns)
        rows = [
            dict(zip(names, values, strict=True)) for values in zip(*columns.values(), strict=True)
        ]
        self.file.write("".join(self.encoder.encode(r).decode() + "\n" for r in rows))

    def close(self) -> None:
        self.file.close()


class _Csv:
    def __init__(self, path: Path, columns: list[tuple[str, ColumnKind, bool]]) -> None:
        self.file: IO[str] = path.open("w", encoding="utf-8", newline="")
        self.writer = csv.writer(self.file)
        self.writer.writerow([name for name, _, _ in columns])

    def write(self, columns: Columns) -> None:
        self.writer.writerows(zip(*columns.values(), strict=True))

    def close(self) -> None:
        self.file.close()


class _Parquet:
    def __init__(self, path: Path, columns: list[tuple[str, ColumnKind, bool]]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        kinds = {
            "int": pa.int64(),
            "float": pa.float64(),
            "str": pa.string(),
            "bool": pa.bool_(),
            "json": pa.string(),
            "time": pa.timestamp("ns", tz="UTC"),
        }
        self.pa = pa
        self.schema = pa.schema(
            [pa.field(name, kinds[kind], nullable=nullable) for name, kind, nullable in columns]
        )
        self.writer = pq.ParquetWriter(str(path), self.schema)

    def write(self, columns: Columns) -> None:
        arrays = [
            self.pa.array(columns[f.name], type=f.type, from_pandas=False) for f in self.schema
        ]
        self.writer.write_table(self.pa.Table.from_arrays(arrays, schema=self.schema))

    def close(self) -> None:
        self.writer.close()


FORMATS: dict[str, tuple[str, Callable[[Path, list[tuple[str, ColumnKind, bool]]], Table]]] = {
    "parquet": (".parquet", _Parquet),
    "jsonl": (".jsonl", _JsonLines),
    "csv": (".csv", _Csv),
}

PENDING = 50_000
"""Rows held over every table before all are written: memory stays bounded whatever the
number of event types (each table also writes when it alone holds BATCH rows)."""


class _Sink:
    """A table and its pending rows (the record rows as read, plus per row what the table
    adds: the `data` text and mark of `records`, or the event's fields of a typed table),
    turned into columns a batch at a time."""

    def __init__(self, table: Table, make: Callable[[list[RecordRow], list[Any]], Columns]) -> None:
        self.table = table
        self.make = make
        self.rows: list[RecordRow] = []
        self.extra: list[Any] = []
        self.count = 0

    def flush(self) -> None:
        if self.rows:
            self.table.write(self.make(self.rows, self.extra))
            self.count += len(self.rows)
            self.rows = []
            self.extra = []


def _envelope(rows: list[RecordRow], time_as_text: bool, with_type: bool) -> Columns:
    seqs, streams, versions, ids, types, schemas, ats, _, _ = zip(*rows, strict=True)
    columns: Columns = {
        "seq": list(seqs),
        "stream": list(streams),
        "version": list(versions),
        "event_id": [uuid_text(raw) for raw in ids],
    }
    if with_type:
        columns["type"] = list(types)
    columns["schema"] = list(schemas)
    columns["recorded_at"] = [format_ns(at) for at in ats] if time_as_text else list(ats)
    return columns


class ExportCommand(click.Command):
    """`export` and the marker it was built with."""

    marker: Marker | None = None


def make_export(marker: Marker | None = None) -> ExportCommand:
    """`export` with a domain's marks as a `records` column (the core command has none)."""
    command = copy.copy(export)
    command.marker = marker
    return command


@click.command(cls=ExportCommand)
@click.argument("target")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(sorted(FORMATS)),
    default="parquet",
    show_default=True,
    help="parquet needs pyarrow (the `audit` extra).",
)
@click.option(
    "-o",
    "--output",
    "output",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder to write the tables into (created; existing tables are replaced).",
)
def export(target: str, fmt: str, output: Path) -> None:
    """Write TARGET's records as tables into a folder: `records` (every record: envelope,
    fields as JSON, and the domain's marks such as rolled_back_by) and one table per event
    type (envelope plus one typed column per field), ready for pandas, polars or DuckDB.

    \b
    recorded_at is a UTC timestamp with nanoseconds (ISO-8601 text in jsonl and csv).
    Records of unknown types are only in `records` (their raw fields as JSON).
    """
    command = click.get_current_context().command
    marker = command.marker if isinstance(command, ExportCommand) else None
    suffix, make_table = FORMATS[fmt]
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise CliUsageError(
                "--format parquet needs pyarrow, which is not installed",
                hint="pip install 'eventlog[audit]', or use --format jsonl or csv",
            ) from None
    if output.exists() and not output.is_dir():
        raise CliUsageError(f"{output}: exists and is not a folder")
    with open_log(target) as log:
        output.mkdir(parents=True, exist_ok=True)
        mark_of = marker.marks(log) if marker is not None else None
        mark_column = marker.column if marker is not None else None
        time_as_text = fmt != "parquet"
        record_columns = [(n, k, False) for n, k in ENVELOPE] + [("data", "json", True)]
        if mark_column is not None:
            record_columns.append((mark_column, "int", True))

        def records_batch(rows: list[RecordRow], data: list[Any]) -> Columns:
            columns = _envelope(rows, time_as_text, with_type=True)
            columns["data"] = data
            if mark_column is not None:
                marks = [mark_of(row[0]) if mark_of is not None else None for row in rows]
                columns[mark_column] = [m.fields.get(mark_column) if m else None for m in marks]
            return columns

        records = _Sink(make_table(output / f"records{suffix}", record_columns), records_batch)
        sinks: dict[str, _Sink] = {}
        known = event_types()
        head = log.head()
        pending = 0
        try:
            with seq_progress("export", 1, head) as advance:
                for row in log.read_rows(1, head):
                    seq, type_name = row[0], row[4]
                    advance(seq)
                    text: str | None
                    try:
                        event = codec.decode(type_name, row[5], row[7], seq=seq)
                        text = json_text(codec.to_builtins(event))
                    except SchemaError:
                        event, raw = None, raw_data(row[7])
                        text = None if raw is None else json_text(raw)
                    records.rows.append(row)
                    records.extra.append(text)
                    if len(records.rows) >= BATCH:
                        records.flush()
                    if event is None or type_name not in known:
                        continue
                    sink = sinks.get(type_name)
                    if sink is None:
                        sink = sinks[type_name] = _typed_sink(
                            known[type_name], output, type_name + suffix, make_table, time_as_text
                        )
                    sink.rows.append(row)
                    sink.extra.append(event)
                    pending += 1
                    if len(sink.rows) >= BATCH:
                        pending -= len(sink.rows)
                        sink.flush()
                    elif pending >= PENDING:  # rare types wait for this: few, large row groups
                        for other in sinks.values():
                            other.flush()
                        pending = 0
        finally:
            for sink in [records, *sinks.values()]:
                sink.flush()
                sink.table.close()
    console = stdout_console()
    console.print(f"{records.count} records -> {output / ('records' + suffix)}")
    for name, sink in sorted(sinks.items()):
        console.print(f"{sink.count} {name} -> {output / (name + suffix)}")


def _json_value(value: Any) -> str:
    """A field's value as `_cell("json", to_builtins(value))` writes it."""
    found = _json.encode(value)
    if found.isascii():
        return found.decode()
    return json_text(msgspec.to_builtins(value))


@functools.cache
def _enum_fields(cls: type[Event]) -> frozenset[str]:
    """Fields whose value is an Enum member (written as its value, as to_builtins does)."""
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    found = set()
    for f in info.fields:
        kinds = f.type.types if isinstance(f.type, msgspec.inspect.UnionType) else (f.type,)
        if any(isinstance(k, msgspec.inspect.EnumType) for k in kinds):
            found.add(f.name)
    return frozenset(found)


def _typed_sink(
    cls: type[Event],
    output: Path,
    name: str,
    make_table: Callable[[Path, list[tuple[str, ColumnKind, bool]]], Table],
    time_as_text: bool,
) -> _Sink:
    """The table of one event type: the envelope (no type) and a column per field."""
    fields = event_columns(cls)
    envelope = [(n, k, False) for n, k in ENVELOPE if n != "type"]
    typed = [(column, kind, nullable) for _, column, kind, nullable in fields]

    enums = _enum_fields(cls)

    def batch(rows: list[RecordRow], events: list[Event]) -> Columns:
        columns = _envelope(rows, time_as_text, with_type=False)
        by_field = zip(*map(msgspec.structs.astuple, events), strict=True)
        for (field, column, kind, _), values in zip(fields, by_field, strict=True):
            if kind == "json":
                columns[column] = [None if v is None else _json_value(v) for v in values]
            elif field in enums:
                columns[column] = [None if v is None else v.value for v in values]
            else:
                columns[column] = list(values)
        return columns

    return _Sink(make_table(output / name, envelope + typed), batch)
