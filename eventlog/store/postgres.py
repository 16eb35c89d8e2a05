"""PostgreSQL: one writer at a time through a transaction-scoped advisory lock; LISTEN/NOTIFY.

The lock serializes appenders across every process and host, so seq is gapless and equal
to commit order. NOTIFY is sent inside the writing transaction, so it is delivered exactly
when the rows become visible; subscribers still re-read, a notification is only a wake-up.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy import Engine, event

from eventlog import forks
from eventlog.errors import StorageUnavailableError
from eventlog.store import runs
from eventlog.store.tables import LOG_TABLES

Durability = Literal["full", "normal"]

LOCK_KEY = 0x6576656E746C6F67  # "eventlog" in ASCII; any constant shared by all writers
CHANNEL = "eventlog_appended"
LISTENER_NAME = "eventlog listener"
"""The application_name of the connection a reader waits for appends on."""
MIGRATION_LOCK_SQL = f"SELECT pg_advisory_xact_lock({LOCK_KEY + 1})"
"""Serializes creating and migrating a log (kept apart from the writers' lock)."""


class _PipelineExit(threading.local):
    failing = False
    """Whether this thread is leaving a pipeline whose block raised."""


_PIPELINE_EXIT = _PipelineExit()


class _QuietFailedPipelineExit(logging.Filter):
    """Drops psycopg's warning about ending a pipeline that our block left by raising (the
    error goes on to the writer); anything else psycopg logs meanwhile, and a pipeline of
    anyone else's, still gets through."""

    def filter(self, record: logging.LogRecord) -> bool:
        ours = _PIPELINE_EXIT.failing and record.msg == _TERMINATING
        return not ours


_TERMINATING = "error ignored terminating %r: %s"
"""psycopg's message (psycopg/_pipeline.py) for an error in ending a pipeline whose block
raised; a psycopg that words it otherwise warns again, and the test that pins this fails."""


logging.getLogger("psycopg").addFilter(_QuietFailedPipelineExit())


def migration_lock_sql(schema: str | None) -> str:
    """The migration lock of the run in `schema` (the default run's is MIGRATION_LOCK_SQL)."""
    return f"SELECT pg_advisory_xact_lock({runs.lock_key(LOCK_KEY + 1, schema)})"


_INSERT = (
    "INSERT INTO events (seq, stream, version, event_id, type, schema, recorded_at, payload, chain)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_INSERT_AND_NOTIFY = f"WITH written AS ({_INSERT}) SELECT pg_notify(%s, %s)"
"""The last row of a transaction and the NOTIFY of its seq: one statement fewer for the
client to send and read back (the CTE's INSERT runs whether or not the SELECT reads it)."""


class PostgresDialect:
    """`durability="normal"` turns off synchronous_commit for the writer's session only.

    `busy_timeout_ms` bounds how long a session waits for a lock (the writers' advisory lock
    included: `lock_timeout`) and for a connection; `read_only` makes every transaction
    read-only, so an audit cannot change the database whatever it runs.
    """

    name = "postgresql"
    placeholder = "%s"
    stream_kind = "split_part(stream, '/', 1)"
    insert_checks_tail = True

    def __init__(
        self,
        url: sa.URL,
        durability: Durability,
        busy_timeout_ms: int = 60_000,
        *,
        read_only: bool = False,
        schema: str | None = None,
    ) -> None:
        self.url = url
        self.schema = schema
        """The run's schema (None: the default run, in the database's own schema)."""
        self._lock_key = runs.lock_key(LOCK_KEY, schema)
        self._channel = runs.channel_for(CHANNEL, schema)
        self.durability = durability
        self.busy_timeout_ms = busy_timeout_ms
        self.read_only = read_only
        self._engines: list[Engine] = []
        self._listener: Any = None
        self._listen_head = 0
        """The head as of the listener's LISTEN: older heads were appended past unnotified."""
        self._listener_lock = threading.Lock()

    def write_engine(self) -> Engine:
        return self._engine(pool_size=1, max_overflow=4, writer=True)

    def read_engine(self) -> Engine:
        return self._engine(pool_size=4, max_overflow=16, writer=False)

    def _engine(self, *, pool_size: int, max_overflow: int, writer: bool) -> Engine:
        # lock_timeout = 0 waits forever: a busy timeout of 0 (fail at once) is the shortest
        # wait PostgreSQL has, 1 ms.
        settings = [f"SET lock_timeout = {max(1, int(self.busy_timeout_ms))}"]
        if self.schema is not None:  # the run's tables, and only those, are visible
            settings.append(f'SET search_path TO "{self.schema}"')
        if writer and self.durability == "normal":
            settings.append("SET synchronous_commit = off")
        if self.read_only:
            settings.append("SET default_transaction_read_only = on")
        engine = sa.create_engine(
            self.url,
            pool_size=pool_size,
            max_overflow=max_overflow,
            connect_args={"connect_timeout": max(1, -(-self.busy_timeout_ms // 1000))},
        )

        @event.listens_for(engine, "connect")
        def _configure(dbapi_connection: Any, _record: Any) -> None:
            with dbapi_connection.cursor() as cursor:
                for statement in settings:
                    cursor.execute(statement)
            dbapi_connection.commit()

        engine.update_execution_options(eventlog_schema=self.schema)
        self._engines.append(engine)
        return engine

    def writer_connection(self, dbapi: Any) -> None:
        """Autocommit, so that the writer sends BEGIN itself: psycopg's implicit BEGIN
        waits for its reply, a round trip of its own before the pipeline."""
        dbapi.autocommit = True

    def begin_write(self, cursor: Any) -> None:
        """The lock is transaction-scoped: released by the transaction's end."""
        cursor.execute("BEGIN")
        cursor.execute(f"SELECT pg_advisory_xact_lock({self._lock_key})")

    def commit_write(self, cursor: Any) -> None:
        cursor.execute("COMMIT")

    @contextlib.contextmanager
    def pipeline(self, dbapi: Any) -> Iterator[None]:
        """psycopg's pipeline mode: statements are sent at once, results read at the first
        fetch; the server still runs them in order, each seeing what committed before it.

        A statement refused inside it (another writer's row where the writer guessed its own
        tail: normal traffic when several write) leaves the pipeline aborted, and psycopg
        logged "error ignored terminating <Pipeline>" at WARNING for each one on leaving it;
        the refusal itself goes on to the writer, which plans again or reports it."""
        with contextlib.ExitStack() as stack:
            stack.callback(_PIPELINE_EXIT.__setattr__, "failing", False)  # after it exited
            stack.enter_context(dbapi.pipeline())
            try:
                yield
            except BaseException:
                _PIPELINE_EXIT.failing = True  # until the pipeline above has exited
                raise

    def write_rows(self, cursor: Any, rows: list[tuple[Any, ...]], last_seq: int) -> None:
        if len(rows) > 1:
            cursor.executemany(_INSERT, rows[:-1])
        cursor.execute(_INSERT_AND_NOTIFY, (*rows[-1], self._channel, str(int(last_seq))))

    def wait_for_append(self, after_seq: int, timeout: float) -> None:
        import psycopg

        with self._listener_lock:
            if self._listener is None:
                self._listener, self._listen_head = self._listen()
            listener, listened_at = self._listener, self._listen_head
        try:
            # Appends committed before the LISTEN notified no one: the head read once
            # listening answers every waiter that had read an older one (they slept out
            # their timeout).
            if after_seq < listened_at:
                return
            for _ in listener.notifies(timeout=timeout, stop_after=1):
                break
        except psycopg.Error:
            # A lost connection (a server restart): the next wait listens afresh, and this
            # caller gets the typed error (SqlStore.wait_for_append translates it).
            with self._listener_lock:
                if self._listener is listener:
                    self._listener = None
            listener.close()
            raise

    def _listen(self) -> tuple[Any, int]:
        """A connection listening on the run's channel, and the head as of its LISTEN."""
        import psycopg

        conninfo = self.url.set(drivername="postgresql").render_as_string(hide_password=False)
        connect_s = max(1, round(self.busy_timeout_ms / 1000))  # libpq: whole seconds
        listener = psycopg.connect(
            conninfo,
            autocommit=True,
            connect_timeout=connect_s,
            application_name=LISTENER_NAME,  # what pg_stat_activity shows of it
        )
        try:
            listener.execute(f'LISTEN "{self._channel}"')
            table = "events" if self.schema is None else f'"{self.schema}".events'
            row = listener.execute(f"SELECT max(seq) FROM {table}").fetchone()
        except BaseException:
            listener.close()
            raise
        return listener, int(row[0]) if row and row[0] is not None else 0

    def backup(self, engine: Engine, dest: Path) -> None:
        """The documented recipe: `pg_dump --format=custom` of the whole database (tables,
        the append-only triggers and their function), one consistent snapshot; restore it
        with `pg_restore --dbname=NEW DEST`. A named run's backup holds its schema only."""
        pg_dump = _find_client("pg_dump")
        url = self.url.set(drivername="postgresql")
        env = dict(os.environ)
        if url.password is not None:  # never on a command line others can read
            env["PGPASSWORD"] = str(url.password)
        conninfo = url.set(password=None).render_as_string(hide_password=False)
        partial = dest.with_name(dest.name + ".partial")
        only = [] if self.schema is None else [f"--schema={self.schema}"]
        try:
            done = subprocess.run(
                [
                    pg_dump,
                    "--format=custom",
                    "--no-owner",
                    *only,
                    f"--file={partial}",
                    f"--dbname={conninfo}",
                ],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise StorageUnavailableError(
                    f"pg_dump failed (exit {done.returncode}): {' '.join(done.stderr.split())}"
                )
            partial.rename(dest)
        except BaseException:  # a failed or stopped backup leaves no half-written archive
            partial.unlink(missing_ok=True)
            raise

    def find_damaged(self, engine: Engine, from_seq: int) -> tuple[int, str, str] | None:
        """PostgreSQL enforces column types: a stored value always reads back."""
        return None

    def dispose(self) -> None:
        with self._listener_lock:
            if self._listener is not None:
                self._listener.close()
                self._listener = None
        for engine in self._engines:
            engine.dispose()

    def after_fork_in_child(self) -> None:
        forks.keep(self._listener)
        self._listener, self._listener_lock = None, threading.Lock()
        forks.abandon_pools(self._engines)


WRITER_PRIVILEGES = {
    "events": "SELECT, INSERT",
    "log_meta": "SELECT",
    "snapshots": "SELECT, INSERT, DELETE",  # a projection cache, replaced in place; not evidence
    "alembic_version": "SELECT",
}
AUDITOR_PRIVILEGES = dict.fromkeys(LOG_TABLES, "SELECT")


def grant_roles(engine: Engine, *, writer: str | None, auditor: str | None) -> dict[str, str]:
    """Give `writer` INSERT/SELECT and `auditor` SELECT on the log, and nothing more.

    Roles are created (LOGIN, no password: set one, or use another authentication) when
    missing. Their privileges on the log's tables are reset first, so granting again is the
    same as granting once. Returns, per role, what it may do.
    """
    from psycopg import sql

    wanted = {
        name: privileges
        for name, privileges in ((writer, WRITER_PRIVILEGES), (auditor, AUDITOR_PRIVILEGES))
        if name is not None
    }
    granted: dict[str, str] = {}
    with engine.begin() as conn:
        dbapi: Any = conn.connection.dbapi_connection
        cursor = dbapi.cursor()
        cursor.execute("SELECT current_database(), current_schema(), current_user")
        database, schema, owner = cursor.fetchone()
        for name, privileges in wanted.items():
            role = sql.Identifier(name)
            cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (name,))
            found = cursor.fetchone()
            if name == owner or (found is not None and found[0]):
                raise ValueError(
                    f"role {name!r} owns the log or is a superuser: privileges cannot limit it"
                )
            if found is None:
                cursor.execute(sql.SQL("CREATE ROLE {} LOGIN").format(role))
            cursor.execute(
                sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database), role)
            )
            cursor.execute(
                sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), role)
            )
            for table, allowed in privileges.items():
                target = sql.Identifier(schema, table)
                cursor.execute(sql.SQL("REVOKE ALL ON {} FROM {}").format(target, role))
                cursor.execute(sql.SQL("GRANT " + allowed + " ON {} TO {}").format(target, role))
            granted[name] = "; ".join(
                f"{allowed} on {table}" for table, allowed in privileges.items()
            )
        for table in LOG_TABLES:
            cursor.execute(
                sql.SQL("REVOKE ALL ON {} FROM PUBLIC").format(sql.Identifier(schema, table))
            )
        cursor.close()
    return granted


def _find_client(name: str) -> str:
    """A PostgreSQL client program: EVENTLOG_PG_BINDIR, PATH, then Debian's versioned folders."""
    folder = os.environ.get("EVENTLOG_PG_BINDIR")
    candidates = [str(Path(folder) / name)] if folder else []
    on_path = shutil.which(name)
    if on_path:
        candidates.append(on_path)
    candidates += sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    for candidate in candidates:  # one this user may not run is passed over (exit 70 was)
        if Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise StorageUnavailableError(
        f"{name} not found (looked in EVENTLOG_PG_BINDIR, PATH, /usr/lib/postgresql/*/bin)",
        hint="install the PostgreSQL client programs, or set EVENTLOG_PG_BINDIR",
    )
