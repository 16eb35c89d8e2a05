"""`eventlog stats`: how many records of each type and in each kind of stream, plus the
sections a domain adds (rollout recovery adds what recovery cost per agent and task)."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import click
import msgspec
from rich.console import Console
from rich.table import Table

from eventlog.cli.output import json_line, seq_progress, stdout_console
from eventlog.cli.targets import open_log
from eventlog.cli.times import format_ns
from eventlog.log import EventLog
from eventlog.records import Record


def stream_prefix(stream: str) -> str:
    """The kind of a stream: `group/g1` -> `group`; a stream without `/` is its own kind."""
    return stream.split("/", 1)[0]


class StatsSection(Protocol):
    """A domain's section of `stats`: fed every record in the same pass, reported after."""

    key: str  # its key in --json output

    def add(self, record: Record) -> None: ...

    def report(self) -> object | None:
        """What to show (a msgspec Struct or builtins), or None when the log has nothing."""
        ...

    def print(self, console: Console, found: object) -> None: ...


SectionFactory = Callable[[EventLog], StatsSection]


class StatsCommand(click.Command):
    """`stats` and the sections it was built with."""

    sections: tuple[SectionFactory, ...] = ()


def make_stats(sections: Sequence[SectionFactory]) -> StatsCommand:
    """`stats` with the sections a domain adds (the core command has none)."""
    command = copy.copy(stats)
    command.sections = tuple(sections)
    return command


@click.command(cls=StatsCommand)
@click.argument("target")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def stats(target: str, as_json: bool) -> None:
    """Count TARGET's records per event type and per stream prefix (one pass, bounded memory).

    \b
    When the log holds rollout-recovery events (GroupReserved), also per agent and task:
    groups, attempts dispatched and started, retries, failures, abandoned attempts, stale
    results rejected, siblings reused and attempts redispatched by restores, staged rows and
    tokens (kept by a seal, discarded, still open) and generation latency (GenerationStarted
    to GenerationFinished); and per step (a step ends at its training or its checkpoint):
    groups and siblings trained, staleness (trained step - weight version), tokens trained
    and thrown away, retries, failures and what restores cost. Rolled-back records count as
    work done; what was kept follows the effective history. --json adds these under
    "recovery".
    """
    command = click.get_current_context().command
    factories = command.sections if isinstance(command, StatsCommand) else ()
    by_type: Counter[str] = Counter()
    by_prefix: Counter[str] = Counter()
    first_ns = last_ns = None
    with open_log(target) as log:
        head = log.head()
        sections = [factory(log) for factory in factories]
        with seq_progress("stats", 1, head) as advance:
            for record in log.read_records():
                advance(record.seq)
                by_type[record.type] += 1
                by_prefix[stream_prefix(record.stream)] += 1
                if first_ns is None:
                    first_ns = record.recorded_at
                last_ns = record.recorded_at
                for section in sections:
                    section.add(record)
    total = sum(by_type.values())
    found = [(section, section.report()) for section in sections]
    if as_json:
        out: dict[str, Any] = {
            "records": total,
            "head": head,
            "first_recorded_at": None if first_ns is None else format_ns(first_ns),
            "last_recorded_at": None if last_ns is None else format_ns(last_ns),
            "types": dict(by_type.most_common()),
            "stream_prefixes": dict(by_prefix.most_common()),
        }
        out |= {s.key: msgspec.to_builtins(r) for s, r in found if r is not None}
        click.echo(json_line(out))
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
    for section, report in found:
        if report is not None:
            section.print(console, report)
