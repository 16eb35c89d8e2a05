"""`eventlog stats`: how many records of each type and in each kind of stream."""

from __future__ import annotations

from collections import Counter

import click
from rich.table import Table

from eventlog.cli._common import format_ns, json_line, open_log, seq_progress, stdout_console


def stream_prefix(stream: str) -> str:
    """The kind of a stream: `group/g1` -> `group`; a stream without `/` is its own kind."""
    return stream.split("/", 1)[0]


@click.command()
@click.argument("target")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def stats(target: str, as_json: bool) -> None:
    """Count TARGET's records per event type and per stream prefix (one pass, bounded memory)."""
    by_type: Counter[str] = Counter()
    by_prefix: Counter[str] = Counter()
    first_ns = last_ns = None
    with open_log(target) as log:
        head = log.head()
        with seq_progress("stats", 1, head) as advance:
            for record in log.read_records():
                advance(record.seq)
                by_type[record.type] += 1
                by_prefix[stream_prefix(record.stream)] += 1
                if first_ns is None:
                    first_ns = record.recorded_at
                last_ns = record.recorded_at
    total = sum(by_type.values())
    if as_json:
        click.echo(
            json_line(
                {
                    "records": total,
                    "head": head,
                    "first_recorded_at": None if first_ns is None else format_ns(first_ns),
                    "last_recorded_at": None if last_ns is None else format_ns(last_ns),
                    "types": dict(by_type.most_common()),
                    "stream_prefixes": dict(by_prefix.most_common()),
                }
            )
        )
        return
    console = stdout_console()
    console.print(f"records: {total}, head seq {head}")
    if first_ns is not None and last_ns is not None:
        console.print(f"from {format_ns(first_ns)} to {format_ns(last_ns)}")
    for title, counts in (("type", by_type), ("stream prefix", by_prefix)):
        table = Table(title=None, box=None, pad_edge=False)
        table.add_column(title)
        table.add_column("records", justify="right")
        table.add_column("share", justify="right")
        for name, n in counts.most_common():
            table.add_row(name, str(n), f"{100 * n / total:.1f}%")
        console.print()
        console.print(table)
