"""`eventlog stats` with the rollout-recovery section: what recovery cost per agent and task."""

from __future__ import annotations

import msgspec
from rich.console import Console
from rich.table import Table

from eventlog import codec
from eventlog.cli.stats import make_stats
from eventlog.errors import SchemaError
from eventlog.events import Event
from eventlog.log import EventLog
from eventlog.records import Record
from eventlog.recovery.vocabulary import CONTROLLER_STREAM
from projections.audit import AUDIT_TYPES, RECOVERY_TYPES
from projections.audit_stats import AuditReport, AuditState, KeyReport, fold_audit, report
from projections.history import RolledBack, rolled_back


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


class RecoverySection:
    """Per agent and task: groups, attempts, retries, failures, reuse by restores, waste.

    Rolled-back records count as work done; what was kept follows the effective history.
    """

    key = "recovery"

    def __init__(self, log: EventLog) -> None:
        self._state = AuditState(skipped=_rolled_back(log))
        self._types: set[str] = set()

    def add(self, record: Record) -> None:
        self._types.add(record.type)
        if record.type in AUDIT_TYPES:
            decoded = _decoded(record)
            if decoded is not None:
                fold_audit(self._state, decoded)

    def report(self) -> AuditReport | None:
        return report(self._state) if RECOVERY_TYPES & self._types else None

    def print(self, console: Console, found: object) -> None:
        assert isinstance(found, AuditReport)
        print_recovery(console, found)


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


stats = make_stats([RecoverySection])
