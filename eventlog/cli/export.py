"""`eventlog export`: the log as tables for pandas, polars or DuckDB.

One table per event type (the envelope, then one typed column per field of the event) and a
flat `records` table (the envelope and the fields as JSON), in Parquet, JSON lines or CSV.
Column types come from the event classes (msgspec's type info): integers, floats, strings
and booleans stay typed (nullable where the field is optional); nested values (structs,
lists, maps) are JSON strings. Written a batch at a time: memory stays flat in log length.
A domain adds marks (e.g. rolled back by a restore) as a `records` column via `make_export`.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import fcntl
import functools
import hashlib
import io
import itertools
import operator
import os
import re
import secrets
import shutil
import stat
import tempfile
import time
import typing
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple, Protocol, cast

import click
import msgspec

from eventlog import codec, collector
from eventlog.cli.exits import CliUsageError
from eventlog.cli.output import seq_progress, stdout_console
from eventlog.cli.replay import Marker
from eventlog.cli.targets import (
    OutputPath,
    log_file_at,
    open_log,
    refuse_writing_onto_log,
    run_target,
    writing_output,
)
from eventlog.cli.times import format_ns
from eventlog.cli.views import Mark, raw_data
from eventlog.cli.workers import (
    Workers,
    jobs_for,
    jobs_option,
    portable_vocabulary,
    seq_chunks,
)
from eventlog.errors import EventLogError, SchemaError
from eventlog.events import Event, event_types
from eventlog.log import EventLog
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


_TEXT_BUILTINS = (
    msgspec.inspect.DateTimeType,
    msgspec.inspect.DateType,
    msgspec.inspect.TimeType,
    msgspec.inspect.TimeDeltaType,
    msgspec.inspect.UUIDType,
    msgspec.inspect.DecimalType,
    msgspec.inspect.BytesType,
    msgspec.inspect.ByteArrayType,
    msgspec.inspect.MemoryViewType,
)
"""Types whose builtins are text (ISO 8601, canonical UUID, the Decimal as written, base64):
a text column a reader can cast, not that text quoted as JSON."""


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
    if isinstance(info, (msgspec.inspect.StrType, *_TEXT_BUILTINS)):
        return "str", nullable
    if isinstance(info, msgspec.inspect.LiteralType | msgspec.inspect.EnumType):
        values = info.values if isinstance(info, msgspec.inspect.LiteralType) else info.cls
        kinds = {type(getattr(v, "value", v)) for v in values}  # an IntEnum's values are ints
        if kinds <= {str}:
            return "str", nullable
        if kinds <= {int}:
            return "int", nullable
    return "json", nullable


@functools.cache
def event_columns(cls: type[Event]) -> list[tuple[str, str, ColumnKind, bool]]:
    """(field, column, kind, nullable) of each field of an event class, in declaration order;
    a field named like an envelope column gets the column `field_<name>` (more `field_`
    while another field has that name). A type's table has no `type` column."""
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    envelope = {name for name, _ in ENVELOPE} - {"type"}
    taken = envelope | {f.name for f in info.fields}
    unset = _may_be_unset(cls)
    columns = []
    for f in info.fields:
        kind, nullable = _kind(f.type)  # (type_info leaves UnsetType out of a union)
        column = f.name
        if column in envelope:
            column = f"field_{column}"
            while column in taken:
                column = f"field_{column}"
        columns.append((f.name, column, kind, nullable or f.name in unset))
    return columns


@functools.cache
def _may_be_unset(cls: type[Event]) -> frozenset[str]:
    """The fields of `cls` that may hold UNSET (all of them where its hints do not resolve)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:
        return frozenset(cls.__struct_fields__)
    return frozenset(n for n in cls.__struct_fields__ if _mentions(hints[n], msgspec.UnsetType))


_json = msgspec.json.Encoder(order="sorted")


def json_text(value: Any) -> str:
    """Builtins as compact JSON with sorted keys (msgspec), text that is not ASCII escaped
    as json.dumps escapes it (numbers, NaN and infinities as msgspec writes them: a value
    reads the same whatever its text holds)."""
    found = _json.encode(value)
    if found.isascii():
        return found.decode()
    return _NOT_ASCII.sub(_escaped, found.decode())


_NOT_ASCII = re.compile("[^\x00-\x7f]")


def _escaped(match: re.Match[str]) -> str:
    """A character as JSON's \\u escape (a UTF-16 surrogate pair beyond the BMP)."""
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 | code >> 10:04x}\\u{0xDC00 | code & 0x3FF:04x}"


