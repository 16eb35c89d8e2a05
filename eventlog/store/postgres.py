"""PostgreSQL: one writer at a time through a transaction-scoped advisory lock; LISTEN/NOTIFY.

The lock serializes appenders across every process and host, so seq is gapless and equal
to commit order. NOTIFY is sent inside the writing transaction, so it is delivered exactly
when the rows become visible; subscribers still re-read, a notification is only a wake-up.
"""

from __future__ import annotations

import threading
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy import Engine, event

Durability = Literal["full", "normal"]

LOCK_KEY = 0x6576656E746C6F67  # "eventlog" in ASCII; any constant shared by all writers
CHANNEL = "eventlog_appended"

_INSERT = (
    "INSERT INTO events (seq, stream, version, event_id, type, schema, recorded_at, payload, chain)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
)


class PostgresDialect:
    """`durability="normal"` turns off synchronous_commit for the writer's session only."""

    name = "postgresql"
    insert_sql = _INSERT
    placeholder = "%s"

    def __init__(self, url: sa.URL, durability: Durability) -> None:
        self.url = url
        self.durability = durability
        self._engines: list[Engine] = []
        self._listener: Any = None
        self._listener_lock = threading.Lock()

    def write_engine(self) -> Engine:
        engine = sa.create_engine(self.url, pool_size=1, max_overflow=4)
        if self.durability == "normal":

            @event.listens_for(engine, "connect")
            def _relaxed(dbapi_connection: Any, _record: Any) -> None:
                with dbapi_connection.cursor() as cursor:
                    cursor.execute("SET synchronous_commit = off")
                dbapi_connection.commit()

        self._engines.append(engine)
        return engine

    def read_engine(self) -> Engine:
        engine = sa.create_engine(self.url, pool_size=4, max_overflow=16)
        self._engines.append(engine)
        return engine

    def begin_write(self, cursor: Any) -> None:
        """The first statement opens the transaction; the lock is released by its end."""
        cursor.execute(f"SELECT pg_advisory_xact_lock({LOCK_KEY})")

    def after_write(self, cursor: Any, last_seq: int) -> None:
        cursor.execute(f"SELECT pg_notify('{CHANNEL}', '{int(last_seq)}')")

    def wait_for_append(self, after_seq: int, timeout: float) -> None:
        import psycopg

        with self._listener_lock:
            if self._listener is None:
                conninfo = self.url.set(drivername="postgresql").render_as_string(
                    hide_password=False
                )
                self._listener = psycopg.connect(conninfo, autocommit=True)
                self._listener.execute(f"LISTEN {CHANNEL}")
            listener = self._listener
        for _ in listener.notifies(timeout=timeout, stop_after=1):
            break

    def dispose(self) -> None:
        with self._listener_lock:
            if self._listener is not None:
                self._listener.close()
                self._listener = None
        for engine in self._engines:
            engine.dispose()
