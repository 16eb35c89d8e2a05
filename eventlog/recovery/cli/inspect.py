"""`eventlog inspect group|rollout|step`: the auditor's question answered on one screen.

Why was group G trained with these siblings, from which attempts, under which weight
versions, on which worker, and what was discarded, rolled back or cleared on the way? The
view is `projections.audit_view`'s fold over every record about the group; the timeline is
`replay --group G` (records a restore rolled back are marked with that restore's seq).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import click
import msgspec
from rich.console import Console
from rich.table import Table

from eventlog.cli.exits import CliUsageError
from eventlog.cli.numbers import number
from eventlog.cli.output import json_line, nearest, printable, shown_ids, stdout_console
from eventlog.cli.targets import open_log, shown_target
from eventlog.cli.views import RecordLines, json_object, view_decoded
from eventlog.log import EventLog
from eventlog.records import RecordedEvent
from eventlog.recovery.cli.runlog import (
    RunLog,
    about_group,
    decoded,
    decoded_all,
    incarnations,
    require_group,
)
from eventlog.recovery.vocabulary import (
    AttemptFailed,
    GenerationStarted,
    GroupAbandoned,
    GroupFinalized,
    GroupReserved,
    ReplayConsumed,
    RestoreStarted,
    RetryPrepared,
    SiblingsDispatched,
    TokensStaged,
    UnsealedAbandoned,
    attempt_stream,
    cleared_of_attempts,
)
from projections.audit import group_of_rollout
from projections.audit_view import AttemptView, GroupView, Incarnation, view_group


@click.group()
def inspect() -> None:
    """Look closely at one group, one rollout or one step of a run."""


def load_group(log: EventLog, run: RunLog, group_id: str) -> tuple[GroupView, list[RecordedEvent]]:
    """The group's view (with its incarnations) and every record about it, by seq."""
    records = about_group(log, group_id, run)
    view = view_group(group_id, records, run.skipped)
    earlier, later = incarnations(log, run, group_id)
    view = msgspec.structs.replace(
        view,
        earlier=[Incarnation(group_id=g, reserved_seq=s, rolled_back=r) for g, s, r in earlier],
        later=[Incarnation(group_id=g, reserved_seq=s, rolled_back=r) for g, s, r in later],
    )
    return view, records


def _timeline_json(run: RunLog, records: list[RecordedEvent]) -> list[dict[str, Any]]:
    out = []
    for rec in records:
        obj = json_object(view_decoded(rec, run.mark(rec.seq)))
        obj.setdefault("rolled_back", False)
        out.append(obj)
    return out


def print_timeline(console: Console, run: RunLog, records: list[RecordedEvent]) -> None:
    printer = RecordLines(
        console,
        seq_width=len(str(records[-1].seq)) if records else 3,
        mark_title="rolled back by" if run.skipped else None,
    )
    for rec in records:
        printer.add(view_decoded(rec, run.mark(rec.seq)))
    printer.flush()


def _header(v: GroupView) -> list[str]:
    first = " · ".join(
        [
            f"group {printable(v.group_id)}",
            f"agent {printable(v.agent_name or '-')}",
            f"task {printable(v.task_name or '-')}",
            f"prompt {printable(v.sample_id or '-')}",
            f"granularity {v.granularity or '?'}",
            f"{v.expected_generations or '?'} siblings",
        ]
    )
    target = f" (target step {v.target_step})" if v.target_step is not None else ""
    rolled = ""
    if v.rolled_back_records:
        by = ", ".join(str(s) for s in v.restores)
        rolled = f", {v.rolled_back_records} rolled back by the restore at seq {by}"
    lines = [first, f"{v.fate}{target} · {v.records} records{rolled}"]
    for label, found in (("earlier", v.earlier), ("later", v.later)):
        for inc in found:
            state = "rolled back" if inc.rolled_back else "effective"
            lines.append(
                f"{label} incarnation of this prompt: group {printable(inc.group_id)} "
                f"(reserved at seq {inc.reserved_seq}, {state})"
            )
    return lines


def _rows(a: AttemptView) -> str:
    fates = Counter(row.fate for row in a.rows)
    return ", ".join(f"{n} {fate}" for fate, n in fates.items()) or "-"


def _attempt_cells(a: AttemptView) -> list[str]:
    return [
        str(a.generation_index),
        str(a.attempt),
        printable(a.rollout_id),
        a.verdict,
        a.why + (f" (+{a.stale_rejections} late)" if a.stale_rejections else ""),
        printable(a.worker or "-"),
        ",".join(str(w) for w in a.weight_versions) or "-",
        str(a.tokens),
        "-" if a.reward is None else f"{a.reward:g}",
        "-" if a.mask_sample is None else ("yes" if a.mask_sample else "no"),
        _rows(a),
    ]


_ATTEMPT_COLUMNS = (
    "sibling",
    "attempt",
    "rollout id",
    "verdict",
    "why",
    "worker",
    "weights",
    "tokens",
    "reward",
    "mask",
    "staged rows",
)
_RIGHT = {"sibling", "attempt", "tokens", "reward"}


