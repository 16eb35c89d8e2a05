"""The implementations compared: eventlog, the raw driver, and the eventsourcing library.

Each appender executes `Call`s from bench.workload. The raw appenders do the work eventlog
must do for the same rows (msgpack encoding, time-ordered event ids, the sha256 chain, the
same table, indexes and pragmas) with nothing else: no version lookups, no idempotency
checks, no SQLAlchemy. They keep head, chain and versions in memory, which is only sound
for a single process, and so are a lower bound on the cost of these inserts.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import msgspec

from bench.workload import Call
from eventlog import AppendRequest, EventLog
from eventlog.ids import new_event_id
from eventlog.log import Durability

_INSERT_COLUMNS = "seq, stream, version, event_id, type, schema, recorded_at, payload, chain"
_GENESIS = bytes(32)


class Appender(Protocol):
    """One implementation, open on one fresh store."""

    def append(self, call: Call) -> None:
        """Append the call's events durably (per the durability setting) before returning."""

    def commits(self) -> int | None:
        """Transactions committed so far, where the implementation counts them."""

    def close(self) -> None: ...


class AsyncAppender(Appender, Protocol):
    async def append_async(self, call: Call) -> None: ...


# -- eventlog -------------------------------------------------------------------------------


class EventLogAppender:
    """The log as a controller uses it: exact expected versions, group commit behind it."""

    def __init__(self, target: str | Path, durability: Durability) -> None:
        self.target = target
        self.log = EventLog.open(target, durability=durability)

    def append(self, call: Call) -> None:
        if len(call) == 1:
            request = call[0]
            self.log.append(request.stream, request.events, request.expected)
        else:
            self.log.append_batch([AppendRequest(r.stream, r.events, r.expected) for r in call])

    async def append_async(self, call: Call) -> None:
        if len(call) == 1:
            request = call[0]
            await self.log.append_async(request.stream, request.events, request.expected)
        else:
            await self.log.append_batch_async(
                [AppendRequest(r.stream, r.events, r.expected) for r in call]
            )

    def commits(self) -> int | None:
        return self.log.commits

    def close(self) -> None:
        self.log.close()


# -- raw drivers ----------------------------------------------------------------------------


class _RowBuilder:
    """Rows exactly as eventlog stores them, built from in-memory head, chain and versions."""

    def __init__(self) -> None:
        self.head = 0
        self.chain = _GENESIS
        self._encode = msgspec.msgpack.Encoder().encode

    def rows(self, call: Call) -> list[tuple[Any, ...]]:
        encode = self._encode
        recorded_at = time.time_ns()
        rows: list[tuple[Any, ...]] = []
        head, link = self.head, self.chain
        for request in call:
            for offset, event in enumerate(request.events):
                head += 1
                fields = (
                    head,
                    request.stream,
                    request.first_version + offset,
                    new_event_id().bytes,
                    type(event).__name__,
                    type(event).schema,
                    recorded_at,
                    encode(event),
                )
                link = hashlib.sha256(link + encode(fields)).digest()
                rows.append((*fields, link))
        self.head, self.chain = head, link
        return rows


class RawSqliteAppender:
    """sqlite3 executemany, one transaction per call; concurrent callers take turns."""

    def __init__(self, path: Path, durability: Durability) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA busy_timeout = 60000")
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute(f"PRAGMA synchronous = {'FULL' if durability == 'full' else 'NORMAL'}")
        self._sql = f"INSERT INTO events ({_INSERT_COLUMNS}) VALUES ({', '.join('?' * 9)})"
        self._rows = _RowBuilder()
        self._lock = threading.Lock()
        self._commits = 0

    def append(self, call: Call) -> None:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.executemany(self._sql, self._rows.rows(call))
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
            self._commits += 1

    def commits(self) -> int | None:
        return self._commits

    def close(self) -> None:
        self._conn.close()


class RawPsycopgAppender:
    """psycopg 3 executemany (pipelined), one transaction per call; callers take turns."""

    def __init__(self, conninfo: str) -> None:
        import psycopg

        self._conn = psycopg.connect(conninfo)
        self._sql = f"INSERT INTO events ({_INSERT_COLUMNS}) VALUES ({', '.join(['%s'] * 9)})"
        self._rows = _RowBuilder()
        self._lock = threading.Lock()
        self._commits = 0

    def append(self, call: Call) -> None:
        with self._lock, self._conn.transaction(), self._conn.cursor() as cursor:
            cursor.executemany(self._sql, self._rows.rows(call))
        self._commits += 1

    def commits(self) -> int | None:
        return self._commits

    def close(self) -> None:
        self._conn.close()


