"""`eventlog stats` with the rollout-recovery section: what recovery cost per agent and task,
and per step what was trained, how stale, what was thrown away and what restores cost."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from eventlog.cli.output import Justify, print_table, printable
from eventlog.cli.stats import make_stats
from eventlog.log import EventLog
from eventlog.recovery.cli.runlog import RunLog, audit_pass
from projections.audit import RECOVERY_TYPES
from projections.audit_stats import (
    AuditReport,
    AuditState,
    KeyReport,
    StepReport,
    report,
)


class RecoverySection:
    """Per agent and task: groups, attempts, retries, failures, reuse by restores, waste.

    Rolled-back records count as work done; what was kept follows the effective history.
    """

    key = "recovery"

    def __init__(self, log: EventLog) -> None:
        self._state: AuditState | None = None
        self._types: set[str] = set()

    def read(self, log: EventLog, head: int) -> None:
        """One pass in seq order, the controller stream read as of the same head; only the
        types the fold reads are decoded (the most frequent ones as views of the fields it
        reads), in `fold_rows`' one loop."""
        run = RunLog(log, until_seq=head)
        self._state = AuditState(skipped=run.skipped, step_ends=run.step_ends())
        audit_pass(log, self._state, head, "stats", seen=self._types)

    def report(self) -> AuditReport | None:
        if self._state is None or not RECOVERY_TYPES & self._types:
            return None
        return report(self._state)

    def print(self, console: Console, found: object) -> None:
        assert isinstance(found, AuditReport)
        print_recovery(console, found)


_COLUMNS: list[tuple[str, str]] = [
    ("groups", "groups"),
    ("finalized", "finalized"),
    ("dispatched", "dispatched"),
    ("started", "started"),
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
        names = (printable(r.agent_name or "-"), printable(r.task_name or "-"))
        table.add_row(*_row(names, r))
    table.add_row(*_row(("all", ""), recovery.total), style="bold")
    console.print(table)
    if recovery.by_step:
        console.print()
        console.print("per step (staleness: trained step - weight version, siblings)")
        print_table(console, _STEP_TABLE, map(_step_row, recovery.by_step))


_STEP_COLUMNS: list[tuple[str, str]] = [
    ("groups_trained", "groups trained"),
    ("siblings_trained", "siblings"),
    ("tokens_trained", "tokens trained"),
    ("tokens_thrown_away", "tokens thrown away"),
    ("retries", "retries"),
    ("failed", "failed"),
    ("restores", "restores"),
    ("rolled_back_records", "rolled back"),
    ("siblings_redispatched", "rerun by restore"),
    ("rows_cleared", "rows cleared"),
]


def _staleness(found: dict[int, int]) -> str:
    return " ".join(f"{lag}:{n}" for lag, n in found.items()) or "-"


_STEP_TABLE: list[tuple[str, Justify]] = [  # a row per step: print_table, not rich, lays it out
    ("step", "right"),
    *((title, "right") for _, title in _STEP_COLUMNS),
    ("staleness", "left"),
]


def _step_row(s: StepReport) -> list[str]:
    """One step's row of `_STEP_TABLE`."""
    return [
        str(s.step),
        *(f"{getattr(s, key):,}" for key, _ in _STEP_COLUMNS),
        _staleness(s.staleness),
    ]


stats = make_stats([RecoverySection])
