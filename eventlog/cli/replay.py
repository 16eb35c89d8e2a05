"""`eventlog replay`: read the log back, filtered, as a table for people or JSON lines.

The core command filters by stream, type, seq and time. A domain adds selectors (options
that stand for streams, single records or a seq range, e.g. `--group G`, `--step N`) and
marks (records that no longer count, e.g. rolled back by a restore) through `make_replay`.
"""

from __future__ import annotations

import copy
import functools
import itertools
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol, TextIO

import click

from eventlog import codec
from eventlog.cli.exits import CliUsageError
from eventlog.cli.numbers import number
from eventlog.cli.output import nearest, seq_progress, stderr_console, stdout_console
from eventlog.cli.targets import open_log, run_target
from eventlog.cli.times import format_ns, time_option
from eventlog.cli.views import (
    JsonHead,
    Mark,
    RecordLines,
    row_json,
    uuid_text,
    view_record,
    write_json_line,
)
from eventlog.cli.workers import (
    Carried,
    Workers,
    jobs_for,
    jobs_option,
    portable_vocabulary,
    seq_chunks,
)
from eventlog.errors import SchemaError
from eventlog.events import event_types
from eventlog.log import EventLog
from eventlog.store.base import RecordRow, check_seq, record_of_row


@dataclass
class Selection:
    """What one value of a selector stands for.

    Records of `streams`, plus the single records `seqs` names (by their stream), all within
    `seq_range` when one is given. Values of stream-like selectors add up; ranges narrow.
    """

    streams: list[str] = field(default_factory=list)
    seqs: dict[str, set[int]] = field(default_factory=dict)
    seq_range: tuple[int, int | None] | None = None


JSON_CHUNK = 10_000
"""Records whose JSON lines one worker writes at a time."""


class Selector(Protocol):
    """A domain's way to name records on `replay`'s command line (e.g. `--group G`)."""

    def option(self) -> click.Option:
        """The click option; its values reach `select` one by one."""
        ...

    def select(self, log: EventLog, value: str, head: int) -> Selection:
        """The records one value of the option stands for as of `head`, the command's one
        read of it (bad values raise InputError)."""
        ...


class Marker(Protocol):
    """A domain's marks on records that no longer count, and the flag that hides them."""

    title: str
    """The table's mark column, e.g. "rolled back"."""
    hide_flag: str
    """e.g. "--effective"."""
    hide_help: str
    column: str
    """The key of a mark's fields that `export` writes as a `records` column."""

    def marks(
        self, log: EventLog, until_seq: int | None = None
    ) -> Callable[[int], Mark | None] | None:
        """The mark of the record at a seq (None when it counts), as the log's records up to
        `until_seq` (its head when None) mark it; None when no record is marked (then the
        table has no mark column)."""
        ...


class ReplayCommand(click.Command):
    """`replay` and the selectors and marker it was built with."""

    selectors: tuple[tuple[Selector, str], ...] = ()  # (selector, its option's name)
    marker: Marker | None = None


HIDE_MARKED = "hide_marked"


def make_replay(selectors: Sequence[Selector], marker: Marker | None = None) -> ReplayCommand:
    """`replay` with the selectors and marker a domain adds (the core command has none)."""
    command = copy.copy(replay)
    options = [selector.option() for selector in selectors]
    command.selectors = tuple(
        (selector, str(option.name)) for selector, option in zip(selectors, options, strict=True)
    )
    command.marker = marker
    if marker is not None:
        options.append(
            click.Option([marker.hide_flag, HIDE_MARKED], is_flag=True, help=marker.hide_help)
        )
    command.params = [*replay.params, *options]
    return command


