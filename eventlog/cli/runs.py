"""`eventlog runs`: the runs a database holds (one schema each), with their heads, plus the
columns a domain adds (rollout recovery adds the last checkpoint and the run's state)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import click
import sqlalchemy as sa
from rich.table import Table

from eventlog.cli.output import json_line, stdout_console
from eventlog.cli.targets import busy_timeout, require_existing, run_target, shown_target
from eventlog.cli.times import format_ns
from eventlog.errors import LogRevisionError
from eventlog.log import EventLog, open_store, resolve_url
from eventlog.store import migrate
from eventlog.store import runs as run_names
from eventlog.store.errors import translating

RunColumns = Callable[[EventLog, int], dict[str, str]]
"""A domain's columns for one run, read from its log (opened read-only) as of the head given:
the row's own."""


class RunsCommand(click.Command):
    """`runs` and the columns it was built with."""

    columns: tuple[RunColumns, ...] = ()
    column_names: tuple[str, ...] = ()


def make_runs(columns: Sequence[RunColumns], names: Sequence[str]) -> RunsCommand:
    """`runs` with the columns a domain adds (`names` in the order the table shows them)."""
    command = copy.copy(runs)
    command.columns = tuple(columns)
    command.column_names = tuple(names)
    return command


def _database(target: str) -> str:
    """TARGET without a run in it: `runs` lists every run of the database."""
    if "://" not in target:
        return target
    url = sa.make_url(target)
    return url.difference_update_query([run_names.RUN_PARAM]).render_as_string(hide_password=False)


def _run_names(target: str) -> list[str]:
    if "://" not in target or resolve_url(target).get_backend_name() != "postgresql":
        return [run_names.DEFAULT_RUN]  # SQLite: one file, one run
    store = open_store(target, busy_timeout=busy_timeout(), read_only=True)
    try:
        with translating(shown_target(target)):
            return run_names.find_runs(store.engine)
    finally:
        store.close()


def _describe(target: str, run: str, columns: Sequence[RunColumns]) -> dict[str, object]:
    """One run's row: its revision state, head and newest append, then the domain's columns."""
    selected = None if run == run_names.DEFAULT_RUN else run
    store = open_store(target, busy_timeout=busy_timeout(), read_only=True, run=selected)
    row: dict[str, object] = {"run": run}
    try:
        with translating(store.target):
            current = migrate.current_revision(store.engine, store.target)
            head_revision = migrate.head_revision(store.engine)
            # Someone else's database, one a newer eventlog wrote, or no log: say so.
            migrate.refuse_foreign_or_newer(store.engine, target=store.target, current=current)
        if current is None:
            raise LogRevisionError(
                f"{store.target}: no eventlog log here",
                hint=f"create one with `eventlog init {store.target}`",
            )
    except BaseException:
        store.close()
        raise
    if current != head_revision:
        store.close()
        row["log"] = f"needs `eventlog db upgrade` (revision {current})"
        return row
    with EventLog(store) as log:
        head = log.head()
        last = next(iter(log.read_records(from_seq=head, until_seq=head)), None) if head else None
        row["log"] = "ok"
        row["head"] = head
        row["last_append"] = None if last is None else format_ns(last.recorded_at)
        for column in columns:
            row |= column(log, head)
    return row


def _row(target: str, run: str, columns: Sequence[RunColumns], *, alone: bool) -> dict[str, object]:
    """A run's row; among several, a run no eventlog here can read is a row saying so, not
    an error hiding every other run."""
    try:
        return _describe(target, run, columns)
    except LogRevisionError as exc:
        if alone:
            raise
        return {"run": run, "log": str(exc)}


@click.command(cls=RunsCommand)
@click.argument("target")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per run.")
def runs(target: str, as_json: bool) -> None:
    """List the runs in TARGET's database: name, head seq, newest append, and (rollout
    recovery) the last effective checkpoint and the run's state.

    \b
    Several runs share one PostgreSQL database, each in a schema of its own; select one
    with `--run NAME`, EVENTLOG_RUN or `?run=NAME` in the URL. A log made before runs
    existed is the run `default`. On SQLite each run is a file of its own: TARGET is that
    run, listed as `default`.
    """
    require_existing(target)
    run_target(target)  # refuses `--run NAME` where it selects nothing: an SQLite file
    command = click.get_current_context().command
    columns = command.columns if isinstance(command, RunsCommand) else ()
    names = command.column_names if isinstance(command, RunsCommand) else ()
    database = _database(target)
    names_found = _run_names(database)
    rows = [_row(database, run, columns, alone=len(names_found) == 1) for run in names_found]
    if as_json:
        for row in rows:
            click.echo(json_line(row))
        return
    console = stdout_console()
    if not rows:
        console.print(f"{shown_target(database)}: no runs (create one with `eventlog init`)")
        return
    table = Table(title=None, box=None, pad_edge=False)
    keys = ["run", "log", "head", "last_append", *names]
    for key in keys:
        table.add_column(key.replace("_", " "), justify="right" if key == "head" else "left")
    for row in rows:
        table.add_row(*("-" if row.get(key) is None else str(row[key]) for key in keys))
    console.print(table)
