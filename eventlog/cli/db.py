"""`eventlog db`: the log's schema revision (alembic) — see it, upgrade it, downgrade it."""

from __future__ import annotations

import click
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError

from eventlog.cli._common import (
    ExitCode,
    require_existing,
    require_parent,
    shown_target,
)
from eventlog.errors import LogRevisionError
from eventlog.log import open_store
from eventlog.store import migrate
from eventlog.store.base import SqlStore


def _known_revisions() -> set[str]:
    script = ScriptDirectory(str(migrate.migrations_dir()))
    return {revision.revision for revision in script.walk_revisions()}


def _refuse_foreign_or_newer(store: SqlStore, shown: str, current: str | None) -> None:
    """A database eventlog did not make, or made by a newer eventlog, is not migrated."""
    if current is None:
        if "events" in sa.inspect(store.engine).get_table_names():
            raise LogRevisionError(
                f"{shown}: has an events table but no alembic revision; it was not made by eventlog"
            )
        return
    if current not in _known_revisions():
        head = migrate.head_revision(store.engine)
        raise LogRevisionError(
            f"{shown}: log is at schema revision {current}, "
            f"newer than this eventlog knows ({head})",
            hint="upgrade the eventlog package to open it",
        )


@click.group()
def db() -> None:
    """The log's schema revision: current, upgrade, downgrade."""


@db.command()
@click.argument("target")
@click.option("--revision", default="head", show_default=True, help="Revision to migrate to.")
def upgrade(target: str, revision: str) -> None:
    """Migrate TARGET up to a revision (creates the log if TARGET is new)."""
    require_parent(target)
    shown = shown_target(target)
    store = open_store(target)
    try:
        before = migrate.current_revision(store.engine)
        _refuse_foreign_or_newer(store, shown, before)
        try:
            migrate.upgrade(store.engine, revision)
        except CommandError as exc:
            raise LogRevisionError(f"{shown}: cannot upgrade to {revision!r}: {exc}") from exc
        after = migrate.current_revision(store.engine)
    finally:
        store.close()
    if before == after:
        click.echo(f"{shown}: already at revision {after}")
    else:
        click.echo(f"{shown}: upgraded {before or '(empty)'} -> {after}")


@db.command()
@click.argument("target")
@click.argument("revision")
def downgrade(target: str, revision: str) -> None:
    """Migrate TARGET down to REVISION (`base` drops every table: the log is gone)."""
    require_existing(target)
    shown = shown_target(target)
    store = open_store(target)
    try:
        before = migrate.current_revision(store.engine)
        _refuse_foreign_or_newer(store, shown, before)
        try:
            migrate.downgrade(store.engine, revision)
        except CommandError as exc:
            raise LogRevisionError(f"{shown}: cannot downgrade to {revision!r}: {exc}") from exc
        after = migrate.current_revision(store.engine)
    finally:
        store.close()
    click.echo(f"{shown}: downgraded {before or '(empty)'} -> {after or '(empty)'}")


@db.command()
@click.argument("target")
@click.option("--check", is_flag=True, help="Exit 3 unless the log is at the head revision.")
@click.pass_context
def current(ctx: click.Context, target: str, check: bool) -> None:
    """Print TARGET's schema revision and the newest one this eventlog knows."""
    require_existing(target)
    shown = shown_target(target)
    store = open_store(target)
    try:
        now = migrate.current_revision(store.engine)
        head = migrate.head_revision(store.engine)
    finally:
        store.close()
    if now == head:
        state = "up to date"
    elif now is None:
        state = f"no eventlog log here; run `eventlog db upgrade {shown}`"
    elif now in _known_revisions():
        state = f"needs upgrade; run `eventlog db upgrade {shown}`"
    else:
        state = "newer than this eventlog; upgrade the eventlog package"
    click.echo(f"current: {now or '(empty)'}")
    click.echo(f"head:    {head}")
    click.echo(f"status:  {state}")
    if check and now != head:
        ctx.exit(ExitCode.REVISION_OR_SCHEMA)