@click.command(cls=ReplayCommand)
@click.argument("target")
@click.option(
    "--stream", "streams", multiple=True, metavar="STREAM", help="Only this stream (repeatable)."
)
@click.option(
    "--type", "types", multiple=True, metavar="TYPE", help="Only this event type (repeatable)."
)
@click.option(
    "--from-seq",
    type=number(min=1),
    default=1,
    show_default=True,
    metavar="SEQ",
    help="First seq to show.",
)
@click.option(
    "--until-seq", type=number(min=1), metavar="SEQ", help="Last seq to show (inclusive)."
)
@click.option(
    "--since",
    callback=time_option,
    metavar="TIME",
    help="Only records at or after this ISO-8601 time (UTC).",
)
@click.option(
    "--until",
    callback=time_option,
    metavar="TIME",
    help="Only records at or before this ISO-8601 time (UTC): the log as it was then.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option(
    "--allow-unknown",
    is_flag=True,
    help="Show records of unknown types or newer schemas raw instead of failing.",
)
@jobs_option(
    "With --json and no stream selected: processes that write the lines while this one "
    "prints them in seq order",
    JSON_CHUNK,
)
def replay(
    target: str,
    streams: tuple[str, ...],
    types: tuple[str, ...],
    from_seq: int,
    until_seq: int | None,
    since: int | None,
    until: int | None,
    as_json: bool,
    allow_unknown: bool,
    jobs: int | None,
    **extra: tuple[str, ...] | bool,
) -> None:
    """Print TARGET's records in seq order, filtered.

    \b
    --json prints one object per record with the keys
      seq, stream, version, event_id, type, recorded_at, data
    (recorded_at: ISO-8601 UTC with nanoseconds, e.g. 2026-11-29T12:00:00.123456789Z;
    data: the event's fields). With --allow-unknown an unreadable record has data = its raw
    payload, plus "unknown": true and "schema". A record rolled back by a restore also has
    "rolled_back": true and "rolled_back_by" (the seq of that restore's RestoreStarted).
    Time filters compare recorded_at and scan the seq range (time is not indexed).
    Output streams: memory stays flat however long the log. The lines are the same whatever
    --jobs is (on a damaged log the error is; the lines before it may be more with workers).
    """
    if jobs is not None and not as_json:
        raise CliUsageError("--jobs: only with --json (the table is printed by this process)")
    command = click.get_current_context().command
    selectors = command.selectors if isinstance(command, ReplayCommand) else ()
    marker = command.marker if isinstance(command, ReplayCommand) else None
    hide_marked = bool(extra.get(HIDE_MARKED, False))
    with open_log(target) as log:
        head = log.head()  # read once: a writer may append while the command runs
        _require_types(log, types)
        chosen = [
            (selector, value)
            for selector, name in selectors
            for value in extra[name]  # type: ignore[union-attr]
        ]
        low, high = from_seq, until_seq
        whole: set[str] = set(streams)
        single: dict[str, set[int]] = {}
        by_stream = bool(streams)
        for selector, value in chosen:
            found = selector.select(log, value, head)
            if found.seq_range is not None:
                low = max(low, found.seq_range[0])
                end = found.seq_range[1]
                if end is not None:
                    high = end if high is None else min(high, end)
            if found.streams or found.seqs:
                by_stream = True
                whole.update(found.streams)
                for stream, seqs in found.seqs.items():
                    single.setdefault(stream, set()).update(seqs)
        wanted = sorted(whole | set(single)) if by_stream else None
        check_seq("until_seq", high)  # the log is read as of its head, never past this
        last = head if high is None else min(high, head)
        if as_json and not by_stream:
            most, chunks = seq_chunks(log, low, last, JSON_CHUNK)
            ranges, asked = itertools.tee(chunks)  # the second runs ahead by what is in flight
            worker_count = jobs_for(most, jobs)
            vocabulary = portable_vocabulary()
            if worker_count > 1 and vocabulary is not None:
                options = _JsonOptions(
                    run_target(target),
                    head,
                    marker,
                    list(types),
                    since,
                    until,
                    hide_marked,
                    allow_unknown,
                )
                setup = functools.partial(_setup_worker, options)
                with (
                    seq_progress("replay", low, last) as advance,
                    Workers(worker_count, vocabulary, setup, _json_range) as workers,
                ):
                    _print_json_chunks(zip(ranges, workers.map(asked), strict=True), advance)
                return
        mark_of = marker.marks(log, head) if marker is not None else None  # (workers read theirs)
        rows = log.read_rows(low, last, wanted, list(types) or None)  # as of the head, as marked
        if single:
            rows = (r for r in rows if r[1] in whole or r[0] in single.get(r[1], ()))
        with seq_progress("replay", low, last) as advance:
            selected = _selected(rows, advance, since, until, mark_of, hide_marked)
            if as_json:
                _write_json(selected, allow_unknown)
                return
            printer = RecordLines(
                stdout_console(),
                seq_width=len(str(last)),
                mark_title=(
                    marker.title
                    if marker is not None and mark_of is not None and not hide_marked
                    else None
                ),
            )
            try:
                for row, mark in selected:
                    record = record_of_row(row)
                    printer.add(view_record(record, allow_unknown=allow_unknown, mark=mark))
            finally:
                printer.flush()
        if printer.printed == 0:
            stderr_console().print("no records match")


def _require_types(log: EventLog, types: Sequence[str]) -> None:
    """A --type no program here knows and no record has is a misspelling, not an empty
    answer ("no records match", exit 0, as for a group that is not in the log)."""
    known = event_types()
    for name in types:
        if name not in known and log.last_seq([name]) == 0:  # reads seqs only, no record
            raise CliUsageError(
                f"--type {name!r}: no event type of that name is known or in the log "
                f"({nearest(name, known)})",
                hint="a type defined by your code: import its module with --events-module",
            )


def _selected(
    rows: Iterator[RecordRow],
    advance: Callable[[int], None],
    since: int | None,
    until: int | None,
    mark_of: Callable[[int], Mark | None] | None,
    hide_marked: bool,
) -> Iterator[tuple[RecordRow, Mark | None]]:
    """The rows to show, each with its mark (None: unmarked), for the table and `--json`."""
    for row in rows:
        seq = row[0]
        advance(seq)
        recorded_at = row[6]
        if since is not None and recorded_at < since:
            continue
        if until is not None and recorded_at > until:
            continue
        mark = mark_of(seq) if mark_of is not None else None
        if mark is not None and hide_marked:
            continue
        yield row, mark


