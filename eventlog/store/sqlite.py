"""SQLite: one file in WAL mode; `BEGIN IMMEDIATE` is the write lock, shared across processes."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import urllib.parse
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy import Connection, Engine, event

from eventlog import forks
from eventlog.errors import LogClosedError, LogRevisionError, StorageUnavailableError
from eventlog.store.tables import LOG_TABLES

Durability = Literal["full", "normal"]

_INSERT = (
    "INSERT INTO events (seq, stream, version, event_id, type, schema, recorded_at, payload, chain)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


# The storage type each column holds when eventlog wrote it (SQLite's typeof()).
_TYPES = (
    ("stream", "text"),
    ("version", "integer"),
    ("event_id", "blob"),
    ("type", "text"),
    ("schema", "integer"),
    ("recorded_at", "integer"),
    ("payload", "blob"),
    ("chain", "blob"),
)
_TYPEOF_SQL = (
    "SELECT seq, "
    + ", ".join(f"typeof({column})" for column, _ in _TYPES)
    + ", stream, type FROM events WHERE seq >= ? ORDER BY seq"
)


_NO_PIPELINE = contextlib.nullcontext()
"""A reusable context that does nothing (making one per transaction cost more than it)."""


class SqliteDialect:
    """WAL + synchronous=FULL by default: a returned append survives power loss.

    `read_only` opens the file with SQLite's `mode=ro`: nothing (not even the journal mode)
    is written, so an audit leaves the file's bytes as they were, or is refused. Without
    `create`, `mode=rw`: a missing file is refused, not made.
    """

    name = "sqlite"
    placeholder = "?"
    stream_kind = "substr(stream, 1, instr(stream || '/', '/') - 1)"
    insert_checks_tail = True

    def __init__(
        self,
        url: sa.URL,
        durability: Durability,
        busy_timeout_ms: int = 60_000,
        *,
        read_only: bool = False,
        create: bool = True,
    ) -> None:
        self.url = url
        self.path = Path(url.database or "")
        self.durability = durability
        self.busy_timeout_ms = busy_timeout_ms
        self.read_only = read_only
        self.create = create
        self._engines: list[Engine] = []

    def _create_engine(self, pool_size: int, max_overflow: int) -> Engine:
        if not self.create and not self.read_only:
            _refuse_missing(self.path, self.url)
        _refuse_unopenable(self.path, self.read_only)
        if not self.read_only:
            url = self.url if self.create else self._existing_file_url()
            return sa.create_engine(url, pool_size=pool_size, max_overflow=max_overflow)
        uri = f"file:{urllib.parse.quote(str(self.path))}?mode=ro"
        if _on_read_only_medium(self.path):
            # SQLite cannot open a WAL log read-only where it may not create the -shm index;
            # on a medium nobody can write, `immutable` is exact (no -wal to miss: checked).
            uri += "&immutable=1"
        else:
            _refuse_without_shm(self.path)

        def connect() -> sqlite3.Connection:
            return sqlite3.connect(uri, uri=True, check_same_thread=False)

        return sa.create_engine(
            "sqlite://",
            creator=connect,
            poolclass=sa.QueuePool,
            pool_size=pool_size,
            max_overflow=max_overflow,
        )

    def _existing_file_url(self) -> sa.URL:
        """The file's URL in SQLite's URI form with `mode=rw`: a file removed since
        `_refuse_missing` looked is refused, not made (the connect hook's journal switch
        would write a new log's first page)."""
        return self.url.set(
            database=f"file:{urllib.parse.quote(str(self.path))}"
        ).update_query_dict({"mode": "rw", "uri": "true"})

    def write_engine(self) -> Engine:
        # One pooled connection for the writer thread; IMMEDIATE takes the file's write lock
        # at BEGIN, so the head we read is the head we extend, whatever other processes do.
        engine = self._create_engine(pool_size=1, max_overflow=4)
        self._install(engine, "BEGIN IMMEDIATE")
        return engine

    def read_engine(self) -> Engine:
        engine = self._create_engine(pool_size=4, max_overflow=16)
        self._install(engine, "BEGIN")
        return engine

    def _install(self, engine: Engine, begin: str) -> None:
        synchronous = "FULL" if self.durability == "full" else "NORMAL"
        busy = self.busy_timeout_ms
        read_only = self.read_only

        @event.listens_for(engine, "connect")
        def _configure(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute(f"PRAGMA busy_timeout = {busy}")
            # Neither an audit nor a refused open of another program's database may switch
            # a file's journal mode (a persistent change of the file).
            if not read_only and not _holds_others_tables(cursor):
                _switch_to_wal(cursor, busy)
            cursor.execute(f"PRAGMA synchronous = {synchronous}")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            conn.exec_driver_sql(begin)

        self._engines.append(engine)

    def writer_connection(self, dbapi: Any) -> None:
        """Already in autocommit mode (isolation_level None): BEGIN and COMMIT are ours."""

    def begin_write(self, cursor: Any) -> None:
        """IMMEDIATE takes the file's write lock at BEGIN, whatever other processes do."""
        cursor.execute("BEGIN IMMEDIATE")

    def commit_write(self, cursor: Any) -> None:
        cursor.execute("COMMIT")

    def pipeline(self, dbapi: Any) -> contextlib.AbstractContextManager[Any]:
        """In-process: a statement's reply costs no round trip."""
        return _NO_PIPELINE

    def write_rows(self, cursor: Any, rows: list[tuple[Any, ...]], last_seq: int) -> None:
        """Readers poll: nothing to announce."""
        cursor.executemany(_INSERT, rows)

    def wait_for_append(self, after_seq: int, timeout: float) -> None:
        # Polling is what SQLite offers across processes; 20 ms keeps tail latency low
        # while costing one indexed max(seq) lookup per poll.
        time.sleep(min(timeout, 0.02))

    def backup(self, engine: Engine, dest: Path) -> None:
        """Copy the log with SQLite's online backup API, in one step: one read transaction,
        so the copy is one consistent state while writers go on (WAL never blocks them)."""
        partial = dest.with_name(dest.name + ".partial")
        partial.unlink(missing_ok=True)
        try:
            with engine.connect() as conn:
                source = conn.connection.dbapi_connection
                assert isinstance(source, sqlite3.Connection)
                copy = sqlite3.connect(partial)
                try:
                    source.backup(copy, pages=-1)
                finally:
                    copy.close()
            with open(partial, "rb") as written:  # durable before it takes the final name
                os.fsync(written.fileno())
            partial.rename(dest)
        except BaseException:  # a failed backup leaves no half-written copy beside dest
            partial.unlink(missing_ok=True)
            raise

    def find_damaged(self, engine: Engine, from_seq: int) -> tuple[int, str, str] | None:
        """Scan with typeof() and raw bytes, which never fail to decode, for the first bad row."""
        with engine.connect() as conn:
            dbapi = conn.connection.dbapi_connection
            assert isinstance(dbapi, sqlite3.Connection)
            saved = dbapi.text_factory
            dbapi.text_factory = bytes
            try:
                cursor = dbapi.execute(_TYPEOF_SQL, (from_seq,))
                for seq, *found in cursor:
                    for (column, wanted), stored in zip(_TYPES, found, strict=False):
                        if stored.decode() != wanted:
                            return seq, column, stored.decode().upper()
                    for column, value in (("stream", found[-2]), ("type", found[-1])):
                        try:
                            value.decode("utf-8")
                        except UnicodeDecodeError:
                            return seq, column, "TEXT that is not UTF-8"
            finally:
                dbapi.text_factory = saved
        return None

    def dispose(self) -> None:
        for engine in self._engines:
            engine.dispose()

    def after_fork_in_child(self) -> None:
        """SQLite keeps a process's locks on a file in memory shared by every connection to
        it, which the child copied as they were at the fork: no connection of the child's
        could trust them. The inherited log refuses, naming the way that works."""
        forks.abandon_pools(
            self._engines,
            LogClosedError(
                f"{self.path}: this log was opened in the parent of this forked process, "
                "and SQLite cannot be used across a fork",
                hint="open the log in a process started with the 'spawn' or 'forkserver' "
                "method (multiprocessing.get_context), or in the parent only after forking",
            ),
        )


def _on_read_only_medium(path: Path) -> bool:
    """True when the file sits on a read-only mount (nobody can write it) and no -wal is
    pending. Lacking write permission is not enough: the owner may still be appending."""
    wal = path.with_name(path.name + "-wal")
    try:
        read_only = bool(os.statvfs(path.parent).f_flag & os.ST_RDONLY)
        return read_only and not (wal.exists() and wal.stat().st_size > 0)
    except OSError:
        return False


def _refuse_unopenable(path: Path, read_only: bool) -> None:
    """SQLite answers "unable to open database file" whatever stops it: a log this user may
    not read, or a new one in a folder it may not write, is named with its cause."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))  # not blocking: a FIFO hung
    except PermissionError as exc:
        raise StorageUnavailableError(
            f"{path}: this user may not read the log ({exc.strerror})",
            hint="run as a user who may read it and its folder, or audit a copy",
        ) from None
    except FileNotFoundError:
        folder = path.parent
        if not read_only and folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
            raise StorageUnavailableError(
                f"{path}: this user may not create the log in {folder} (permission denied)",
                hint="choose a folder this user may write",
            ) from None
    except OSError:  # anything else: the driver's own error names it
        return


def _refuse_missing(path: Path, url: sa.URL) -> None:
    """A log that must exist and does not is named as `migrate` names it (no eventlog log
    here), before SQLite is asked to open it."""
    if not path.exists():
        shown = url.render_as_string(hide_password=True)
        raise LogRevisionError(
            f"{shown}: no eventlog log here", hint=f"run `eventlog db upgrade {shown}`"
        )


def _refuse_without_shm(path: Path) -> None:
    """A WAL log with no -shm beside it, in a folder this user cannot write: SQLite would
    have to create the -shm to read it and answers "attempt to write a readonly database",
    which names no cause a reader can act on. Reading it as immutable instead is not safe:
    the log's owner may start appending meanwhile."""
    shm = path.with_name(path.name + "-shm")
    try:
        with path.open("rb") as file:
            header = file.read(20)
    except OSError:
        return  # the driver names what is wrong with the file itself
    wal_mode = len(header) == 20 and header[18:20] == b"\x02\x02"
    if wal_mode and not shm.exists() and not os.access(path.parent, os.W_OK):
        raise StorageUnavailableError(
            f"{path}: cannot read this log here: SQLite reads a WAL log through its index "
            f"{shm.name}, which is not there, and this user cannot create it in "
            f"{path.parent}",
            hint="audit a copy in a folder you can write (`cp` the log, and its -wal if there "
            "is one), or audit as a user who may write that folder",
        )


_OTHERS_TABLE_SQL = (
    "SELECT 1 FROM sqlite_master WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite\\_%'"
    " ESCAPE '\\' AND name NOT IN ({}) LIMIT 1".format(
        ", ".join(f"'{t}'" for t in sorted(LOG_TABLES))
    )
)


def _holds_others_tables(cursor: sqlite3.Cursor) -> bool:
    """Whether the file is another program's database (`migrate` refuses to make a log
    there)."""
    return cursor.execute(_OTHERS_TABLE_SQL).fetchone() is not None


def _switch_to_wal(cursor: sqlite3.Cursor, busy_ms: int) -> None:
    """`PRAGMA journal_mode = WAL`, retried while another connection holds the file busy.

    SQLite answers SQLITE_BUSY at once, without calling its busy handler, where waiting could
    deadlock (several processes opening one new log together: seen as "database is locked"
    in 5 of 10 racing opens), so the busy timeout is applied here.
    """
    deadline = time.monotonic() + busy_ms / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            busy = getattr(exc, "sqlite_errorname", "") in ("SQLITE_BUSY", "SQLITE_LOCKED")
            if not busy or time.monotonic() >= deadline:
                raise
            time.sleep(0.005)
