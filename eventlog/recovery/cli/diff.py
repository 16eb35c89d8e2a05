"""`eventlog diff TARGET A B`: what changed in the ledger between two points of a run.

Both states come from the restore's fold (`state.state_at`); the changes are the effective
records between the points (as the log stood at B), so a restore in between shows both as
the groups it took away and as what was done again.
"""

from __future__ import annotations

import click
import msgspec

from eventlog.cli.exits import CliUsageError
from eventlog.cli.output import json_line, shown_ids, stdout_console
from eventlog.cli.targets import open_log, shown_target
from eventlog.log import EventLog
from eventlog.recovery.cli.runlog import RunLog, decoded_all, point_seq
from eventlog.recovery.cli.state import state_at
from eventlog.recovery.vocabulary import (
    GroupAbandoned,
    GroupAdmitted,
    GroupDiscarded,
    GroupFinalized,
    GroupReserved,
    GroupSealed,
    ReplayConsumed,
    ReplayEvicted,
    RestoreStarted,
    SiblingSealed,
    StagingCleared,
    UnsealedAbandoned,
)
from projections.siblings import LedgerState


class Diff(msgspec.Struct, frozen=True, kw_only=True):
    from_seq: int
    to_seq: int
    groups_before: int
    groups_after: int
    appeared: list[str]
    """Groups in the ledger or the replay buffer at B and in neither at A."""
    gone: list[str]
    """Groups in the ledger or the replay buffer at A and in neither at B."""
    reserved: list[str]
    admitted: list[str]
    sealed: list[str]
    """`group:sibling` sealed between the points."""
    finalized: list[str]
    trained: dict[int, list[str]]
    """Step -> groups consumed by the trainer at that step."""
    evicted: list[str]
    abandoned: list[str]
    """`group:sibling` attempts abandoned."""
    discarded: list[str]
    rows_cleared: int
    restores: list[int]


def _present(state: LedgerState) -> set[str]:
    return set(state.groups) | set(state.replay)


def diff_points(log: EventLog, a: int, b: int) -> Diff:
    before, after = state_at(log, a), state_at(log, b)
    run = RunLog(log, until_seq=b)
    reserved: list[str] = []
    admitted: list[str] = []
    sealed: list[str] = []
    finalized: list[str] = []
    trained: dict[int, list[str]] = {}
    evicted: list[str] = []
    abandoned: list[str] = []
    discarded: list[str] = []
    restores: list[int] = []
    cleared = 0
    for rec in decoded_all(log.read_records(a + 1, b)):
        if rec.seq in run.skipped:
            continue
        ev = rec.event
        if isinstance(ev, GroupReserved):
            reserved.append(ev.group_id)
        elif isinstance(ev, GroupAdmitted):
            admitted.append(ev.group_id)
        elif isinstance(ev, SiblingSealed):
            sealed.append(f"{ev.group_id}:{ev.generation_index}")
        elif isinstance(ev, GroupSealed):
            sealed.extend(f"{ev.group_id}:{r.generation_index}" for r in ev.results)
        elif isinstance(ev, GroupFinalized):
            finalized.append(ev.group_id)
            cleared += len(ev.staging_cleared)  # its sealed attempts' staging rows
        elif isinstance(ev, ReplayConsumed):
            trained.setdefault(ev.step, []).extend(ev.group_ids)
        elif isinstance(ev, ReplayEvicted):
            evicted.extend(ev.group_ids)
        elif isinstance(ev, UnsealedAbandoned | GroupAbandoned):
            abandoned.extend(f"{ev.group_id}:{r.generation_index}" for r in ev.attempts)
        elif isinstance(ev, GroupDiscarded):
            discarded.append(ev.group_id)
        elif isinstance(ev, StagingCleared):
            cleared += len(ev.of_attempts) + len(ev.never_staged)
        elif isinstance(ev, RestoreStarted):
            restores.append(rec.seq)
    was, now = _present(before), _present(after)
    return Diff(
        from_seq=a,
        to_seq=b,
        groups_before=len(before.groups),
        groups_after=len(after.groups),
        appeared=sorted(now - was),
        gone=sorted(was - now),
        reserved=reserved,
        admitted=admitted,
        sealed=sealed,
        finalized=finalized,
        trained=dict(sorted(trained.items())),
        evicted=evicted,
        abandoned=abandoned,
        discarded=discarded,
        rows_cleared=cleared,
        restores=restores,
    )


@click.command()
@click.argument("target")
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def diff(target: str, a: str, b: str, as_json: bool) -> None:
    """What changed in TARGET's ledger from point A to point B: groups that appeared or went,
    were reserved, admitted, sealed, finalized, trained, evicted, abandoned or discarded, and
    rows cleared.

    \b
    A point is a seq, step:N (the end of step N), checkpoint:N or head;
    e.g. `eventlog diff run.db checkpoint:1 checkpoint:2`.
    """
    with open_log(target) as log:
        run = RunLog(log)  # both points as of one head
        low, high = point_seq(run, a), point_seq(run, b)
        if low > high:
            raise CliUsageError(f"{a} (seq {low}) comes after {b} (seq {high}): give A first")
        found = diff_points(log, low, high)
    if as_json:
        click.echo(json_line({"target": shown_target(target), **msgspec.to_builtins(found)}))
        return
    console = stdout_console()
    console.print(
        f"seq {found.from_seq} -> {found.to_seq}: groups in the ledger "
        f"{found.groups_before} -> {found.groups_after}",
        style="bold",
    )
    rows: list[tuple[str, list[str]]] = [
        ("appeared", found.appeared),
        ("gone", found.gone),
        ("reserved", found.reserved),
        ("admitted", found.admitted),
        ("sealed", found.sealed),
        ("finalized", found.finalized),
        *((f"trained in step {n}", ids) for n, ids in found.trained.items()),
        ("evicted", found.evicted),
        ("abandoned", found.abandoned),
        ("discarded", found.discarded),
    ]
    for label, ids in rows:
        if ids:
            console.print(f"{label} ({len(ids)}): {shown_ids(ids)}")
    if found.rows_cleared:
        console.print(f"rows cleared: {found.rows_cleared}")
    for seq in found.restores:
        console.print(f"restore at seq {seq}")
