"""Schema revisions: alembic owns every table; a log at the wrong revision is refused.

Alembic (with mako and pygments under it) is imported only where a revision is created,
moved or listed, or a log is found off head: opening a log at head reads its one
`alembic_version` row with a plain query and compares it with HEAD_REVISION. Importing
alembic cost a command such as `eventlog inspect` a quarter of its run.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, inspect
from sqlalchemy import exc as sa_exc

from eventlog.errors import LogRevisionError
from eventlog.store.errors import translating
from eventlog.store.postgres import migration_lock_sql
from eventlog.store.tables import LOG_TABLES

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

HEAD_REVISION = "0004"
"""The newest revision in migrations/versions, known without loading alembic's scripts
(tests/test_schema_matches_migrations.py checks it is what alembic finds there)."""

_VERSION_SQL = "SELECT version_num FROM alembic_version"


def migrations_dir() -> Path:
    """The alembic scripts: installed as eventlog._migrations, or the source tree's migrations/."""
    spec = importlib.util.find_spec("eventlog._migrations")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parents[2] / "migrations"


def _config() -> Config:
    from alembic.config import Config

    config = Config()  # no URL: every migration runs on the connection handed over
    config.set_main_option("script_location", str(migrations_dir()))
    return config


def head_revision(engine: Engine) -> str:
    """The newest revision this program knows."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine, target: str = "") -> str | None:
    """The revision the database is at (None for an empty database); `target` names it in
    an error (a read-only SQLite engine's URL names no file)."""
    from alembic.runtime.migration import MigrationContext
    from alembic.util.exc import CommandError

    with engine.connect() as conn:
        try:
            return MigrationContext.configure(conn).get_current_revision()
        except CommandError as exc:  # alembic_version edited: more than one row, say
            shown = target or engine.url.render_as_string(hide_password=True)
            raise LogRevisionError(f"{shown}: the schema revision cannot be read ({exc})") from None


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database up to `revision` (one process at a time: see `_serialized`)."""
    from alembic import command

    config = _config()
    with engine.begin() as conn:
        _serialized(conn)
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Migrate the database down to `revision` (`base` removes every table)."""
    from alembic import command

    config = _config()
    with engine.begin() as conn:
        _serialized(conn)
        config.attributes["connection"] = conn
        command.downgrade(config, revision)


def move(engine: Engine, *, target: str, revision: str, up: bool) -> tuple[str | None, str | None]:
    """Migrate up or down to `revision` after refusing a foreign or newer database, all under
    the migration lock, so racing `db upgrade`s see one another's work; (before, after).

    The revision is resolved here and alembic is handed the id it names: alembic did
    nothing for some texts that name none (`base-1` at head) and migrated for others
    (`' -1'` below head went to head-1), and an upgrade to an earlier revision (or a
    downgrade to a later one) did nothing while the caller said "already at"."""
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    config = _config()
    with translating(target), engine.begin() as conn:
        _serialized(conn)
        before = MigrationContext.configure(conn).get_current_revision()
        _refuse_foreign_or_newer(conn, engine, target=target, current=before)
        wanted = _resolved(config, target, before or "base", revision, up)
        config.attributes["connection"] = conn
        (command.upgrade if up else command.downgrade)(config, wanted)
        after = MigrationContext.configure(conn).get_current_revision()
    return before, after


def _resolved(config: Config, target: str, current: str, revision: str, up: bool) -> str:
    """The revision `revision` names (`base` for none: no schema), or LogRevisionError:
    it names none, or one that lies the other way."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(config)
    order = ["base", *(found.revision for found in reversed(list(script.walk_revisions())))]
    wanted = _destination(script, order, current, revision)
    direction = "upgrade" if up else "downgrade"
    if wanted is None:
        raise LogRevisionError(f"{target}: cannot {direction} to {revision!r}: no such revision")
    ahead = order.index(wanted) - order.index(current)
    named = "" if wanted == revision else f"that is revision {wanted}, and "
    if up and ahead < 0:
        raise LogRevisionError(
            f"{target}: cannot upgrade to {revision!r}: {named}the log is at {current}, past "
            "it; an upgrade only moves forward",
            hint=(
                f"to move back, `eventlog db downgrade {target} {wanted}`"
                if wanted != "base"
                else "base is no schema at all: a downgrade to it drops the log, every record"
            ),
        )
    if not up and ahead > 0:
        raise LogRevisionError(
            f"{target}: cannot downgrade to {revision!r}: {named}the log is at {current}, "
            "before it; a downgrade only moves back",
            hint=f"to move forward, `eventlog db upgrade {target} --revision {wanted}`",
        )
    return wanted


def _destination(
    script: ScriptDirectory, order: list[str], current: str, revision: str
) -> str | None:
    """The revision `revision` names in this program's linear history (`order`, base first):
    an id or its prefix, head, heads, base, `REV@head`, or one of those (the current
    revision if none, `@` or `REV@`) plus or minus steps. None where it names none: no such
    revision, an ambiguous prefix, a step past either end."""
    relative = re.fullmatch(r"(.*?)(?:([+-])([0-9]{1,9}))?", revision)
    assert relative is not None  # every text matches
    anchor, sign, steps = relative.groups()
    try:  # alembic names head, heads and prefixes; base is no revision (None)
        if anchor.endswith("@") and anchor != "@":  # `REV@+1`: steps from the current one
            script.get_revision(anchor[:-1])  # of REV's branch, which is the only one here
            anchor = "@"
        found = script.get_revision(current if anchor in ("", "@") else anchor)
    except Exception:  # no such revision, an ambiguous prefix
        return None
    at = order.index("base" if found is None else found.revision)
    at += int(steps) if sign == "+" else -int(steps) if sign else 0
    return order[at] if 0 <= at < len(order) else None


def _serialized(conn: Connection) -> None:
    """Hold the migration lock for the transaction. SQLite's writer engine already holds the
    file's write lock (`BEGIN IMMEDIATE`); PostgreSQL takes an advisory lock (the run's own),
    and a named run's schema is made here, the first time its log is created."""
    if conn.dialect.name == "postgresql":
        schema = conn.get_execution_options().get("eventlog_schema")
        conn.exec_driver_sql(migration_lock_sql(schema))
        if schema is not None:
            conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')