def uuid_texts(ids: Sequence[bytes]) -> list[str]:
    """16-byte ids as canonical UUID text (what str(uuid.UUID(bytes=raw)) gives): the hex of
    all of them at once, copied into place 36 characters a row by one strided slice per
    character position, then cut into rows; no call per id, and no dependency beyond the base
    install (jsonl and csv exports need neither numpy nor pyarrow)."""
    count = len(ids)
    joined = b"".join(ids)
    if len(joined) != 16 * count:
        raise ValueError("event ids must be 16 bytes each")
    hexed = joined.hex().encode("ascii")
    text = bytearray(b"-" * (36 * count))
    for source, place in _UUID_PLACES:
        text[place::36] = hexed[source::32]
    whole = text.decode("ascii")
    return list(
        map(whole.__getitem__, map(slice, range(0, 36 * count, 36), range(36, 36 * count + 1, 36)))
    )


_UUID_PLACES = [(k, k + sum(k >= cut for cut in (8, 12, 16, 20))) for k in range(32)]
"""(hex digit, its place in the 36-character text) of each of a UUID's 32 hex digits."""


def json_texts(values: Sequence[Any]) -> list[str | None]:
    """`json_text` of each value (None stays None): one encode per value through `map`, and
    the ASCII check once over the batch; a batch with null or non-ASCII text goes value by
    value."""
    if None not in values:
        found = list(map(_json.encode, values))
        if b"".join(found).isascii():
            return list(map(bytes.decode, found))
    return [None if v is None else json_text(v) for v in values]


Columns = dict[str, Any]
"""A batch of rows as one list per column (every list the same length), in table order; a
column `Format.convert`ed is the format's array instead."""

Spec = list[tuple[str, ColumnKind, bool]]
"""A table's columns: (name, kind, nullable), in table order."""


class Table(Protocol):
    """One output file; `write` takes parts its format encoded (`Format.join` of them)."""

    def write(self, part: Any) -> None: ...

    def close(self) -> None: ...


class Format(Protocol):
    """How rows become a table's bytes: `encode` (where the rows were built, in a worker or
    here) turns a batch of columns into a part; the command's process joins parts and writes
    them to the table `open` made."""

    suffix: str

    def convert(self, columns: Columns) -> Columns:
        """The envelope's columns as `encode` takes them, converted once (a columnar
        format's arrays), so that rows `pick`ed from them are not converted again."""
        ...

    def pick(self, columns: Columns, at: list[int]) -> Columns:
        """The rows at `at` of converted columns."""
        ...

    def encode(self, spec: Spec, columns: Columns) -> Any: ...

    def spool(self, parts: list[Any], path: Path) -> list[int] | None:
        """Write encoded parts to `path` for the command's process (a worker's chunk), and
        the offset each one ends at; None: the parts travel pickled instead."""
        ...

    def unspool(self, path: Path, ends: list[int]) -> list[Any]:
        """The parts `spool` wrote to `path`."""
        ...

    def join(self, parts: list[Any]) -> Any: ...

    def open(self, path: Path, spec: Spec) -> Table: ...


class _TextTable:
    def __init__(self, path: Path, header: str = "") -> None:
        self.file: IO[str] = path.open("w", encoding="utf-8", newline="")
        self.file.write(header)

    def write(self, part: Any) -> None:
        self.file.write(part)

    def close(self) -> None:
        self.file.close()


class _Rows:
    """Text formats: columns stay Python lists; a chunk's text travels pickled."""

    def spool(self, parts: list[Any], path: Path) -> list[int] | None:
        return None

    def unspool(self, path: Path, ends: list[int]) -> list[Any]:
        raise AssertionError("text parts are never spooled")

    def convert(self, columns: Columns) -> Columns:
        return columns

    def pick(self, columns: Columns, at: list[int]) -> Columns:
        pick = _picker(at)
        return {name: list(pick(values)) for name, values in columns.items()}


class _JsonLines(_Rows):
    suffix = ".jsonl"

    def __init__(self) -> None:
        self.encoder = msgspec.json.Encoder()

    def encode(self, spec: Spec, columns: Columns) -> str:
        names = list(columns)
        rows = [
            dict(zip(names, values, strict=True)) for values in zip(*columns.values(), strict=True)
        ]
        return "".join(self.encoder.encode(r).decode() + "\n" for r in rows)

    def join(self, parts: list[Any]) -> str:
        return "".join(parts)

    def open(self, path: Path, spec: Spec) -> Table:
        return _TextTable(path)


