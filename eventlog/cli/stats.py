"""`eventlog stats`: how many records of each type and in each kind of stream, plus the
sections a domain adds (rollout recovery adds what recovery cost per agent and task)."""

from __future__ import annotations

import copy
import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import click
import msgspec
from rich.console import Console
from rich.table import Table

from eventlog.cli.output import json_line, printable, stdout_console
from eventlog.cli.targets import open_log
from eventlog.cli.times import format_ns
from eventlog.log import EventLog


def _counted(counts: list[tuple[str, str, int, int]]) -> tuple[Counter[str], Counter[str]]:
    """Records per type and per stream prefix from the database's counts, each in the order
    a pass in seq order would first meet them (ties keep that order, as `most_common` does)."""
    by_type: Counter[str] = Counter()
    by_prefix: Counter[str] = Counter()
    first_type: dict[str, int] = {}
    first_prefix: dict[str, int] = {}
    for type_name, prefix, _, first in counts:
        first_type[type_name] = min(first, first_type.get(type_name, first))
        first_prefix[prefix] = min(first, first_prefix.get(prefix, first))
    for type_name in sorted(first_type, key=first_type.__getitem__):
        by_type[type_name] = 0
    for prefix in sorted(first_prefix, key=first_prefix.__getitem__):
        by_prefix[prefix] = 0
    for type_name, prefix, n, _ in counts:
        by_type[type_name] += n
        by_prefix[prefix] += n
    return by_type, by_prefix


class StatsSection(Protocol):
    """A domain's section of `stats`: reads what it needs of the log, reported after."""

    key: str  # its key in --json output

    def read(self, log: EventLog, head: int) -> None:
        """Read the records up to `head` it needs (one pass, bounded memory)."""
        ...

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
    """Count TARGET's records per event type and per stream prefix (bounded memory).

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
    with open_log(target) as log, ThreadPoolExecutor(1, "stats-counts") as beside:
        head = log.head()
        # The counts are one aggregate query, spent inside the database's C code with the
        # GIL released: it runs on its own read connection while the sections' pass runs.
        counting = beside.submit(log.counts, head)
        first_ns: int | None = None
        last_ns: int | None = None
        try:
            for _, _, _, _, _, _, at, _, _ in itertools.islice(log.read_rows(1, head), 1):
                first_ns = at
            for _, _, _, _, _, _, at, _, _ in log.read_rows(head, head):
                last_ns = at
            sections = [factory(log) for factory in factories]
            for section in sections:
                section.read(log, head)
        except BaseException:
            failed = counting.exception()  # the counts' error first, as when they ran first
            if failed is not None:
                raise failed from None
            raise
        by_type, by_prefix = _counted(counting.result())
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
            table.add_row(printable(name), str(n), f"{100 * n / total:.1f}%")
        console.print()
        console.print(table)
    for section, report in found:
        if report is not None:
            section.print(console, report)
