"""`eventlog tail`: the newest records, and with -f every record appended after them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import click
from rich.console import Console
from rich.text import Text

from eventlog import codec
from eventlog.cli._common import (
    format_ns,
    json_line,
    open_log,
    short_time,
    stdout_console,
    summary,
)
from eventlog.log import EventLog
from eventlog.records import RecordedEvent


def _printer(as_json: bool, console: Console) -> Callable[[RecordedEvent], None]:
    def show_json(record: RecordedEvent) -> None:
        click.echo(
            json_line(
                {
                    "seq": record.seq,
                    "stream": record.stream,
                    "version": record.version,
                    "event_id": str(record.event_id),
                    "type": record.type,
                    "recorded_at": format_ns(record.recorded_at),
                    "data": codec.to_builtins(record.event),
                }
            )
        )

    def show_line(record: RecordedEvent) -> None:
        line = Text.assemble(
            (f"{record.seq:>8} ", "bold"),
            f"{short_time(record.recorded_at)} ",
            (record.stream, "green"),
            f" v{record.version} ",
            (record.type, "cyan"),
            " ",
            summary(codec.to_builtins(record.event)),
        )
        console.print(line, no_wrap=True, overflow="ellipsis", crop=True)

    return show_json if as_json else show_line


async def _follow(log: EventLog, from_seq: int, show: Callable[[RecordedEvent], None]) -> None:
    async for record in log.subscribe(from_seq=from_seq, poll_interval=0.5):
        show(record)


@click.command()
@click.argument("target")
@click.option(
    "-n",
    "--lines",
    "count",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="How many of the newest records to show first.",
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing records as they are appended.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line (as replay).")
def tail(target: str, count: int, follow: bool, as_json: bool) -> None:
    """Print TARGET's newest records; with -f, follow appends until interrupted (Ctrl-C)."""
    show = _printer(as_json, stdout_console())
    with open_log(target) as log:
        start = max(log.head() - count + 1, 1)
        if not follow:
            for record in log.read(start):
                show(record)
            return
        try:
            asyncio.run(_follow(log, start, show))
        except KeyboardInterrupt:
            return  # following ends when the person stops it: that is success
