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
from eventlog.cli.views import Mark, raw_data
from eventlog.errors import SchemaError
from eventlog.events import Event, event_types
from eventlog.records import Record

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


def _cell(kind: ColumnKind, value: Any) -> Any:
    if value is None:
        return None
    if kind == "json":
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return value


class Table(Protocol):
    """One output table; `write` takes rows as dicts of column -> value."""

    def write(self, rows: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


class _JsonLines:
    def __init__(self, path: Path, columns: list[tuple[str, ColumnKind, bool]]) -> None:
        self.file: IO[str] = path.open("w", encoding="utf-8")
        self.encoder = msgspec.json.Encoder()

    def write(self, rows: list[dict[str, Any]]) -> None:
        self.file.write("".join(self.encoder.encode(r).decode() + "\n" for r in rows))

    def close(self) -> None:
        self.file.close()


class _Csv:
    def __init__(self, path: Path, columns: list[tuple[str, ColumnKind, bool]]) -> None:
        self.file: IO[str] = path.open("w", encoding="utf-8", newline="")
        self.writer = csv.DictWriter(self.file, [name for name, _, _ in columns])
        self.writer.writeheader()

    def write(self, rows: list[dict[str, Any]]) -> None:
        self.writer.writerows(rows)

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

    def write(self, rows: list[dict[str, Any]]) -> None:
        self.writer.write_table(self.pa.Table.from_pylist(rows, schema=self.schema))

    def close(self) -> None:
        self.writer.close()


FORMATS: dict[str, tuple[str, Callable[[Path, list[tuple[str, ColumnKind, bool]]], Table]]] = {
    "parquet": (".parquet", _Parquet),
    "jsonl": (".jsonl", _JsonLines),
    "csv": (".csv", _Csv),
}


class _Sink:
    """A table and its pending rows, flushed a batch at a time."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.rows: list[dict[str, Any]] = []
        self.count = 0

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if len(self.rows) >= BATCH:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.table.write(self.rows)
            self.count += len(self.rows)
            self.rows = []


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
        record_columns = [(n, k, False) for n, k in ENVELOPE] + [("data", "json", True)]
        if mark_column is not None:
            record_columns.append((mark_column, "int", True))
        time_as_text = fmt != "parquet"
        sinks: dict[str, _Sink] = {}
        records = _Sink(make_table(output / f"records{suffix}", record_columns))
        known = event_types()
        head = log.head()
        try:
            with seq_progress("export", 1, head) as advance:
                for record in log.read_records():
                    advance(record.seq)
                    _export_one(
                        record,
                        records,
                        sinks,
                        known,
                        output,
                        suffix,
                        make_table,
                        mark_of,
                        mark_column,
                        time_as_text,
                    )
        finally:
            for sink in [records, *sinks.values()]:
                sink.flush()
                sink.table.close()
    console = stdout_console()
    console.print(f"{records.count} records -> {output / ('records' + suffix)}")
    for name, sink in sorted(sinks.items()):
        console.print(f"{sink.count} {name} -> {output / (name + suffix)}")


def _time(ns: int, as_text: bool) -> Any:
    return format_ns(ns) if as_text else ns


def _export_one(
    record: Record,
    records: _Sink,
    sinks: dict[str, _Sink],
    known: dict[str, type[Event]],
    output: Path,
    suffix: str,
    make_table: Callable[[Path, list[tuple[str, ColumnKind, bool]]], Table],
    mark_of: Callable[[int], Mark | None] | None,
    mark_column: str | None,
    time_as_text: bool,
) -> None:
    envelope: dict[str, Any] = {
        "seq": record.seq,
        "stream": record.stream,
        "version": record.version,
        "event_id": str(record.event_id),
        "type": record.type,
        "schema": record.schema,
        "recorded_at": _time(record.recorded_at, time_as_text),
    }
    try:
        event = codec.decode(record.type, record.schema, record.payload, seq=record.seq)
        data: Any = codec.to_builtins(event)
    except SchemaError:
        event, data = None, raw_data(record.payload)
    row = dict(envelope)
    row["data"] = _cell("json", data)
    if mark_column is not None:
        mark = mark_of(record.seq) if mark_of is not None else None
        row[mark_column] = mark.fields.get(mark_column) if mark is not None else None
    records.add(row)
    if event is None or record.type not in known:
        return
    sink = sinks.get(record.type)
    columns = event_columns(known[record.type])
    if sink is None:
        envelope_columns = [(n, k, False) for n, k in ENVELOPE if n != "type"]
        typed = [(column, kind, nullable) for _, column, kind, nullable in columns]
        sink = sinks[record.type] = _Sink(
            make_table(output / f"{record.type}{suffix}", envelope_columns + typed)
        )
    del envelope["type"]
    envelope.update({column: _cell(kind, data.get(name)) for name, column, kind, _ in columns})
    sink.add(envelope)
