"""What every subcommand shares: exit codes, opening a target, and how a record is shown."""

from __future__ import annotations

import enum
import os
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.text import Text
from sqlalchemy import exc as sa_exc

from eventlog import codec
from eventlog.errors import (
    ConcurrencyError,
    DuplicateEventError,
    EventLogError,
    InputError,
    IntegrityError,
    LogRevisionError,
    SchemaError,
    StorageError,
)
from eventlog.log import DEFAULT_BUSY_TIMEOUT, EventLog, open_store, resolve_url
from eventlog.records import Record, RecordedEvent
from eventlog.store import migrate


class ExitCode(enum.IntEnum):
    """The documented exit codes of `eventlog` (also listed in `eventlog --help`)."""

    OK = 0
    INTEGRITY = 1
    USAGE = 2
    REVISION_OR_SCHEMA = 3
    CONFLICT = 4
    OTHER = 5
    DATABASE = 6
    INTERNAL = 70
    INTERRUPTED = 130


class CliUsageError(InputError):
    """The command line named something that does not exist or cannot be used."""


_EXIT_CODES: list[tuple[type[BaseException], ExitCode]] = [
    (IntegrityError, ExitCode.INTEGRITY),
    (InputError, ExitCode.USAGE),
    (LogRevisionError, ExitCode.REVISION_OR_SCHEMA),
    (SchemaError, ExitCode.REVISION_OR_SCHEMA),
    (ConcurrencyError, ExitCode.CONFLICT),
    (DuplicateEventError, ExitCode.CONFLICT),
    (StorageError, ExitCode.DATABASE),
    (EventLogError, ExitCode.OTHER),
]


def exit_code_for(exc: BaseException) -> ExitCode:
    """The exit code an error ends the command with (70 for anything not deliberate)."""
    if isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError) or (
        type(exc) is sa_exc.DatabaseError  # e.g. "file is not a database"
    ):
        return ExitCode.DATABASE
    for cls, code in _EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return ExitCode.INTERNAL


# -- targets --------------------------------------------------------------------------------


def shown_target(target: str) -> str:
    """The target as messages show it: a path as given, a URL without its password."""
    if "://" not in target:
        return target
    return resolve_url(target).render_as_string(hide_password=True)


def require_existing(target: str) -> None:
    """Refuse a file path that does not exist, instead of creating an empty database there."""
    if "://" not in target and not Path(target).expanduser().exists():
        raise CliUsageError(
            f"{target}: no such file", hint=f"create a log with `eventlog init {target}`"
        )


def require_parent(target: str) -> None:
    """A new SQLite file needs its folder; say so instead of a driver error."""
    if "://" in target:
        return
    parent = Path(target).expanduser().resolve().parent
    if not parent.is_dir():
        raise CliUsageError(f"{target}: folder {parent} does not exist")


BUSY_TIMEOUT_ENV = "EVENTLOG_BUSY_TIMEOUT"


def busy_timeout() -> float:
    """Seconds an append waits for another writer's lock (env EVENTLOG_BUSY_TIMEOUT)."""
    text = os.environ.get(BUSY_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_BUSY_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86_400:
        raise CliUsageError(f"{BUSY_TIMEOUT_ENV}={text!r}: expected seconds in 0..86400")
    return value


def open_log(target: str, *, create: bool = False, write: bool = False) -> EventLog:
    """Open a log at head; without `create`, a missing file or an empty database is refused.

    Unless the command creates or appends (`create`, `write`), the log is opened read-only:
    an audit never creates, migrates or changes the file it reads.
    """
    if create:
        require_parent(target)
    else:
        require_existing(target)
    store = open_store(target, busy_timeout=busy_timeout(), read_only=not (create or write))
    try:
        migrate.ensure_at_head(store.engine, target=shown_target(target), create=create)
    except BaseException:
        store.close()
        raise
    return EventLog(store)


# -- time -----------------------------------------------------------------------------------

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_FRACTION = re.compile(r"^(?P<head>.*?T\d{2}:\d{2}(?::\d{2})?)[.,](?P<frac>\d+)(?P<tail>.*)$")


def format_ns(ns: int) -> str:
    """UTC ns as ISO-8601 with nine fractional digits: 2026-11-29T12:00:00.123456789Z."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    stamp = (_EPOCH + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{fraction:09d}Z"


def short_time(ns: int) -> str:
    """UTC time to the millisecond, for tables."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    stamp = (_EPOCH + timedelta(seconds=seconds)).strftime("%Y-%m-%d %H:%M:%S")
    return f"{stamp}.{fraction // 1_000_000:03d}"


def parse_time(text: str) -> int:
    """ISO-8601 (date, or date and time; no zone means UTC) as UTC nanoseconds, exactly."""
    fraction_ns = 0
    base = text.strip()
    match = _FRACTION.match(base)
    if match:
        digits = match["frac"]
        fraction_ns = int(digits[:9].ljust(9, "0"))
        base = match["head"] + match["tail"]
    try:
        moment = datetime.fromisoformat(base)
    except ValueError as exc:
        raise ValueError(f"{text!r} is not an ISO-8601 time") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + fraction_ns


def time_option(_ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """click callback: an ISO-8601 option value as UTC nanoseconds."""
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param=param) from exc


# -- records as people and scripts see them -------------------------------------------------


class RecordView(msgspec.Struct, frozen=True):
    """One record ready to print: fields as JSON-friendly builtins, or raw when undecodable."""

    seq: int
    stream: str
    version: int
    event_id: uuid.UUID
    type: str
    schema: int
    recorded_at: int
    data: Any
    unknown: bool = False


def view_record(record: Record, *, allow_unknown: bool) -> RecordView:
    """Decode a record; with `allow_unknown`, an unreadable one is shown raw instead of failing."""
    try:
        event = codec.decode(record.type, record.schema, record.payload, seq=record.seq)
        data: Any = codec.to_builtins(event)
        unknown = False
    except SchemaError:
        if not allow_unknown:
            raise
        data, unknown = raw_data(record.payload), True
    return _view(record, data, unknown)


def view_decoded(record: RecordedEvent) -> RecordView:
    """A record the log already decoded (from `read` or `subscribe`)."""
    return _view(record, codec.to_builtins(record.event), False)


def _view(record: Record | RecordedEvent, data: Any, unknown: bool) -> RecordView:
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
    )