class _Csv(_Rows):
    suffix = ".csv"

    @staticmethod
    def _text(rows: Iterable[Sequence[Any]]) -> str:
        buffer = io.StringIO(newline="")
        csv.writer(buffer).writerows(rows)
        return buffer.getvalue()

    def encode(self, spec: Spec, columns: Columns) -> str:
        return self._text(zip(*columns.values(), strict=True))

    def join(self, parts: list[Any]) -> str:
        return "".join(parts)

    def open(self, path: Path, spec: Spec) -> Table:
        return _TextTable(path, self._text([[name for name, _, _ in spec]]))


class _Parquet:
    suffix = ".parquet"

    def __init__(self) -> None:
        import pyarrow as pa

        self.pa = pa
        self.kinds = {
            "int": pa.int64(),
            "float": pa.float64(),
            "str": pa.string(),
            "bool": pa.bool_(),
            "json": pa.string(),
            "time": pa.timestamp("ns", tz="UTC"),
        }
        self.schemas: dict[tuple[tuple[str, ColumnKind, bool], ...], Any] = {}

    def schema(self, spec: Spec) -> Any:
        key = tuple(spec)
        found = self.schemas.get(key)
        if found is None:
            pa = self.pa
            found = self.schemas[key] = pa.schema(
                [
                    pa.field(name, self.kinds[kind], nullable=nullable)
                    for name, kind, nullable in spec
                ]
            )
        return found

    def convert(self, columns: Columns) -> Columns:
        kinds = dict(ENVELOPE)
        return {
            name: self._array(values, self.kinds[kinds[name]]) for name, values in columns.items()
        }

    def pick(self, columns: Columns, at: list[int]) -> Columns:
        rows = self.pa.array(at, type=self.pa.int32())
        return {name: values.take(rows) for name, values in columns.items()}

    def encode(self, spec: Spec, columns: Columns) -> Any:
        schema = self.schema(spec)
        arrays = []
        for f in schema:
            try:
                arrays.append(self._array(columns[f.name], f.type))
            except OverflowError:  # msgspec's ints reach 2**64 - 1, Parquet's 2**63 - 1
                raise _beyond_int64(f.name, columns) from None
        return self.pa.Table.from_arrays(arrays, schema=schema)

    def _array(self, values: Any, kind: Any) -> Any:
        """Values as an array of `kind` (one converted already stays as it is)."""
        if isinstance(values, self.pa.Array):
            return values
        return self.pa.array(values, type=kind, from_pandas=False)

    def spool(self, parts: list[Any], path: Path) -> list[int] | None:
        """Each table as an Arrow IPC stream, one after another: written and read back by
        copying its buffers, where pickling a chunk's tables through the pool's pipe cost
        several copies and a GIL hand-over per 64 KiB."""
        ends: list[int] = []
        with self.pa.OSFile(str(path), "wb") as file:
            for table in parts:
                with self.pa.ipc.new_stream(file, table.schema) as stream:
                    stream.write_table(table)
                ends.append(file.tell())
        return ends

    def unspool(self, path: Path, ends: list[int]) -> list[Any]:
        # Read into buffers of each table's own (not views of one buffer of the file): a
        # rare type's rows wait in its table for later chunks, and would keep the whole
        # chunk alive meanwhile.
        tables = []
        with self.pa.OSFile(str(path)) as file:
            for start in [0, *ends[:-1]]:
                file.seek(start)
                tables.append(self.pa.ipc.open_stream(file).read_all())
        return tables

    def join(self, parts: list[Any]) -> Any:
        return parts[0] if len(parts) == 1 else self.pa.concat_tables(parts)

    def open(self, path: Path, spec: Spec) -> Table:
        import pyarrow.parquet as pq

        # Dictionary pages only where values repeat: an event id or a JSON text is unique,
        # and building a dictionary the writer then drops cost a third of its time.
        repeated = [name for name, kind, _ in spec if kind != "json" and name != "event_id"]
        writer = pq.ParquetWriter(str(path), self.schema(spec), use_dictionary=repeated)
        return _ParquetTable(writer)


def _beyond_int64(column: str, columns: Columns) -> CliUsageError:
    values = columns[column]
    at = next(i for i, v in enumerate(values) if v is not None and not -(2**63) <= v < 2**63)
    seq = columns["seq"][at].as_py()  # the envelope: converted to Arrow once per chunk
    return CliUsageError(
        f"seq {seq}: column {column} holds {values[at]}, beyond Parquet's 64-bit integers",
        hint="export with --format jsonl or csv, which keep any integer",
    )


class _ParquetTable:
    def __init__(self, writer: Any) -> None:
        self.writer = writer

    def write(self, part: Any) -> None:
        self.writer.write_table(part)

    def close(self) -> None:
        self.writer.close()


FORMATS: dict[str, Callable[[], Format]] = {
    "parquet": _Parquet,
    "jsonl": _JsonLines,
    "csv": _Csv,
}