def known_revisions(engine: Engine) -> set[str]:
    """Every revision this program's migrations define."""
    from alembic.script import ScriptDirectory

    return {rev.revision for rev in ScriptDirectory.from_config(_config()).walk_revisions()}


def refuse_foreign_or_newer(engine: Engine, *, target: str, current: str | None) -> None:
    """Refuse a database eventlog did not make, or one a newer eventlog migrated."""
    with engine.connect() as conn:
        _refuse_foreign_or_newer(conn, engine, target=target, current=current)


def _refuse_foreign_or_newer(
    conn: Connection, engine: Engine, *, target: str, current: str | None
) -> None:
    if current is None:
        found = inspect(conn)
        tables = set(found.get_table_names())
        if "events" in tables:
            raise LogRevisionError(
                f"{target}: has an events table but no alembic revision; "
                "it was not made by eventlog"
            )
        if conn.dialect.name == "sqlite":
            others = sorted({*tables, *found.get_view_names()} - set(LOG_TABLES))
            if others:
                shown = ", ".join(others[:5]) + (
                    f" and {len(others) - 5} more" if others[5:] else ""
                )
                raise LogRevisionError(
                    f"{target}: another program's database (it holds {shown}); "
                    "eventlog adds its tables to no database but its own",
                    hint="give the log a file of its own",
                )
        return
    if current not in known_revisions(engine):
        raise LogRevisionError(
            f"{target}: log is at schema revision {current}, newer than this eventlog knows "
            f"({head_revision(engine)})",
            hint="upgrade the eventlog package to open it",
        )


def ensure_at_head(engine: Engine, *, target: str, create: bool) -> None:
    """Create an empty log at head, accept one at head, refuse anything else with the fix.

    Creation is serialized across processes (SQLite's write lock, taken by the writer
    engine's `BEGIN IMMEDIATE`; a PostgreSQL advisory lock) and the revision is read again
    under it, so any number of processes may open one new log at once: one creates it, the
    others find it at head. Without `create` nothing is locked or written.
    """
    if _at_head(engine, target):
        return
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    with translating(target):
        head = head_revision(engine)
        current = current_revision(engine, target)
        if current == head:
            return
        if create and current is None:
            with engine.begin() as conn:
                _serialized(conn)
                current = MigrationContext.configure(conn).get_current_revision()
                if current == head:  # another process created it while we waited
                    return
                _refuse_foreign_or_newer(conn, engine, target=target, current=current)
                if current is None:
                    config = _config()
                    config.attributes["connection"] = conn
                    command.upgrade(config, "head")
                    return
        else:
            refuse_foreign_or_newer(engine, target=target, current=current)
        if current is None:
            raise LogRevisionError(
                f"{target}: no eventlog log here", hint=f"run `eventlog db upgrade {target}`"
            )
        raise LogRevisionError(
            f"{target}: log is at schema revision {current}, this eventlog needs {head}",
            hint=f"run `eventlog db upgrade {target}`",
        )


def _at_head(engine: Engine, target: str) -> bool:
    """Whether the log's one revision row is HEAD_REVISION, read without alembic. Anything
    else (no such table, several rows, another revision, a failing query) is False, and
    `ensure_at_head` decides with alembic as it always did."""
    with translating(target), engine.connect() as conn:
        try:
            rows = conn.exec_driver_sql(_VERSION_SQL).fetchall()
        except sa_exc.DBAPIError:
            return False
    return len(rows) == 1 and rows[0][0] == HEAD_REVISION