def _write_json(selected: Iterator[tuple[RecordRow, Mark | None]], allow_unknown: bool) -> None:
    """The rows as JSON lines on stdout, written in chunks of bytes."""
    out = sys.stdout
    binary = _binary(out)
    out.flush()
    json_lines(selected, allow_unknown, lambda chunk: _write(out, binary, chunk))


def json_lines(
    selected: Iterator[tuple[RecordRow, Mark | None]],
    allow_unknown: bool,
    flush: Callable[[bytearray], None],
) -> None:
    """The rows as JSON lines, handed to `flush` about _CHUNK_BYTES at a time (it empties
    the chunk). When a record fails, the lines before it are flushed and the error raised.

    A record that decodes and carries no mark is written by `write_json_line`: no Record,
    UUID, builtins, view or dict per record, which were two thirds of `replay --json`. Any
    other record takes `row_json`, the long way. The bytes are the same either way.
    """
    chunk = bytearray()
    decode = codec.decode
    line_start = 0
    try:
        for row, mark in selected:
            line_start = len(chunk)
            written = False
            if mark is None:
                seq, stream, version, event_id, type_name, schema, recorded_at, payload, _ = row
                try:
                    event = decode(type_name, schema, payload, seq=seq)
                except SchemaError:  # `row_json` shows it raw or raises, as allow_unknown says
                    event = None
                if event is not None:
                    head = JsonHead(
                        seq, stream, version, uuid_text(event_id), type_name, format_ns(recorded_at)
                    )
                    written = write_json_line(chunk, head, event)
            if not written:
                chunk += row_json(row, allow_unknown=allow_unknown, mark=mark)
                chunk += b"\n"
            if len(chunk) >= _CHUNK_BYTES:
                flush(chunk)
                line_start = 0
    except BaseException:
        del chunk[line_start:]  # the line of the record that failed, as far as it got
        raise
    finally:  # the lines before a record that fails are written, as they were
        flush(chunk)


def _binary(out: TextIO) -> BinaryIO | None:
    """Where JSON lines go as bytes: stdout's byte buffer, except on a terminal, where a
    progress bar may be live on the text stream (rich wraps it to clear the bar first; its
    byte buffer would write over it)."""
    return None if out.isatty() else getattr(out, "buffer", None)


@dataclass(frozen=True)
class _JsonOptions:
    """What a worker needs to write the lines of a seq range as this command would."""

    target: str
    head: int
    marker: Marker | None
    types: list[str]
    since: int | None
    until: int | None
    hide_marked: bool
    allow_unknown: bool


@dataclass(frozen=True)
class _JsonWorker:
    """A worker's own read-only connection and the marks as of the command's head."""

    log: EventLog
    options: _JsonOptions
    mark_of: Callable[[int], Mark | None] | None


def _setup_worker(options: _JsonOptions) -> _JsonWorker:
    log = open_log(options.target)
    marker = options.marker
    return _JsonWorker(log, options, marker.marks(log, options.head) if marker else None)


def _json_range(worker: _JsonWorker, seqs: tuple[int, int]) -> tuple[bytes, Carried | None]:
    """In a worker process: the lines of the records low..high, and the error that stopped
    them, if one did (the lines before it are printed first, as without workers)."""
    log, options = worker.log, worker.options
    parts: list[bytes] = []

    def keep(chunk: bytearray) -> None:
        parts.append(bytes(chunk))
        chunk.clear()

    rows = log.read_rows(*seqs, None, options.types or None)
    selected = _selected(
        rows, _no_progress, options.since, options.until, worker.mark_of, options.hide_marked
    )
    try:
        json_lines(selected, options.allow_unknown, keep)
    except Exception as exc:
        return b"".join(parts), Carried(exc)
    return b"".join(parts), None


def _no_progress(seq: int) -> None:
    """A worker shows no progress: the command's process advances a chunk at a time."""


def _print_json_chunks(
    chunks: Iterator[tuple[tuple[int, int], tuple[bytes, Carried | None]]],
    advance: Callable[[int], None],
) -> None:
    out = sys.stdout
    binary = _binary(out)
    out.flush()
    for (_, high), (lines, failed) in chunks:
        _print_bytes(out, binary, lines)
        if failed is not None:
            raise failed.rebuilt()
        advance(high)


_CHUNK_BYTES = 1 << 16
"""JSON lines are written this many bytes at a time (a write per line was a system call per
record where stdout is unbuffered)."""


def _write(out: TextIO, binary: BinaryIO | None, chunk: bytearray) -> None:
    _print_bytes(out, binary, chunk)
    chunk.clear()


def _print_bytes(out: TextIO, binary: BinaryIO | None, lines: bytes | bytearray) -> None:
    if binary is not None:
        binary.write(lines)
        binary.flush()
    else:  # a text stream without a byte buffer under it
        out.write(lines.decode())
        out.flush()
