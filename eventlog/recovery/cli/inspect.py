"""`eventlog inspect group TARGET G`: the whole history of one prompt group, in seq order.

The group's own stream plus the attempt streams of every rollout id it named, merged by seq;
records a restore rolled back are marked (they stay in the log, and no rebuild counts them).
Above the timeline, one line per attempt: the ledger's verdict and what its worker did.
"""

from __future__ import annotations

from typing import Any

import click
import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

from eventlog import codec
from eventlog.cli.exits import CliUsageError
from eventlog.cli.output import json_line, stdout_console
from eventlog.cli.targets import open_log, shown_target
from eventlog.cli.times import short_time
from eventlog.cli.views import json_object, summary, view_decoded
from eventlog.log import EventLog
from eventlog.records import RecordedEvent
from eventlog.recovery.cli.runlog import RunLog, about_group
from eventlog.recovery.vocabulary import group_stream
from projections.audit_group import GroupSummary, TimelineEntry, group_timeline, summarize_group


@click.group()
def inspect() -> None:
    """Look closely at one thing in a log."""


def load_group(
    log: EventLog, group_id: str
) -> tuple[list[TimelineEntry], dict[int, RecordedEvent]]:
    """The group's records and its attempts' records, by seq, rolled-back ones marked (and
    the records themselves by seq, for their envelopes)."""
    if log.stream_version(group_stream(group_id)) is None:
        raise CliUsageError(
            f"group {group_id!r}: the log has no stream {group_stream(group_id)!r}",
            hint="`eventlog stats TARGET` counts the groups; `eventlog replay TARGET --type "
            "GroupReserved --json` lists their ids",
        )
    run = RunLog(log)
    records = {rec.seq: rec for rec in about_group(log, group_id, run)}
    return group_timeline(records.values(), run.skipped), records


def _fields(entry: TimelineEntry, group_id: str) -> dict[str, Any]:
    data = codec.to_builtins(entry.event)
    if data.get("group_id") == group_id:
        del data["group_id"]  # the header names the group once
    return data


def _header(info: GroupSummary) -> str:
    parts = [
        f"group {info.group_id}",
        f"agent {info.agent_name or '-'}",
        f"task {info.task_name or '-'}",
        f"granularity {info.granularity or '?'}",
        f"{info.expected_generations or '?'} siblings",
        info.fate,
    ]
    return " · ".join(parts)


def _ms(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:,.1f}"


@inspect.command("group")
@click.argument("target")
@click.argument("group_id", metavar="G")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def group(target: str, group_id: str, as_json: bool) -> None:
    """Timeline of prompt group G in TARGET: its stream and its attempts' streams, by seq.

    \b
    --json prints one object: "group" (the summary: agent, task, granularity, fate, and
    every attempt with its verdict, worker status, staged rows and tokens, reward, latency)
    and "timeline" (records as `replay --json` prints them, plus "rolled_back").
    """
    with open_log(target) as log:
        timeline, records = load_group(log, group_id)
    info = summarize_group(group_id, timeline)
    if as_json:
        click.echo(
            json_line(
                {
                    "target": shown_target(target),
                    "group": msgspec.to_builtins(info),
                    "timeline": [
                        {**json_object(view_decoded(records[e.seq])), "rolled_back": e.rolled_back}
                        for e in timeline
                    ],
                }
            )
        )
        return
    console = stdout_console()
    console.print(_header(info), style="bold")
    rolled = (
        f", {info.rolled_back_records} rolled back by a restore" if info.rolled_back_records else ""
    )
    console.print(f"{info.records} records{rolled}")

    attempts = Table(box=None, pad_edge=False)
    for name in _ATTEMPT_COLUMNS:
        attempts.add_column(name, justify="left" if name in _LEFT else "right")
    for a in info.attempts:
        attempts.add_row(
            str(a.generation_index),
            str(a.attempt),
            a.rollout_id,
            a.verdict,
            a.worker,
            str(a.rows_staged),
            str(a.tokens_staged),
            "-" if a.reward is None else f"{a.reward:g}",
            _ms(a.latency_ns),
            str(a.stale_rejections) if a.stale_rejections else "",
        )
    console.print()
    console.print("attempts", style="bold")
    console.print(attempts)
    console.print()
    console.print("timeline", style="bold")
    print_timeline(console, timeline, group_id)


_ATTEMPT_COLUMNS = (
    "sibling",
    "attempt",
    "rollout id",
    "verdict",
    "worker",
    "rows",
    "tokens",
    "reward",
    "latency ms",
    "late results",
)
_LEFT = ("rollout id", "verdict", "worker")
ROLLED_BACK = "rolled back"


def print_timeline(console: Console, timeline: list[TimelineEntry], group_id: str) -> None:
    """One line per record: aligned, never padded; cut to the screen only on a terminal."""
    seq_width = max([3, *(len(str(e.seq)) for e in timeline)])
    stream_width = max([6, *(len(e.stream) for e in timeline)])
    type_width = max([4, *(len(type(e.event).__name__) for e in timeline)])
    mark_width = len(ROLLED_BACK) if any(e.rolled_back for e in timeline) else 0

    def cells(seq: str, time: str, mark: str, stream: str, kind: str, fields: str) -> str:
        marked = f"{mark:<{mark_width}}  " if mark_width else ""
        return (
            f"{seq:>{seq_width}}  {time:<23}  {marked}{stream:<{stream_width}}  "
            f"{kind:<{type_width}}  {fields}"
        ).rstrip()

    header = cells("seq", "time (UTC)", "", "stream", "type", "fields")
    rows = [
        (
            cells(
                str(e.seq),
                short_time(e.recorded_at),
                ROLLED_BACK if e.rolled_back else "",
                e.stream,
                type(e.event).__name__,
                summary(_fields(e, group_id)),
            ),
            e.rolled_back,
        )
        for e in timeline
    ]
    if not console.is_terminal:
        console.file.write("\n".join([header, *(text for text, _ in rows)]) + "\n")
        console.file.flush()
        return
    console.print(Text(header, style="bold"), no_wrap=True, overflow="ellipsis", crop=True)
    for text, rolled in rows:
        console.print(
            Text(text, style="dim" if rolled else ""), no_wrap=True, overflow="ellipsis", crop=True
        )
