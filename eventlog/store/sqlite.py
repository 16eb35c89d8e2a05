"""SQLite: one file in WAL mode; `BEGIN IMMEDIATE` is the write lock, shared across processes."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy import Connection, Engine, event

Durability = Literal["full", "normal"]

_INSERT = (
    "INSERT INTO events (seq, stream, version, event_id, type, schema, recorded_at, payload, chain)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


class SqliteDialect:
    """WAL + synchronous=FULL by default: a returned append survives power loss."""

    name = "sqlite"
    insert_sql = _INSERT
    placeholder = "?"

    def __init__(self, url: sa.URL, durability: Durability, busy_timeout_ms: int = 60_000) -> None:
        self.url = url
        self.path = Path(url.database or "")
        self.durability = durability
        self.busy_timeout_ms = busy_timeout_ms
        self._engines: list[Engine] = []

    def write_engine(self) -> Engine:
        # One pooled connection for the writer thread; IMMEDIATE takes the file's write lock
        # at BEGIN, so the head we read is the head we extend, whatever other processes do.
        engine = sa.create_engine(self.url, pool_size=1, max_overflow=4)
        self._install(engine, "BEGIN IMMEDIATE")
        return engine

    def read_engine(self) -> Engine:
        engine = sa.create_engine(self.url, pool_size=4, max_overflow=16)
        self._install(engine, "BEGIN")
        return engine

    def _install(self, engine: Engine, begin: str) -> None:
        synchronous = "FULL" if self.durability == "full" else "NORMAL"
        busy = self.busy_timeout_ms

        @event.listens_for(engine, "connect")
        def _configure(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute(f"PRAGMA busy_timeout = {busy}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute(f"PRAGMA synchronous = {synchronous}")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            conn.exec_driver_sql(begin)

        self._engines.append(engine)

    def begin_write(self, cursor: Any) -> None:
        """IMMEDIATE takes the file's write lock at BEGIN, whatever other processes do."""
        cursor.execute("BEGIN IMMEDIATE")

    def after_write(self, cursor: Any, last_seq: int) -> None:
        """Readers poll; nothing to announce."""

    def wait_for_append(self, after_seq: int, timeout: float) -> None:
        # Polling is what SQLite offers across processes; 20 ms keeps tail latency low
        # while costing one indexed max(seq) lookup per poll.
        time.sleep(min(timeout, 0.02))

    def dispose(self) -> None:
        for engine in self._engines:
            engine.dispose()
