"""`eventlog tail`: the newest records, and with -f every record appended after them."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import click

from eventlog.cli.numbers import number
from eventlog.cli.output import json_line, stdout_console
from eventlog.cli.targets import open_log, sqlite_file
from eventlog.cli.views import RecordLines, json_object, view_decoded
from eventlog.errors import IntegrityError
from eventlog.log import EventLog
from eventlog.records import RecordedEvent


def _printer(as_json: bool) -> Callable[[RecordedEvent], None]:
    """Print each record at once (a follower must see it now, not at the end of a chunk)."""
    if as_json:
        out = sys.stdout

        def show_json(record: RecordedEvent) -> None:
            out.write(json_line(json_object(view_decoded(record))) + "\n")
            out.flush()

        return show_json
    lines = RecordLines(stdout_console(), seq_width=8, header=False, chunk=1)
    return lambda record: lines.add(view_decoded(record))


def _follow(
    log: EventLog,
    from_seq: int,
    show: Callable[[RecordedEvent], None],
    still_the_file: Callable[[int], None],
) -> None:
    """Print every record from `from_seq` on, forever.

    Synchronous on purpose: Ctrl-C then lands in this thread between two reads, with no
    worker thread or event loop left half-way (an asyncio follower logged a traceback when
    the interrupt raced a pending read).
    """
    next_seq = from_seq
    last: tuple[int, bytes] | None = None  # the seq and chain of the last record printed
    while True:
        head = log.head()
        still_the_file(next_seq - 1)
        if last is not None:
            _require_continued(log, head, *last)
        if head >= next_seq:
            for record in log.read(next_seq, head):
                show(record)
                last = (record.seq, record.chain)
            next_seq = head + 1
            continue
        log.wait_for_append(head, 0.5)


def _require_continued(log: EventLog, head: int, seq: int, chain: bytes) -> None:
    """The log still holds the last record printed, as printed: one replaced under the
    follower (a backup copied back over it, a new log at its path) would have its records
    printed after the other's, a history neither holds."""
    held = next(iter(log.read_rows(seq, seq)), None) if head >= seq else None
    if held is None or held[8] != chain:
        raise IntegrityError(
            f"seq {seq}: the log no longer holds the record printed as seq {seq} "
            f"(head now {head}): it was replaced or restored while followed",
            seq=seq,
        )


def _file_check(path: Path | None) -> Callable[[int], None]:
    """A check that `path` is still the file the follower opened. Its connection keeps the
    file it opened: a log deleted, or replaced by a rename (a new file at the path), would be
    followed forever with nothing more to print."""
    if path is None:  # a server's log has no file to lose
        return lambda _seq: None
    opened = os.stat(path)

    def still_the_file(seq: int) -> None:
        try:
            now = os.stat(path)
        except FileNotFoundError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino):
            what = "deleted" if now is None else "replaced by another file"
            raise IntegrityError(
                f"{path}: the log file followed was {what} (followed up to seq {seq}); "
                "follow the file at that path anew with `eventlog tail -f`",
                seq=seq,
            )

    return still_the_file


@click.command()
@click.argument("target")
@click.option(
    "-n",
    "--lines",
    "count",
    type=number(min=0),
    default=10,
    show_default=True,
    help="How many of the newest records to show first.",
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing records as they are appended.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line (as replay).")
def tail(target: str, count: int, follow: bool, as_json: bool) -> None:
    """Print TARGET's newest records; with -f, follow appends until interrupted (Ctrl-C).

    Following ends with exit 0 on Ctrl-C; a record this program cannot decode ends it with
    exit 3 (use `replay --allow-unknown` to see such records).
    """
    show = _printer(as_json)
    with open_log(target) as log:
        head = log.head()
        start = max(head - count + 1, 1)
        if not follow:
            for record in log.read(start, head):  # not what is appended meanwhile
                show(record)
            return
        still_the_file = _file_check(sqlite_file(target))  # the file open_log opened
        try:
            _follow(log, start, show, still_the_file)
        except KeyboardInterrupt:
            return  # following ends when the person stops it: that is success
