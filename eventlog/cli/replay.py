"""`eventlog replay`: read the log back, filtered, as a table for people or JSON lines."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import click

from eventlog.cli.output import json_line, seq_progress, stderr_console, stdout_console
from eventlog.cli.targets import open_log
from eventlog.cli.times import time_option
from eventlog.cli.views import RecordLines, RecordView, json_object, view_record
from eventlog.log import EventLog
from eventlog.records import Record


class StreamSelector(Protocol):
    """A domain's way to name streams on `replay`'s command line (e.g. `--group G`)."""

    def option(self) -> click.Option:
        """The click option; its values reach `streams` one by one."""
        ...

    def streams(self, log: EventLog, value: str) -> list[str]:
        """The streams one value of the option stands for."""
        ...


class ReplayCommand(click.Command):
    """`replay` and the stream selectors it was built with."""

    selectors: tuple[tuple[StreamSelector, str], ...] = ()  # (selector, its option's name)


def make_replay(selectors: Sequence[StreamSelector]) -> ReplayCommand:
    """`replay` with the stream selectors a domain adds (the core command has none)."""
    command = copy.copy(replay)
    options = [selector.option() for selector in selectors]
    command.selectors = tuple(
        (selector, str(option.name)) for selector, option in zip(selectors, options, strict=True)
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
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    metavar="SEQ",
    help="First seq to show.",
)
@click.option(
    "--until-seq", type=click.IntRange(min=1), metavar="SEQ", help="Last seq to show (inclusive)."
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
    **selected: tuple[str, ...],
) -> None:
    """Print TARGET's records in seq order, filtered.

    \b
    --json prints one object per record with the keys
      seq, stream, version, event_id, type, recorded_at, data
    (recorded_at: ISO-8601 UTC with nanoseconds, e.g. 2026-11-29T12:00:00.123456789Z;
    data: the event's fields). With --allow-unknown an unreadable record has data = its raw
    payload, plus "unknown": true and "schema".
    Time filters compare recorded_at and scan the seq range (time is not indexed).
    """
    with open_log(target) as log:
        wanted: list[str] | None = None
        command = click.get_current_context().command
        selectors = command.selectors if isinstance(command, ReplayCommand) else ()
        chosen = [(selector, value) for selector, name in selectors for value in selected[name]]
        if streams or chosen:
            wanted = list(streams)
            for selector, value in chosen:
                wanted.extend(selector.streams(log, value))
            wanted = list(dict.fromkeys(wanted))
        head = log.head()
        last = head if until_seq is None else min(until_seq, head)
        records = log.read_records(from_seq, until_seq, wanted, list(types) or None)
        with seq_progress("replay", from_seq, last) as advance:
            views = _views(records, advance, since, until, allow_unknown)
            if as_json:
                out = sys.stdout
                for view in views:
                    out.write(json_line(json_object(view)) + "\n")
                return
            printer = RecordLines(stdout_console(), seq_width=len(str(last)))
            try:
                for view in views:
                    printer.add(view)
            finally:
                printer.flush()
        if printer.printed == 0:
            stderr_console().print("no records match")


def _views(
    records: Iterator[Record],
    advance: Callable[[int], None],
    since: int | None,
    until: int | None,
    allow_unknown: bool,
) -> Iterator[RecordView]:
    for record in records:
        advance(record.seq)
        if since is not None and record.recorded_at < since:
            continue
        if until is not None and record.recorded_at > until:
            continue
        yield view_record(record, allow_unknown=allow_unknown)