def raw_read_decode(target: str | Path) -> int:
    """The driver's scan of every record, each payload decoded by msgspec into its event:
    the floor under `EventLog.read` (which also checks each row and builds its record)."""
    from eventlog.events import event_types

    decoders = {name: msgspec.msgpack.Decoder(cls) for name, cls in event_types().items()}
    sql = f"SELECT {_INSERT_COLUMNS} FROM events WHERE seq >= {{m}} ORDER BY seq LIMIT 1000"

    def scan(page: Callable[[int], list[Any]]) -> int:
        count, next_seq = 0, 1
        while True:
            rows = page(next_seq)
            for row in rows:
                decoders[row[4]].decode(row[7])
            count += len(rows)
            if len(rows) < 1000:
                return count
            next_seq = rows[-1][0] + 1

    if "://" in str(target):
        import psycopg

        url = str(target).replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(url) as conn:
            return scan(lambda seq: conn.execute(sql.format(m="%s"), (seq,)).fetchall())
    with sqlite3.connect(target) as sconn:
        return scan(lambda seq: sconn.execute(sql.format(m="?"), (seq,)).fetchall())


# -- the eventsourcing library --------------------------------------------------------------


def _stored_events(call: Call, encode: Any) -> list[Any]:
    from eventsourcing.persistence import StoredEvent

    return [
        StoredEvent(
            originator_id=request.stream,
            originator_version=request.first_version + offset,
            topic=type(event).__name__,
            state=encode(event),
        )
        for request in call
        for offset, event in enumerate(request.events)
    ]


class EventsourcingAppender:
    """eventsourcing 9's application recorder: one `insert_events` (one transaction) per call.

    Streams are its originator ids (text), versions its originator versions, the msgpack
    payload its stored state. It keeps no hash chain and no event ids.
    """

    def __init__(self, recorder: Any, datastore: Any) -> None:
        self._recorder = recorder
        self._datastore = datastore
        self._encode = msgspec.msgpack.Encoder().encode
        self._commits = 0
        self._lock = threading.Lock()

    @classmethod
    def sqlite(cls, path: Path, durability: Durability, writers: int) -> EventsourcingAppender:
        from eventsourcing.sqlite import (
            SQLiteApplicationRecorder,
            SQLiteConnection,
            SQLiteConnectionPool,
            SQLiteDatastore,
        )

        synchronous = "FULL" if durability == "full" else "NORMAL"

        class Pool(SQLiteConnectionPool):
            """The library's pool, with the same synchronous pragma as the other rows."""

            def _create_connection(self) -> SQLiteConnection:
                connection = super()._create_connection()
                connection.cursor().execute(f"PRAGMA synchronous = {synchronous}")
                return connection

        size = max(2, writers)
        datastore = SQLiteDatastore(str(path), originator_id_type="text", lock_timeout=60)
        datastore.pool.close()
        datastore.pool = Pool(
            db_name=str(path), lock_timeout=60, pool_size=size, max_overflow=0, pool_timeout=120
        )
        recorder = SQLiteApplicationRecorder(datastore)
        recorder.create_table()
        return cls(recorder, datastore)

    @classmethod
    def postgres(
        cls, host: str, port: int, user: str, dbname: str, writers: int
    ) -> EventsourcingAppender:
        from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore

        datastore = PostgresDatastore(
            dbname,
            host,
            port,
            user,
            "",
            pool_size=min(max(2, writers), 16),
            max_overflow=0,
            connect_timeout=120,
            originator_id_type="text",
        )
        recorder = PostgresApplicationRecorder(datastore)
        recorder.create_table()
        return cls(recorder, datastore)

    def append(self, call: Call) -> None:
        self._recorder.insert_events(_stored_events(call, self._encode))
        with self._lock:
            self._commits += 1

    def commits(self) -> int | None:
        return self._commits

    def close(self) -> None:
        self._datastore.close()