PENDING = 50_000
"""Rows held over every table before all are written: memory stays bounded whatever the
number of event types (each table also writes when it alone holds BATCH rows)."""


def _new_partial(folder: Path, name: str, held: contextlib.ExitStack) -> Path:
    """A new file of its own in `folder` for table `name` while it is written, made as any
    file the command writes is (its mode from the umask: mkstemp's 0600 stayed the table's),
    and locked until `held` closes: a partial no one holds was left by a killed export."""
    while True:
        path = folder / f".{name}.{secrets.token_hex(4)}.partial"
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        except FileExistsError:
            continue
        held.callback(os.close, fd)
        with contextlib.suppress(OSError):  # no locks here (some network file systems): none
            fcntl.flock(fd, fcntl.LOCK_EX)  # is taken, and no clean-up can take one either
        return path


_PARTIAL = re.compile(r"\..+\.(?:parquet|jsonl|csv)\.[0-9a-f]{8}\.partial", re.DOTALL)

JUST_MADE_S = 2.0
"""A partial younger than this may be one whose export has made it and not yet locked it."""


def _remove_abandoned_partials(folder: Path) -> None:
    """Remove the partial tables of exports into `folder` that died (SIGKILL, a lost host):
    hidden, they stayed forever. A live export holds a lock on each of its own."""
    for path in folder.iterdir():
        if not _PARTIAL.fullmatch(path.name):
            continue
        try:  # not blocking: a FIFO named like a partial hung the export
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:  # gone meanwhile, a link, not ours to read
            continue
        try:
            found = os.fstat(fd)
            if not stat.S_ISREG(found.st_mode) or time.time() - found.st_mtime < JUST_MADE_S:
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path.unlink()
        except OSError:  # held (an export is writing it), no locks here, not ours to remove
            continue
        finally:
            os.close(fd)


class _Sink:
    """A table and its pending parts (each one chunk's rows of this table), written a batch
    at a time to `partial`, which takes the table's `path` once the export is whole."""

    def __init__(self, table: Table, form: Format, partial: Path, path: Path) -> None:
        self.table = table
        self.form = form
        self.partial, self.path = partial, path
        self.parts: list[Any] = []
        self.pending = 0
        self.count = 0

    def add(self, part: Any, rows: int) -> None:
        self.parts.append(part)
        self.pending += rows

    def flush(self) -> None:
        if not self.parts:
            return
        parts, self.parts = self.parts, []
        self.table.write(self.form.join(parts))
        self.count += self.pending
        self.pending = 0


def _envelope(envelope: list[Any], ids: Sequence[str], time_as_text: bool) -> Columns:
    """The envelope columns of rows given as their columns (`zip(*rows)`, table order)."""
    recorded = envelope[6]
    return {
        "seq": list(envelope[0]),
        "stream": list(envelope[1]),
        "version": list(envelope[2]),
        "event_id": list(ids),
        "type": list(envelope[4]),
        "schema": list(envelope[5]),
        "recorded_at": list(map(format_ns, recorded)) if time_as_text else list(recorded),
    }


def record_spec(mark_column: str | None) -> Spec:
    """The `records` table's columns: the envelope, the fields as JSON, the domain's mark."""
    spec: Spec = [(n, k, False) for n, k in ENVELOPE] + [("data", "json", True)]
    if mark_column is not None:
        spec.append((mark_column, "int", True))
    return spec


def typed_spec(cls: type[Event]) -> Spec:
    """The table of one event type: the envelope (no type) and a column per field."""
    envelope = [(n, k, False) for n, k in ENVELOPE if n != "type"]
    return envelope + [(column, kind, nullable) for _, column, kind, nullable in event_columns(cls)]


class TypedPart(NamedTuple):
    """One event type's rows of a chunk, as a part of its table."""

    name: str
    cls: type[Event]
    part: Any
    rows: int


class Chunk(NamedTuple):
    """One chunk of records as parts of the tables they belong in."""

    last_seq: int
    rows: int
    records: Any
    typed: list[TypedPart]
    """Each event type's rows in the chunk."""
    pid: int
    """The process that built it."""
    spool: str | None = None
    """Where a worker wrote its parts (records first, then each type's; `Format.spool`):
    then `records` and each part are None until `unspooled`."""
    ends: list[int] | None = None