def attempts_table(attempts: list[AttemptView]) -> Table:
    """Per sibling, the attempt that counts first, then the ones that did not."""
    table = Table(box=None, pad_edge=False)
    for name in _ATTEMPT_COLUMNS:
        table.add_column(name, justify="right" if name in _RIGHT else "left")
    order = sorted(attempts, key=lambda a: (a.generation_index, a.verdict != "counts", -a.attempt))
    for a in order:
        table.add_row(*_attempt_cells(a), style="" if a.verdict == "counts" else "dim")
    return table


@inspect.command("group")
@click.argument("target")
@click.argument("group_id", metavar="G")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def group(target: str, group_id: str, as_json: bool) -> None:
    """Prompt group G in TARGET: per sibling the attempt that counts and why the others do
    not, worker, weight versions, tokens, reward, mask_sample, what became of every staged
    row; the step that trained it; other incarnations of its prompt; its timeline.

    \b
    --json prints one object: "group" (the view above, every staged row with its fate) and
    "timeline" (records as `replay --json` prints them, each with "rolled_back").
    """
    with open_log(target) as log:
        require_group(log, group_id)
        run = RunLog(log)
        view, records = load_group(log, run, group_id)
    if as_json:
        click.echo(
            json_line(
                {
                    "target": shown_target(target),
                    "group": msgspec.to_builtins(view),
                    "timeline": _timeline_json(run, records),
                }
            )
        )
        return
    console = stdout_console()
    for i, line in enumerate(_header(view)):
        console.print(line, style="bold" if i == 0 else "")
    console.print()
    console.print("attempts", style="bold")
    console.print(attempts_table(view.attempts))
    console.print()
    console.print("timeline", style="bold")
    print_timeline(console, run, records)


@inspect.command("rollout")
@click.argument("target")
@click.argument("rollout_id", metavar="R")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def rollout(target: str, rollout_id: str, as_json: bool) -> None:
    """Rollout (attempt) R in TARGET: its group and sibling, verdict and why, worker, weight
    versions, tokens, reward, mask_sample, its staged rows and their fate, its records."""
    with open_log(target) as log:
        group_id = _group_of(log, rollout_id)
        run = RunLog(log)
        view, records = load_group(log, run, group_id)
        found = [a for a in view.attempts if a.rollout_id == rollout_id]
        if not found:
            raise CliUsageError(
                f"rollout {rollout_id!r}: group {group_id!r} has no such attempt ("
                + nearest(rollout_id, [a.rollout_id for a in view.attempts])
                + ")"
            )
    (attempt,) = found
    mine = [r for r in records if _names(r, rollout_id)]
    if as_json:
        click.echo(
            json_line(
                {
                    "target": shown_target(target),
                    "group_id": group_id,
                    "group_fate": view.fate,
                    "attempt": msgspec.to_builtins(attempt),
                    "timeline": _timeline_json(run, mine),
                }
            )
        )
        return
    console = stdout_console()
    console.print(
        f"rollout {printable(rollout_id)} · group {printable(group_id)} · "
        f"sibling {attempt.generation_index} · "
        f"attempt {attempt.attempt} · {attempt.verdict} ({attempt.why})",
        style="bold",
    )
    console.print(f"group: {view.fate}")
    console.print(attempts_table([attempt]))
    if attempt.rows:
        console.print()
        console.print("staged rows", style="bold")
        rows = Table(box=None, pad_edge=False)
        for name in ("staging key", "tokens", "fate"):
            rows.add_column(name, justify="right" if name == "tokens" else "left")
        for row in attempt.rows:
            rows.add_row(printable(row.key), str(row.tokens), row.fate)
        console.print(rows)
    console.print()
    console.print("timeline", style="bold")
    print_timeline(console, run, mine)


def _group_of(log: EventLog, rollout_id: str) -> str:
    """The group a rollout belongs to: as its worker recorded it, else as its id says."""
    for rec in decoded_all(log.read_records(streams=[attempt_stream(rollout_id)])):
        if isinstance(rec.event, GenerationStarted):
            return rec.event.group_id
    group_id = group_of_rollout(rollout_id)
    if group_id is None:
        raise CliUsageError(
            f"rollout {rollout_id!r}: not a rollout id (expected {{group}}_g{{i}} or "
            "{group}_g{i}-a{n})"
        )
    require_group(log, group_id)
    return group_id


def _names(rec: RecordedEvent, rollout_id: str) -> bool:
    """Does this record concern the rollout (its own stream, or a ledger event naming it)?"""
    if rec.stream == attempt_stream(rollout_id):
        return True
    ev = rec.event
    if getattr(ev, "rollout_id", None) == rollout_id:
        return True
    refs = getattr(ev, "attempts", None) or getattr(ev, "results", None) or []
    if any(getattr(ref, "rollout_id", None) == rollout_id for ref in refs):
        return True
    cleared = cleared_of_attempts(ev)
    return any(c.rollout_id == rollout_id for c in cleared) or isinstance(ev, RestoreStarted)


