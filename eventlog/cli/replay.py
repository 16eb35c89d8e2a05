"""`eventlog replay`: read the log back, filtered, as a table for people or JSON lines."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import click
import msgspec

from eventlog import codec
from eventlog.cli._common import (
    RecordLines,
    RecordView,
    json_line,
    json_object,
    open_log,
    seq_progress,
    stderr_console,
    stdout_console,
    time_option,
    view_record,
)
from eventlog.events import attempt_stream, group_stream
from eventlog.log import EventLog
from eventlog.records import Record


def group_streams(log: EventLog, group_id: str) -> list[str]:
    """A group's stream plus the attempt streams of every rollout id its events name.

    One read of the group's own (small) stream finds them; attempts are always named by a
    `rollout_id` field, so this does not depend on which events carry them.
    """
    stream = group_stream(group_id)
    rollout_ids: set[str] = set()
    for record in log.read_records(streams=[stream]):
        try:
            _collect_rollout_ids(codec.raw_fields(record.payload), rollout_ids)
        except msgspec.DecodeError:
            continue  # a corrupt payload: replay itself will report it
    return [stream, *(attempt_stream(rollout_id) for rollout_id in sorted(rollout_ids))]


def _collect_rollout_ids(value: object, found: set[str]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "rollout_id" and isinstance(item, str) and item:
                found.add(item)
            else:
                _collect_rollout_ids(item, found)
    elif isinstance(value, list):
        for item in value:
            _collect_rollout_ids(item, found)


@click.command()
@click.argument("target")
@click.option(
    "--stream", "streams", multiple=True, metavar="STREAM", help="Only this stream (repeatable)."
)
@click.option(
    "--group",
    "groups",
    multiple=True,
    metavar="G",
    help="Only prompt group G: stream group/G and the attempt streams of its rollout ids "
    "(repeatable).",
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
    groups: tuple[str, ...],
    types: tuple[str, ...],
    from_seq: int,
    until_seq: int | None,
    since: int | None,
    until: int | None,
    as_json: bool,
    allow_unknown: bool,
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
        if streams or groups:
            wanted = list(streams)
            for group_id in groups:
                wanted.extend(group_streams(log, group_id))
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
