"""What `eventlog demo` shows while it runs: per-step progress folded from the log.

The board folds the records with the same projection the ledger uses and goes back to the
state saved at a checkpoint when a restore rolls back, so what it shows is what the log
says, not what the controller claims. On a terminal it is a live table; elsewhere (CI,
a pipe) it prints one plain line per notable event.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from eventlog.records import RecordedEvent
from eventlog.recovery.vocabulary import (
    AttemptFailed,
    CheckpointCommitted,
    GroupAbandoned,
    ReplayConsumed,
    RestoreCompleted,
    RestoreStarted,
    StaleResultRejected,
)
from eventlog.rollout.settings import LoopSettings
from projections.siblings import LedgerState, RuleViolation, fold

BAR_WIDTH = 16


class StepBoard:
    """Per step: groups finalized and siblings sealed, as the log says right now."""

    def __init__(self, settings: LoopSettings) -> None:
        self.settings = settings
        self.state = LedgerState()
        self.trained: dict[int, int] = {}
        self.checkpoints: dict[int, int] = {}
        """Checkpoint seq by step, for the checkpoints in force."""
        self._saved: dict[int, tuple[LedgerState, dict[int, int], dict[int, int]]] = {}
        self.records = 0

    def apply(self, record: RecordedEvent) -> None:
        self.records += 1
        event = record.event
        if isinstance(event, RestoreStarted):
            saved = self._saved.get(event.checkpoint_seq)
            if saved is not None:
                self.state, self.trained = saved[0].copy(), dict(saved[1])
                self.checkpoints = dict(saved[2])
        # A record the fold refuses is shown as the log has it; the demo's checks report it.
        with contextlib.suppress(RuleViolation):
            fold(self.state, event)
        if isinstance(event, ReplayConsumed):
            self.trained[event.step] = self.trained.get(event.step, 0) + len(event.group_ids)
        elif isinstance(event, CheckpointCommitted):
            self.checkpoints[event.step] = record.seq
            self._saved[record.seq] = (
                self.state.copy(),
                dict(self.trained),
                dict(self.checkpoints),
            )

    def rows(self) -> list[tuple[int, int, int, int, str]]:
        """(step, groups finalized, siblings sealed, siblings in all, state) per step."""
        n, k = self.settings.siblings, self.settings.groups_per_step
        rows = []
        for step in range(1, self.settings.steps + 1):
            live = [g for g in self.state.groups.values() if g.target_step == step]
            ready = [e for e in self.state.replay.values() if e.target_step == step]
            trained = self.trained.get(step, 0)
            finalized = len(ready) + trained
            sealed = sum(len(g.indices("sealed")) for g in live) + n * finalized
            if trained:
                state = "trained"
                if step in self.checkpoints:
                    state += f", checkpoint at seq {self.checkpoints[step]}"
            elif live or ready:
                state = "generating"
            else:
                state = "waiting"
            rows.append((step, finalized, sealed, n * k, state))
        return rows


def notable(record: RecordedEvent) -> str | None:
    """A one-line description of the records worth a line of their own."""
    event = record.event
    if isinstance(event, CheckpointCommitted):
        return (
            f"checkpoint step {event.step} at seq {record.seq} "
            f"({event.group_count} groups in flight, {event.row_count} data-plane rows)"
        )
    if isinstance(event, ReplayConsumed):
        return f"step {event.step} trained on {len(event.group_ids)} groups"
    if isinstance(event, AttemptFailed):
        return f"attempt {event.rollout_id} failed: {event.error.split(':')[0]}"
    if isinstance(event, GroupAbandoned):
        return f"group {event.group_id} (prompt_group) abandoned whole: every sibling reruns"
    if isinstance(event, StaleResultRejected):
        return f"late result of {event.rollout_id} rejected (now {event.current_rollout_id})"
    if isinstance(event, RestoreCompleted):
        return (
            f"restored checkpoint step {event.checkpoint_step}: rolled back seqs "
            f"{event.rolled_back_from_seq}..{event.rolled_back_until_seq}; "
            f"{event.siblings_reused} siblings reused, {event.siblings_redispatched} "
            f"redispatched, {event.rows_cleared} rows cleared"
        )
    return None


class DemoView:
    """The observer the command line gives the runner: live table or plain lines."""

    def __init__(self, settings: LoopSettings, console: Console, *, live: bool) -> None:
        self.board = StepBoard(settings)
        self.console = console
        self.started = time.monotonic()
        self.phase_text = "starting"
        self.recent: deque[str] = deque(maxlen=6)
        self._live = (
            Live(
                get_renderable=self._render,
                console=console,
                refresh_per_second=8,
                transient=False,
            )
            if live
            else None
        )

    def __enter__(self) -> DemoView:
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()

    def _say(self, message: str) -> None:
        line = f"[{time.monotonic() - self.started:6.1f}s] {message}"
        if self._live is None:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            self.recent.append(line)

    def phase(self, message: str) -> None:
        self.phase_text = message
        self._say(message)

    def record(self, record: RecordedEvent) -> None:
        self.board.apply(record)
        message = notable(record)
        if message is not None:
            self._say(message)

    def _render(self) -> RenderableType:
        table = Table(box=None, pad_edge=False, header_style="bold")
        table.add_column("step", justify="right")
        table.add_column("groups", justify="right")
        table.add_column("siblings sealed")
        table.add_column("state")
        for step, finalized, sealed, total, state in self.board.rows():
            filled = round(BAR_WIDTH * sealed / total) if total else 0
            bar = Text("█" * filled, style="green") + Text("░" * (BAR_WIDTH - filled))
            k = self.board.settings.groups_per_step
            table.add_row(str(step), f"{finalized}/{k}", bar + f" {sealed}/{total}", state)
        header = Text(
            f"{self.phase_text}  ·  {self.board.records} records  ·  "
            f"{time.monotonic() - self.started:.0f} s",
            style="bold",
        )
        return Group(header, table, Text("\n".join(self.recent), style="dim"))