class StepView(msgspec.Struct, frozen=True, kw_only=True):
    step: int
    first_seq: int
    last_seq: int | None
    records: int
    rolled_back_records: int
    unread_records: int
    """Records of a type this eventlog does not know, or of a newer schema: counted only."""
    groups_reserved: list[str]
    groups_finalized: list[str]
    groups_trained: list[str]
    attempts_dispatched: int
    attempts_started: int
    attempts_failed: int
    attempts_retried: int
    attempts_abandoned: int
    tokens_staged: int
    restores: list[dict[str, int]]


def view_step(log: EventLog, run: RunLog, step: int) -> StepView:
    """What step N's records say: effective reservations, finalizations and training; the
    work done (rolled back or not); the restores in it."""
    low, high = run.step_range(step)
    reserved: list[str] = []
    finalized: list[str] = []
    trained: list[str] = []
    work: Counter[str] = Counter()
    restores: list[dict[str, int]] = []
    records = rolled = unread = 0
    for record in log.read_records(low, run.head if high is None else high):
        records += 1
        effective = record.seq not in run.skipped
        rolled += not effective
        rec = decoded(record)
        if rec is None:
            unread += 1
            continue
        ev = rec.event
        if isinstance(ev, GroupReserved) and effective:
            reserved.append(ev.group_id)
        elif isinstance(ev, GroupFinalized) and effective:
            finalized.append(ev.group_id)
        elif isinstance(ev, ReplayConsumed) and effective and ev.step == step:
            trained.extend(ev.group_ids)
        elif isinstance(ev, SiblingsDispatched):
            work["dispatched"] += len(ev.attempts)
        elif isinstance(ev, GenerationStarted):
            work["started"] += 1
        elif isinstance(ev, AttemptFailed):
            work["failed"] += 1
        elif isinstance(ev, RetryPrepared):
            work["retried"] += len(ev.attempts)
        elif isinstance(ev, UnsealedAbandoned | GroupAbandoned):
            work["abandoned"] += len(ev.attempts)
        elif isinstance(ev, TokensStaged):
            work["tokens"] += ev.token_count
        elif isinstance(ev, RestoreStarted):
            restores.append(
                {
                    "seq": rec.seq,
                    "checkpoint_step": ev.checkpoint_step,
                    "rolled_back_from_seq": ev.rolled_back_from_seq,
                    "rolled_back_until_seq": rec.seq - 1,
                }
            )
    return StepView(
        step=step,
        first_seq=low,
        last_seq=high,
        records=records,
        rolled_back_records=rolled,
        unread_records=unread,
        groups_reserved=reserved,
        groups_finalized=finalized,
        groups_trained=trained,
        attempts_dispatched=work["dispatched"],
        attempts_started=work["started"],
        attempts_failed=work["failed"],
        attempts_retried=work["retried"],
        attempts_abandoned=work["abandoned"],
        tokens_staged=work["tokens"],
        restores=restores,
    )


@inspect.command("step")
@click.argument("target")
@click.argument("step", type=number(), metavar="N")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def step_command(target: str, step: int, as_json: bool) -> None:
    """Step N of TARGET's run: its records (after step N-1 ended, up to where N ended: its
    training or its checkpoint, whichever is later), the groups it reserved, finalized and
    trained, the work its attempts did, its restores."""
    with open_log(target) as log:
        run = RunLog(log)
        view = view_step(log, run, step)
    if as_json:
        click.echo(json_line({"target": shown_target(target), **msgspec.to_builtins(view)}))
        return
    console = stdout_console()
    until = "the head" if view.last_seq is None else f"seq {view.last_seq}"
    console.print(f"step {step} · seqs {view.first_seq} to {until}", style="bold")
    rolled = f", {view.rolled_back_records} rolled back" if view.rolled_back_records else ""
    if view.unread_records:
        rolled += f", {view.unread_records} of types this eventlog does not know (not read)"
    console.print(f"{view.records} records{rolled}")
    for label, groups in (
        ("trained", view.groups_trained),
        ("finalized", view.groups_finalized),
        ("reserved", view.groups_reserved),
    ):
        console.print(f"groups {label} ({len(groups)}): {shown_ids(groups) or '-'}")
    console.print(
        f"attempts: {view.attempts_dispatched} dispatched, {view.attempts_started} started, "
        f"{view.attempts_failed} failed, {view.attempts_retried} retried, "
        f"{view.attempts_abandoned} abandoned; {view.tokens_staged} tokens staged"
    )
    for r in view.restores:
        console.print(
            f"restore at seq {r['seq']} to checkpoint step {r['checkpoint_step']}: rolled back "
            f"seqs {r['rolled_back_from_seq']}..{r['rolled_back_until_seq']}"
        )
