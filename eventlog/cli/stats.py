"""`eventlog stats`: how many records of each type and in each kind of stream, and, when the
log holds rollout-recovery events, what recovery cost per agent and task."""

from __future__ import annotations

from collections import Counter
from typing import Any

import click
import msgspec
from rich.console import Console
from rich.table import Table

from eventlog import codec
from eventlog.cli._common import format_ns, json_line, open_log, seq_progress, stdout_console
from eventlog.errors import SchemaError
from eventlog.events import CONTROLLER_STREAM, Event
from eventlog.log import EventLog
from eventlog.records import Record
from projections.audit import (
    AUDIT_TYPES,
    RECOVERY_TYPES,
    AuditReport,
    AuditState,
    KeyReport,
    fold_audit,
    report,
)
from projections.history import RolledBack, rolled_back


def stream_prefix(stream: str) -> str:
    """The kind of a stream: `group/g1` -> `group`; a stream without `/` is its own kind."""
    return stream.split("/", 1)[0]


class _Decoded(msgspec.Struct, frozen=True):
    """A record with its event, for the audit fold."""

    seq: int
    stream: str
    recorded_at: int
    event: Event


def _decoded(record: Record) -> _Decoded | None:
    try:
        event = codec.decode(record.type, record.schema, record.payload, seq=record.seq)
    except SchemaError:
        return None  # an unknown type or a newer schema: counted above, not audited
    return _Decoded(record.seq, record.stream, record.recorded_at, event)


def _rolled_back(log: EventLog) -> RolledBack:
    """The rolled-back ranges, from the controller stream's decodable records."""
    controller = (_decoded(r) for r in log.read_records(streams=[CONTROLLER_STREAM]))
    return rolled_back(r for r in controller if r is not None)


@click.command()
@click.argument("target")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def stats(target: str, as_json: bool) -> None:
    """Count TARGET's records per event type and per stream prefix (one pass, bounded memory).

    \b
    When the log holds rollout-recovery events (GroupReserved), also per agent and task:
    groups, attempts dispatched, retries, failures, abandoned attempts, stale results
    rejected, siblings reused and attempts redispatched by restores, staged rows and tokens
    (kept by a seal, discarded, still open) and generation latency (GenerationStarted to
    GenerationFinished). Rolled-back records count as work done; what was kept follows the
    effective history. --json adds these under "recovery".
    """
    by_type: Counter[str] = Counter()
    by_prefix: Counter[str] = Counter()
    first_ns = last_ns = None
    with open_log(target) as log:
        head = log.head()
        audit_state = AuditState(skipped=_rolled_back(log))
        with seq_progress("stats", 1, head) as advance:
            for record in log.read_records():
                advance(record.seq)
                by_type[record.type] += 1
                by_prefix[stream_prefix(record.stream)] += 1
                if first_ns is None:
                    first_ns = record.recorded_at
                last_ns = record.recorded_at
                if record.type in AUDIT_TYPES:
                    decoded = _decoded(record)
                    if decoded is not None:
                        fold_audit(audit_state, decoded)
    total = sum(by_type.values())
    recovery = report(audit_state) if RECOVERY_TYPES & by_type.keys() else None
    if as_json:
        out: dict[str, Any] = {
            "records": total,
            "head": head,
            "first_recorded_at": None if first_ns is None else format_ns(first_ns),
            "last_recorded_at": None if last_ns is None else format_ns(last_ns),
            "types": dict(by_type.most_common()),
            "stream_prefixes": dict(by_prefix.most_common()),
        }
        if recovery is not None:
            out["recovery"] = msgspec.to_builtins(recovery)
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
    if recovery is not None:
        print_recovery(console, recovery)


_COLUMNS: list[tuple[str, str]] = [
    ("groups", "groups"),
    ("finalized", "finalized"),
    ("attempts", "attempts"),
    ("retries", "retries"),
    ("failed", "failed"),
    ("abandoned", "abandoned"),
    ("stale_rejected", "stale rejected"),
    ("reused_after_restore", "reused by restore"),
    ("redispatched_after_restore", "rerun by restore"),
    ("rows_staged", "rows staged"),
    ("rows_discarded", "rows discarded"),
    ("tokens_discarded", "tokens discarded"),
]


def _row(name: tuple[str, str], r: KeyReport) -> list[str]:
    cells = [name[0], name[1]]
    cells += [f"{getattr(r, key):,}" for key, _ in _COLUMNS]
    share = r.tokens_discarded / r.tokens_staged if r.tokens_staged else None
    cells.append("-" if share is None else f"{100 * share:.1f}%")
    latency = r.generation_latency
    cells.append("-" if latency.p50_ms is None else f"{latency.p50_ms:,.1f}")
    cells.append("-" if latency.p90_ms is None else f"{latency.p90_ms:,.1f}")
    return cells


def print_recovery(console: Console, recovery: AuditReport) -> None:
    """The per-agent/task recovery table."""
    console.print()
    console.print(
        f"rollout recovery: {recovery.restores} restore(s), {recovery.checkpoints} "
        f"checkpoint(s), {recovery.rolled_back_records} rolled-back record(s)"
    )
    table = Table(title=None, box=None, pad_edge=False)
    table.add_column("agent")
    table.add_column("task")
    for _, title in _COLUMNS:
        table.add_column(title, justify="right")
    table.add_column("tokens discarded %", justify="right")
    table.add_column("gen p50 ms", justify="right")
    table.add_column("gen p90 ms", justify="right")
    for r in recovery.by_agent_task:
        table.add_row(*_row((r.agent_name or "-", r.task_name or "-"), r))
    table.add_row(*_row(("all", ""), recovery.total), style="bold")
    console.print(table)