class ChunkBuilder:
    """Builds a chunk's table parts (in a worker process, or in the command's own)."""

    def __init__(
        self,
        fmt: str,
        known: dict[str, type[Event]],
        mark_of: Callable[[int], Mark | None] | None,
        mark_column: str | None,
    ) -> None:
        self.form = FORMATS[fmt]()
        self.time_as_text = fmt != "parquet"
        self.decoder = _ChunkDecoder(known)
        self.mark_of = mark_of
        self.mark_column = mark_column
        self.records = record_spec(mark_column)

    def build(self, chunk: list[RecordRow]) -> Chunk:
        if not chunk:  # a range of seqs none of which is stored (a log edited outside eventlog)
            return Chunk(0, 0, None, [], os.getpid())
        envelope = list(zip(*chunk, strict=True))
        ids = uuid_texts(envelope[3])
        types: tuple[str, ...] = envelope[4]
        events = self.decoder.decode(chunk, envelope)
        # The envelope columns, converted once: each type's rows are picked from them.
        base = self.form.convert(_envelope(envelope, ids, self.time_as_text))
        data: list[str | None] = [None] * len(chunk)  # filled type by type below
        columns = {**base, "data": data}
        mark_column, mark_of = self.mark_column, self.mark_of
        if mark_column is not None and mark_of is not None:
            marks = list(map(mark_of, envelope[0]))
            columns[mark_column] = [m.fields.get(mark_column) if m else None for m in marks]
        elif mark_column is not None:
            columns[mark_column] = [None] * len(chunk)
        del base["type"]  # a type's table has no type column
        typed: list[TypedPart] = []
        # the rows of each type, in seq order (a stable sort of the chunk's indices)
        order = sorted(range(len(chunk)), key=types.__getitem__)
        for name, group in itertools.groupby(order, key=types.__getitem__):
            at = list(group)
            if None in map(events.__getitem__, at):  # rows this program cannot read
                for i in at:
                    if events[i] is None:
                        data[i] = _raw_text(chunk[i][7], name)
                at = [i for i in at if events[i] is not None]
                if not at:
                    continue
            evs = cast(list[Event], list(map(events.__getitem__, at)))
            cls = type(evs[0])
            for i, text in zip(at, data_texts(cls, evs), strict=True):
                data[i] = text
            part = self.form.pick(base, at)
            part.update(typed_columns(cls, evs))
            typed.append(TypedPart(name, cls, self.form.encode(typed_spec(cls), part), len(at)))
        return Chunk(
            envelope[0][-1],
            len(chunk),
            self.form.encode(self.records, columns),
            typed,
            os.getpid(),
        )


