"""`eventlog db`: the log's schema revision (alembic) — see it, upgrade it, downgrade it —
and, on PostgreSQL, the roles that may write and audit it."""

from __future__ import annotations

import contextlib
import re
import sqlite3
from pathlib import Path

import click
from alembic.util.exc import CommandError

from eventlog.cli.exits import CliUsageError, ExitCode
from eventlog.cli.targets import (
    SIDE_FILES,
    require_existing,
    require_parent,
    run_target,
    shown_target,
    sqlite_file,
)
from eventlog.errors import LogRevisionError
from eventlog.log import open_store
from eventlog.store import migrate
from eventlog.store.errors import translating


@click.group()
def db() -> None:
    """The log's schema revision: current, upgrade, downgrade; PostgreSQL roles: grant."""


_RESERVED_ROLES = frozenset({"public", "none"})
"""Role names PostgreSQL keeps for itself, with every name starting `pg_` (the roles are
created by their quoted names: `PUBLIC` or `current_user` are names like any other)."""

_REVISIONS = "a revision id such as 0001, head, base, or a relative step such as +1 or -1"


def _migrate(target: str, revision: str, direction: str) -> tuple[str | None, str | None]:
    """Move TARGET's schema to `revision`; returns (before, after)."""
    if not revision.rpartition("@")[2].strip():
        # alembic asserts (exit 70) on an empty revision id, also one after `branch@`
        named = "--revision" if direction == "upgrade" else "REVISION"
        raise CliUsageError(f"{named} {revision!r}: empty revision; expected {_REVISIONS}")
    shown = shown_target(target)
    store = open_store(run_target(target))
    try:
        before, after = migrate.move(
            store.engine, target=shown, revision=revision, up=direction == "upgrade"
        )
    except CommandError as exc:  # alembic cannot read the revision table (two rows)
        raise LogRevisionError(f"{shown}: cannot {direction} to {revision!r}: {exc}") from exc
    finally:
        store.close()
    return before, after


def _moved(target: str, verb: str, before: str | None, after: str | None) -> None:
    """What a migration did, or that it had nothing to do ('(empty)': no schema)."""
    if before == after:
        click.echo(f"{shown_target(target)}: already at revision {after or '(empty)'}")
    else:
        click.echo(f"{shown_target(target)}: {verb} {before or '(empty)'} -> {after or '(empty)'}")


@db.command()
@click.argument("target")
@click.option("--revision", default="head", show_default=True, help="Revision to migrate to.")
def upgrade(target: str, revision: str) -> None:
    """Migrate TARGET up to a revision (creates the log if TARGET is new)."""
    require_parent(target)
    file = sqlite_file(target)
    new = file if file is not None and not file.exists() else None
    try:
        before, after = _migrate(target, revision, "upgrade")
    except BaseException:
        if new is not None:
            _remove_unmade(new)
        raise
    if new is not None and after is None:
        _remove_unmade(new)
    _moved(target, "upgraded", before, after)


def _remove_unmade(path: Path) -> None:
    """Remove the SQLite file an upgrade made but left without a log (refused, or asked
    for no schema): connecting created it, and an empty file was left for the next command
    to take for a log. Not if a log appeared there meanwhile (another process made one)."""
    with (
        contextlib.suppress(OSError, sqlite3.Error),
        contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db,
    ):
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'events'").fetchone():
            return
    for suffix in SIDE_FILES:
        path.with_name(path.name + suffix).unlink(missing_ok=True)


class _StepsBack(click.Command):
    """`db downgrade LOG -1`: a relative step is REVISION, where click took `-1` for an
    unknown option (only `db downgrade LOG -- -1` worked)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" not in args:
            steps = [i for i, arg in enumerate(args) if re.fullmatch(r"-[0-9]+", arg)]
            if steps:
                args = [*args[: steps[0]], "--", *args[steps[0] :]]
        return super().parse_args(ctx, args)


@db.command(cls=_StepsBack)
@click.argument("target")
@click.argument("revision")
def downgrade(target: str, revision: str) -> None:
    """Migrate TARGET down to REVISION (`base` drops every table: the log is gone)."""
    require_existing(target)
    _moved(target, "downgraded", *_migrate(target, revision, "downgrade"))


@db.command()
@click.argument("target")
@click.option("--check", is_flag=True, help="Exit 3 unless the log is at the head revision.")
@click.pass_context
def current(ctx: click.Context, target: str, check: bool) -> None:
    """Print TARGET's schema revision and the newest one this eventlog knows."""
    require_existing(target)
    shown = shown_target(target)
    store = open_store(run_target(target), read_only=True)
    try:
        with translating(shown):
            now = migrate.current_revision(store.engine, shown)
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


@db.command()
@click.argument("target")
@click.option("--writer", metavar="NAME", help="Role that may append and read (INSERT, SELECT).")
@click.option("--auditor", metavar="NAME", help="Role that may only read (SELECT).")
def grant(target: str, writer: str | None, auditor: str | None) -> None:
    """Give PostgreSQL roles the least the log needs: a writer appends, an auditor reads.

    Neither may UPDATE, DELETE or TRUNCATE a record (nor may anyone else: the append-only
    triggers refuse it). Missing roles are created (LOGIN, no password). Run as the log's
    owner; granting again resets the roles' privileges on the log to these.
    """
    shown = shown_target(target)
    if "://" not in target:
        raise CliUsageError(
            f"{shown}: roles exist on PostgreSQL only",
            hint="on SQLite the file's permissions decide who may write; the append-only "
            "triggers refuse UPDATE and DELETE of records",
        )
    if writer is None and auditor is None:
        raise CliUsageError("name a role: --writer NAME and/or --auditor NAME")
    for option, name in (("--writer", writer), ("--auditor", auditor)):
        if name is not None and not 0 < len(name) <= _MAX_ROLE_NAME:
            raise CliUsageError(f"{option} {name!r}: a role name has 1 to 63 characters")
        if name is not None and (name in _RESERVED_ROLES or name.startswith("pg_")):
            raise CliUsageError(f"{option} {name!r}: PostgreSQL reserves this role name")
    if writer is not None and writer == auditor:
        raise CliUsageError(f"--writer and --auditor are both {writer!r}: use two roles")
    from eventlog.store.postgres import grant_roles

    store = open_store(run_target(target))
    try:
        with translating(shown):
            now = migrate.current_revision(store.engine, shown)
            if now != migrate.head_revision(store.engine):
                raise LogRevisionError(
                    f"{shown}: no eventlog log at head here (revision {now or '(empty)'})",
                    hint=f"run `eventlog db upgrade {shown}` first",
                )
            try:
                granted = grant_roles(store.engine, writer=writer, auditor=auditor)
            except ValueError as exc:
                raise CliUsageError(f"{shown}: {exc}") from exc
    finally:
        store.close()
    for name, privileges in granted.items():
        click.echo(f"{name}: {privileges}")


_MAX_ROLE_NAME = 63  # PostgreSQL's NAMEDATALEN - 1
