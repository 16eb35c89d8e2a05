"""`eventlog state TARGET --at SEQ|--step N|--checkpoint N`: the ledger as a restore would
rebuild it at that point.

The state is `eventlog.recovery.checkpoint.fold_from_snapshot`'s (the fold the ledger and the
restore use, from the newest usable snapshot), with the records rolled back *as of that point*
skipped: later restores do not exist yet there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import click
import msgspec

from eventlog.cli.exits import CliUsageError
from eventlog.cli.numbers import number
from eventlog.cli.output import json_line, printable, shown_ids, stdout_console
from eventlog.cli.targets import open_log, shown_target
from eventlog.log import EventLog
from eventlog.recovery.checkpoint import fold_from_snapshot
from eventlog.recovery.cli.runlog import RunLog, point_seq
from projections.reconcile import referenced_keys
from projections.siblings import LedgerState, RuleViolation, state_digest


def state_at(log: EventLog, seq: int) -> LedgerState:
    """The effective ledger state at `seq`, as a restore to that point would see it."""
    run = RunLog(log, until_seq=seq)
    return fold_from_snapshot(log, seq, run.skipped).state


class SiblingRow(msgspec.Struct, frozen=True, kw_only=True):
    generation_index: int
    rollout_id: str
    attempt: int
    status: str
    staging_keys: list[str]


class GroupRow(msgspec.Struct, frozen=True, kw_only=True):
    group_id: str
    status: str
    phase: str
    target_step: int | None
    sealed: int
    missing: int
    siblings: list[SiblingRow]


class StateView(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    digest: str
    """The state's digest: a checkpoint at this seq recorded the same `ledger_digest`."""
    groups_by_status: dict[str, int]
    groups: list[GroupRow]
    replay: dict[str, list[str]]
    """Replay buffer: status (ready, selected) -> group ids."""
    rows_referenced: int


def view_state(seq: int, state: LedgerState) -> StateView:
    groups = []
    for g in sorted(state.groups.values(), key=lambda g: g.group_id):
        siblings = [
            SiblingRow(
                generation_index=s.generation_index,
                rollout_id=s.current.rollout_id,
                attempt=s.current.attempt,
                status=s.current.status,
                staging_keys=list(s.current.staging_keys),
            )
            for s in g.siblings
        ]
        sealed = sum(s.status == "sealed" for s in siblings)
        groups.append(
            GroupRow(
                group_id=g.group_id,
                status=g.status,
                phase=g.phase,
                target_step=g.target_step,
                sealed=sealed,
                missing=len(siblings) - sealed,
                siblings=siblings,
            )
        )
    replay: dict[str, list[str]] = {}
    for entry in state.replay.values():
        replay.setdefault(entry.status, []).append(entry.group_id)
    try:
        referenced = len(referenced_keys(state))
    except RuleViolation as exc:  # a row owned twice: the log breaks a rule
        raise CliUsageError(f"seq {seq}: {exc}") from None
    return StateView(
        seq=seq,
        digest=state_digest(state),
        groups_by_status=dict(Counter(g.status for g in groups).most_common()),
        groups=groups,
        replay={k: sorted(v) for k, v in sorted(replay.items())},
        rows_referenced=referenced,
    )


def chosen_point(log: EventLog, at: int | None, step: int | None, checkpoint: int | None) -> int:
    given = [
        (name, v) for name, v in (("--at", at), ("--step", step), ("--checkpoint", checkpoint))
    ]
    named = [(name, v) for name, v in given if v is not None]
    if len(named) > 1:
        raise CliUsageError(
            f"give one of --at, --step, --checkpoint (got {', '.join(n for n, _ in named)})"
        )
    kinds = {"--at": "seq", "--step": "step", "--checkpoint": "checkpoint"}
    point = "".join(f"{kinds[name]}:{value}" for name, value in named) or "head"
    return point_seq(RunLog(log), point)


@click.command()
@click.argument("target")
@click.option("--at", type=number(), metavar="SEQ", help="The state right after record SEQ.")
@click.option("--step", type=number(), metavar="N", help="The state at the end of step N.")
@click.option("--checkpoint", type=number(), metavar="N", help="The state at step N's checkpoint.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def state(
    target: str, at: int | None, step: int | None, checkpoint: int | None, as_json: bool
) -> None:
    """The ledger in TARGET as a restore would rebuild it at a point (default: the head):
    groups by status, each group's siblings sealed and missing, the replay buffer, and how
    many staging rows the sealed attempts reference.

    \b
    Rolled-back records are skipped as the log stood at that point. --json prints one
    object with every group's siblings (current attempt, status, staging keys).
    """
    with open_log(target) as log:
        seq = chosen_point(log, at, step, checkpoint)
        view = view_state(seq, state_at(log, seq))
    if as_json:
        click.echo(json_line({"target": shown_target(target), **msgspec.to_builtins(view)}))
        return
    console = stdout_console()
    by_status = ", ".join(f"{n} {s}" for s, n in view.groups_by_status.items()) or "none"
    console.print(f"ledger at seq {seq}: {len(view.groups)} groups ({by_status})", style="bold")
    replay = "; ".join(f"{s}: {shown_ids(ids)}" for s, ids in view.replay.items()) or "empty"
    console.print(f"replay buffer: {replay}")
    console.print(f"staging rows referenced by sealed attempts: {view.rows_referenced}")
    console.print(f"ledger digest: {view.digest}")
    if not view.groups:
        return
    rows = [
        (
            printable(g.group_id),
            g.status,
            g.phase,
            "-" if g.target_step is None else str(g.target_step),
            str(g.sealed),
            str(g.missing),
            " ".join(f"{s.generation_index}:{s.status}" for s in g.siblings),
        )
        for g in view.groups
    ]
    # Plain columns, joined once: a rich Table measured and wrapped every cell of a
    # 500-group ledger, which took longer than folding the log to it.
    header, *lines = _columns(_HEADER, rows)
    console.print()
    console.print(header, style="bold", markup=False)
    console.out("\n".join(lines), highlight=False)


_HEADER = ("group", "status", "phase", "target step", "sealed", "missing", "siblings")
_RIGHT = {"sealed", "missing"}


def _columns(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    """Header and rows as aligned text columns, two spaces apart (the last column unpadded)."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=False)]
    lines = []
    for row in (header, *rows):
        cells = [
            cell.rjust(width) if name in _RIGHT else cell.ljust(width)
            for name, cell, width in zip(header[:-1], row[:-1], widths[:-1], strict=True)
        ]
        lines.append("  ".join([*cells, row[-1]]))
    return lines