def _picker(at: list[int]) -> Callable[[Sequence[Any]], Sequence[Any]]:
    """The items at `at` of a sequence, as a sequence (itemgetter gives one item alone)."""
    if len(at) == 1:
        only = at[0]
        return lambda values: (values[only],)
    return operator.itemgetter(*at)


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
    type=OutputPath(file_okay=False, path_type=Path),
    help="Folder to write the tables into (created; existing tables are replaced).",
)
@jobs_option("Processes that decode records and build the tables while this one writes them", BATCH)
def export(target: str, fmt: str, output: Path, jobs: int | None) -> None:
    """Write TARGET's records as tables into a folder: `records` (every record: envelope,
    fields as JSON, and the domain's marks such as rolled_back_by) and one table per event
    type (envelope plus one typed column per field), ready for pandas, polars or DuckDB.

    \b
    recorded_at is a UTC timestamp with nanoseconds (ISO-8601 text in jsonl and csv).
    Records of unknown types are only in `records` (their raw fields as JSON).
    The tables are the same whatever --jobs is.
    """
    command = click.get_current_context().command
    marker = command.marker if isinstance(command, ExportCommand) else None
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise CliUsageError(
                "--format parquet needs pyarrow, which is not installed",
                hint="pip install 'eventlog[audit]', or use --format jsonl or csv",
            ) from None
    refuse_writing_onto_log(target, output)  # a folder named run.db-journal: SQLite then
    with writing_output(output):  # (a folder this user may not search: exit 70)
        if output.exists() and not output.is_dir():  # failed every command on the log
            raise CliUsageError(f"{output}: exists and is not a folder")
    form = FORMATS[fmt]()
    suffix = form.suffix
    mark_column = marker.column if marker is not None else None

    opened: list[_Sink] = []  # every table begun, records first: what a failure cleans up

    def make_table(path: Path, spec: Spec) -> _Sink:
        # Written beside its name, under a name of its own, and renamed once every table is
        # whole: a failed export leaves no table in part, and an earlier export's as it was.
        refuse_writing_onto_log(target, path)  # a table named like the log, or a hard link
        if path.is_dir():
            raise CliUsageError(f"{path}: is a folder, where this export writes a table")
        partial = _new_partial(output, path.name, held)
        try:
            sink = _Sink(form.open(partial, spec), form, partial, path)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        opened.append(sink)
        return sink

    with (
        _removed_if_failed(output),
        writing_output(output),
        open_log(target) as log,
        collector.paused(long=True),
        contextlib.ExitStack() as held,
    ):
        # The cyclic collector rests: every chunk makes ~10^5 acyclic objects (events, dicts,
        # texts), freed by their reference counts; collections scanning them were a third of
        # the command's CPU.
        output.mkdir(parents=True, exist_ok=True)
        _remove_abandoned_partials(output)
        head = log.head()
        most, ranges = seq_chunks(log, 1, head, BATCH)
        vocabulary = portable_vocabulary()
        jobs = jobs_for(most, jobs)
        sinks: dict[str, _Sink] = {}
        try:
            records = make_table(output / f"records{suffix}", record_spec(mark_column))
            with contextlib.ExitStack() as stack:
                chunks: Iterator[Chunk]
                if jobs > 1 and vocabulary is not None:
                    spool = _spool_folder(stack) if fmt == "parquet" else None
                    setup = functools.partial(
                        _setup_worker, run_target(target), fmt, head, marker, spool
                    )
                    gone = None if spool is None else functools.partial(_remove, spool)
                    workers = stack.enter_context(
                        Workers(jobs, vocabulary, setup, _build_range, orphaned=gone)
                    )
                    chunks = workers.map(ranges)
                else:
                    here: _State = (log, _builder(log, fmt, head, marker), None)
                    chunks = (_build_range(here, seqs) for seqs in ranges)
                with seq_progress("export", 1, head) as advance:
                    pids = _write_chunks(chunks, records, sinks, make_table, output, advance)
                for sink in opened:
                    sink.flush()
                    sink.table.close()
            # The type tables first, records last: one rename failing midway (not atomic across
            # tables) leaves the records table as it was, the one every reader starts from.
            for sink in reversed(opened):
                sink.partial.replace(sink.path)
        except BaseException:
            for sink in opened:
                with contextlib.suppress(Exception):
                    sink.table.close()
                sink.partial.unlink(missing_ok=True)
            raise
    with writing_output(output):
        stale = _stale_tables(target, output, suffix, set(sinks), event_types())
    console = stdout_console()
    console.print(f"{records.count} records -> {output / ('records' + suffix)}")
    for name, sink in sorted(sinks.items()):
        console.print(f"{sink.count} {name} -> {output / (table_stem(name) + suffix)}")
    for path in stale:
        console.print(f"removed {path}: a table of an earlier export, of a type this log lacks")
    helpers = pids - {os.getpid()}
    if helpers:
        console.print(f"tables built by {len(helpers)} worker process{'es' * (len(helpers) > 1)}")


@contextlib.contextmanager
def _removed_if_failed(folder: Path) -> Iterator[None]:
    """A folder the export makes is removed again if the export fails (emptied by then:
    a failed export leaves no table behind, nor the folder it made for them)."""
    made = not folder.exists()
    try:
        yield
    except BaseException:
        if made:
            with contextlib.suppress(OSError):  # not empty: someone else's files are in it
                folder.rmdir()
        raise


def _write_chunks(
    chunks: Iterator[Chunk],
    records: _Sink,
    sinks: dict[str, _Sink],
    make_table: Callable[[Path, Spec], _Sink],
    output: Path,
    advance: Callable[[int], None],
) -> set[int]:
    """Every chunk's parts into their tables, in seq order; the processes that built them."""
    pending = 0
    pids: set[int] = set()
    for chunk in chunks:
        pids.add(chunk.pid)
        if not chunk.rows:
            continue
        if chunk.spool is not None:
            chunk = unspooled(chunk, records.form)
        advance(chunk.last_seq)
        records.add(chunk.records, chunk.rows)
        records.flush()
        for name, cls, part, rows in chunk.typed:
            sink = sinks.get(name)
            if sink is None:
                sink = sinks[name] = make_table(
                    output / (table_stem(name) + records.form.suffix), typed_spec(cls)
                )
            sink.add(part, rows)
            pending += rows
            if sink.pending >= BATCH:
                pending -= sink.pending
                sink.flush()
            elif pending >= PENDING:  # rare types wait: few, large row groups
                for other in sinks.values():
                    other.flush()
                pending = 0
    return pids


def _spool_folder(stack: contextlib.ExitStack) -> Path | None:
    """A temporary folder for the workers' chunks, removed when the command ends (and by
    the workers, should the command be killed); None where none can be made: the chunks
    then travel pickled."""
    try:
        folder = Path(tempfile.mkdtemp(prefix="eventlog-export-"))
    except OSError:
        return None
    stack.callback(_remove, folder)
    return folder


