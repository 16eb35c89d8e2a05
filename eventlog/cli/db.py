"""`eventlog db`: the log's schema revision (alembic) — see it, upgrade it, downgrade it."""

from __future__ import annotations

import click
from alembic.util.exc import CommandError

from eventlog.cli.exits import ExitCode
from eventlog.cli.targets import require_existing, require_parent, shown_target
from eventlog.errors import LogRevisionError
from eventlog.log import open_store
from eventlog.store import migrate


@click.group()
def db() -> None:
    """The log's schema revision: current, upgrade, downgrade."""


def _migrate(target: str, revision: str, direction: str) -> tuple[str | None, str | None]:
    """Move TARGET's schema to `revision`; returns (before, after)."""
    shown = shown_target(target)
    store = open_store(target)
    try:
        before = migrate.current_revision(store.engine)
        migrate.refuse_foreign_or_newer(store.engine, target=shown, current=before)
        step = migrate.upgrade if direction == "upgrade" else migrate.downgrade
        try:
            step(store.engine, revision)
        except CommandError as exc:
            raise LogRevisionError(f"{shown}: cannot {direction} to {revision!r}: {exc}") from exc
        return before, migrate.current_revision(store.engine)
    finally:
        store.close()


@db.command()
@click.argument("target")
@click.option("--revision", default="head", show_default=True, help="Revision to migrate to.")
def upgrade(target: str, revision: str) -> None:
    """Migrate TARGET up to a revision (creates the log if TARGET is new)."""
    require_parent(target)
    before, after = _migrate(target, revision, "upgrade")
    if before == after:
        click.echo(f"{shown_target(target)}: already at revision {after}")
    else:
        click.echo(f"{shown_target(target)}: upgraded {before or '(empty)'} -> {after}")


@db.command()
@click.argument("target")
@click.argument("revision")
def downgrade(target: str, revision: str) -> None:
    """Migrate TARGET down to REVISION (`base` drops every table: the log is gone)."""
    require_existing(target)
    before, after = _migrate(target, revision, "downgrade")
    click.echo(f"{shown_target(target)}: downgraded {before or '(empty)'} -> {after or '(empty)'}")


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
        known = migrate.known_revisions(store.engine)
    finally:
        store.close()
    if now == head:
        state = "up to date"
    elif now is None:
        state = f"no eventlog log here; run `eventlog db upgrade {shown}`"
    elif now in known:
        state = f"needs upgrade; run `eventlog db upgrade {shown}`"
    else:
        state = "newer than this eventlog; upgrade the eventlog package"
    click.echo(f"current: {now or '(empty)'}")
    click.echo(f"head:    {head}")
    click.echo(f"status:  {state}")
    if check and now != head:
        ctx.exit(ExitCode.REVISION_OR_SCHEMA)