def raw_data(payload: bytes) -> Any:
    """A payload decoded without a schema, as JSON-friendly builtins (None if not msgpack)."""
    try:
        data = codec.raw_fields(payload)
        if isinstance(data, dict):
            data.pop("type", None)
        return msgspec.to_builtins(data, str_keys=True)
    except (msgspec.DecodeError, TypeError, ValueError):
        return None


def json_object(view: RecordView) -> dict[str, Any]:
    """The `--json` form: seq, stream, version, event_id, type, recorded_at, data.

    recorded_at is ISO-8601 UTC with nanoseconds. A record shown raw also has "unknown": true
    and its "schema" version.
    """
    obj: dict[str, Any] = {
        "seq": view.seq,
        "stream": view.stream,
        "version": view.version,
        "event_id": str(view.event_id),
        "type": view.type,
        "recorded_at": format_ns(view.recorded_at),
        "data": view.data,
    }
    if view.unknown:
        obj["unknown"] = True
        obj["schema"] = view.schema
    return obj


_json = msgspec.json.Encoder()


def json_line(obj: object) -> str:
    return _json.encode(obj).decode()


def summary(data: Any) -> str:
    """The event's fields as `key=value` pairs on one line (values as compact JSON)."""
    if not isinstance(data, dict):
        return "" if data is None else json_line(data)
    parts = []
    for key, value in data.items():
        shown = value if isinstance(value, str) else json_line(value)
        parts.append(f"{key}={shown}")
    return " ".join(parts)


# -- output -----------------------------------------------------------------------------------


class _OutputConsole(Console):
    """rich exits with status 1 when the reader of a pipe goes away (`... | head`); hand the
    BrokenPipeError to `eventlog`'s handler instead, which ends quietly with exit code 0."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def stdout_console() -> Console:
    """Console for results; follows sys.stdout so a live progress bar can redirect it.

    Into a pipe or file nothing is cut to a terminal's width (lines are as long as they are).
    """
    console = _OutputConsole(highlight=False, soft_wrap=False)
    if not console.is_terminal:
        console = _OutputConsole(highlight=False, soft_wrap=False, width=PIPE_WIDTH)
    return console


PIPE_WIDTH = 4096


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


PROGRESS_MIN_RECORDS = 10_000


@contextmanager
def seq_progress(
    description: str, first_seq: int, last_seq: int
) -> Iterator[Callable[[int], None]]:
    """A progress bar over a seq range on stderr, only when a person is watching a long read.

    Yields a function to call with each seq seen (a no-op when no bar is shown).
    """
    total = last_seq - first_seq + 1
    if total < PROGRESS_MIN_RECORDS or not (sys.stdout.isatty() and sys.stderr.isatty()):
        yield lambda _seq: None
        return
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=stderr_console(),
        transient=True,
    )
    step = max(total // 500, 1)
    with progress:
        task = progress.add_task(description, total=total)
        shown = first_seq

        def advance(seq: int) -> None:
            nonlocal shown
            if seq - shown >= step:  # a redraw per record would cost more than the read
                shown = seq
                progress.update(task, completed=seq - first_seq + 1)

        yield advance


class RecordLines:
    """Records as an aligned table, printed a chunk at a time so memory stays bounded.

    On a terminal the lines are styled with rich and cut to the screen's width; into a pipe
    or file they are plain text and never cut (rich costs ~80 us a line, too slow for 10^6).
    Column widths come from the first chunk and only grow, so chunks stay aligned.
    """

    STREAM_CAP = 40
    TYPE_CAP = 28

    def __init__(
        self, console: Console, seq_width: int, *, header: bool = True, chunk: int = 200
    ) -> None:
        self.console = console
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
        if self.styled:
            self._print_styled()
        else:
            self._print_plain()
        self.printed += len(self.rows)
        self.rows.clear()

    def _cells(self, view: RecordView) -> tuple[str, str, str, str, str, str]:
        stream, type_label = view.stream, self._type_label(view)
        if self.styled:
            stream = _ellipsis(stream, self.stream_width)
            type_label = _ellipsis(type_label, self.type_width)
        return (
            f"{view.seq:>{self.seq_width}}",
            short_time(view.recorded_at),
            f"{stream:<{self.stream_width}}",
            f"{view.version:>4}",
            f"{type_label:<{self.type_width}}",
            summary(view.data),
        )

    def _header_cells(self) -> tuple[str, ...]:
        return (
            f"{'seq':>{self.seq_width}}",
            f"{'time (UTC)':<23}",
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
                )
            )
        self.console.print(Text("\n").join(lines), no_wrap=True, overflow="ellipsis", crop=True)


def _ellipsis(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