def _remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def spooled(chunk: Chunk, form: Format, folder: Path) -> Chunk:
    """A worker's chunk with its parts written to a file in `folder`, where its format
    spools (else, or when the file cannot be written, as it is)."""
    if not chunk.rows:
        return chunk
    path = folder / f"chunk-{chunk.last_seq}"
    try:
        ends = form.spool([chunk.records, *(t.part for t in chunk.typed)], path)
    except OSError:  # the temporary folder is full, gone or read-only: it travels pickled
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        return chunk
    if ends is None:
        return chunk
    typed = [TypedPart(t.name, t.cls, None, t.rows) for t in chunk.typed]
    return Chunk(chunk.last_seq, chunk.rows, None, typed, chunk.pid, str(path), ends)


def unspooled(chunk: Chunk, form: Format) -> Chunk:
    """A spooled chunk with its parts read back; its file removed."""
    assert chunk.spool is not None and chunk.ends is not None
    path = Path(chunk.spool)
    try:
        records, *parts = form.unspool(path, chunk.ends)
    except (OSError, ValueError) as exc:  # gone or damaged (pyarrow's errors are ValueErrors)
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise EventLogError(
            f"{path}: cannot read back a chunk a worker process wrote there: {reason}",
            hint="rerun with --jobs 1",
        ) from exc
    finally:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
    typed = [
        TypedPart(t.name, t.cls, part, t.rows) for t, part in zip(chunk.typed, parts, strict=True)
    ]
    return Chunk(chunk.last_seq, chunk.rows, records, typed, chunk.pid)


def _read(log: EventLog, low: int, high: int) -> list[RecordRow]:
    return list(log.read_rows(low, high, page_size=BATCH))


def _builder(log: EventLog, fmt: str, head: int, marker: Marker | None) -> ChunkBuilder:
    """A builder whose marks are those of the log as of the command's head."""
    mark_of = marker.marks(log, head) if marker is not None else None
    column = marker.column if marker is not None else None
    return ChunkBuilder(fmt, event_types(), mark_of, column)


_State = tuple[EventLog, ChunkBuilder, Path | None]
"""What builds chunks: the log, a builder, and the folder a worker spools its chunks to."""


def _setup_worker(
    target: str, fmt: str, head: int, marker: Marker | None, spool: Path | None
) -> _State:
    """In a worker process: its own read-only connection to the log, its builder, and the
    command's spool folder (None: its chunks travel pickled)."""
    log = open_log(target)
    return log, _builder(log, fmt, head, marker), spool


def _build_range(state: _State, seqs: tuple[int, int]) -> Chunk:
    """The chunk of records low..high (in a worker process, or in the command's own)."""
    log, builder, spool = state
    with collector.paused(long=True):
        chunk = builder.build(_read(log, *seqs))
        return chunk if spool is None else spooled(chunk, builder.form, spool)


def table_stem(type_name: str) -> str:
    """The file name (less its suffix) of a type's table: the type's name where that is a
    plain file name of its own (not the records table's, no path, not hidden, not too long),
    else "%" and the name percent-encoded (a hash of it past 200 bytes)."""
    plain = type_name != "records" and _PLAIN_STEM.fullmatch(type_name)
    if plain and len(type_name.encode()) <= _STEM_BYTES:
        return type_name
    quoted = urllib.parse.quote(type_name, safe="")
    if len(quoted) > _STEM_BYTES:
        quoted = hashlib.sha256(type_name.encode()).hexdigest()
    return "%" + quoted


_PLAIN_STEM = re.compile(r"\w[\w.-]*")
_STEM_BYTES = 200


def _stale_tables(
    target: str, output: Path, suffix: str, written: set[str], known: Mapping[str, type[Event]]
) -> list[Path]:
    """Remove the tables an earlier export left in `output` that this one did not write
    (files named like a table of a known event type, never the log read): loading `*.jsonl`
    read two logs."""
    stems = {table_stem(name) for name in written}
    tables = {table_stem(name) for name in known}
    stale = sorted(
        path
        for path in output.glob(f"*{suffix}")
        if path.stem not in stems
        and path.stem in tables
        and path.is_file()
        and log_file_at(target, path) is None
    )
    for path in stale:
        path.unlink()
    return stale


def _raw_text(payload: bytes, type_name: str) -> str | None:
    """The `data` of a record whose event does not decode: its raw fields, if any."""
    raw = raw_data(payload, type_name)
    return None if raw is None else json_text(raw)


class _ChunkDecoder:
    """A chunk of rows decoded at once: each payload by one decoder of the known event
    types (a tagged union), which refuses a payload that is short or trails bytes. A chunk
    holding any other record (an unknown type, another schema version, a type no union can
    hold, a payload that does not decode as its row's type) is decoded record by record as
    `codec.decode` does."""

    def __init__(self, known: dict[str, type[Event]]) -> None:
        # msgspec unites only structs encoded alike: maps tagged by one field.
        self.known = {name: cls for name, cls in known.items() if _unitable(cls)}
        self.current = {name: cls.schema for name, cls in self.known.items()}
        self.any_of: msgspec.msgpack.Decoder[Any] | None = (
            msgspec.msgpack.Decoder(functools.reduce(operator.or_, self.known.values()))
            if self.known
            else None
        )

    def decode(self, chunk: list[RecordRow], envelope: list[Any]) -> list[Event | None]:
        """Each row's event (None: it does not decode); `envelope` is the chunk's columns
        (`zip(*chunk)`)."""
        events = self._at_once(envelope[4], envelope[5], envelope[7])
        if events is None:
            events = [self._one(row) for row in chunk]
        return events

    def _at_once(
        self, types: Sequence[str], schemas: Sequence[int], payloads: Sequence[bytes]
    ) -> list[Event | None] | None:
        current, known = self.current, self.known
        if self.any_of is None or any(
            current.get(t) != s for t, s in set(zip(types, schemas, strict=True))
        ):
            return None
        try:
            events: list[Event | None] = list(map(self.any_of.decode, payloads))
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        if list(map(type, events)) != list(map(known.__getitem__, types)):
            return None
        return events

    @staticmethod
    def _one(row: RecordRow) -> Event | None:
        try:
            return codec.decode(row[4], row[5], row[7], seq=row[0])
        except SchemaError:
            return None


def _unitable(cls: type[Event]) -> bool:
    config = cls.__struct_config__
    return config.tag_field == "type" and not config.array_like


def typed_columns(cls: type[Event], events: Sequence[Event]) -> Columns:
    """The field columns of one event type's rows: each field of every event at once, as
    builtins (`codec.value_builtins` of the column: dict keys as text, sets in order), a
    default left out of the payload as its value, UNSET as null; nested values as JSON
    text."""
    unset, sets = _may_be_unset(cls), codec.holds_sets(cls)
    columns: Columns = {}
    for field, column, kind, _ in event_columns(cls):
        values = list(map(operator.attrgetter(field), events))
        if field in unset:
            values = [None if v is msgspec.UNSET else v for v in values]
        built = codec.value_builtins(values, sets=sets)
        columns[column] = json_texts(built) if kind == "json" else built
    return columns


def data_texts(cls: type[Event], events: Sequence[Event]) -> list[str | None]:
    """Each event's fields as `json_text` of its builtins (sorted keys, no tag), encoded
    straight from the structs: msgspec sorts a struct's tag among its fields, so each
    event's text holds its tag entry once, cut from all of them in one pass. Only for a
    `_direct` type, where the entry occurs once per event (no nested value holds it) and the
    text is ASCII (json_text escapes the rest as json.dumps does); else event by event."""
    if events and _direct(cls):
        entry, cut = _tag_entry(cls)
        try:
            joined = b"\n".join(map(_json.encode, events))  # compact JSON holds no raw newline
        except TypeError:  # a dict keyed by other than text, or an Ext held by an `Any` field
            joined = b""
        if joined and joined.count(entry) == len(events) and joined.isascii():
            return list(joined.replace(entry, cut).decode("ascii").split("\n"))
    return [json_text(codec.to_builtins(event)) for event in events]


@functools.cache
def _direct(cls: type[Event]) -> bool:
    """Whether a type's events encode as their builtins do, each field by name and every
    field always there: not array_like; no default left out (omit_defaults) and no field
    that may be UNSET (either moves the tag entry); its JSON that of its builtins (no set,
    Raw or Ext: `codec.json_as_builtins`)."""
    config = cls.__struct_config__
    if config.omit_defaults or config.array_like or _may_be_unset(cls):
        return False
    return codec.json_as_builtins(cls)


def _mentions(hint: Any, wanted: type) -> bool:
    return hint is wanted or any(_mentions(arg, wanted) for arg in typing.get_args(hint))


@functools.cache
def _tag_entry(cls: type[Event]) -> tuple[bytes, bytes]:
    """The tag entry of `cls`'s sorted JSON with its separator, and what it becomes."""
    config, field = cls.__struct_config__, cls.__struct_config__.tag_field
    assert field is not None  # every event type is tagged
    tag = b'"%s":%s' % (field.encode(), _json.encode(config.tag))
    keys = sorted([*cls.__struct_encode_fields__, field])
    place = keys.index(field)
    if place > 0:
        return b"," + tag, b""
    if len(keys) > 1:
        return tag + b",", b""
    return b"{" + tag + b"}", b"{}"
