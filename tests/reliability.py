"""Helpers the reliability tests share: another process holding the log's write lock."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from eventlog.log import resolve_url
from eventlog.store.postgres import LOCK_KEY, PostgresDialect
from eventlog.store.sqlite import SqliteDialect

_SQLITE_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()
conn.execute("ROLLBACK")
"""

_POSTGRES_HOLDER = f"""
import psycopg, sys
conn = psycopg.connect(sys.argv[1])
conn.execute("SELECT pg_advisory_xact_lock({LOCK_KEY})")
print("locked", flush=True)
sys.stdin.read()
conn.rollback()
"""


def libpq_url(target: str) -> str:
    """A SQLAlchemy PostgreSQL URL as psycopg's conninfo."""
    url = resolve_url(target).set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


@contextmanager
def write_lock_held(target: str) -> Iterator[None]:
    """Another process holds the log's write lock until the block ends (stopped by PID)."""
    if "://" in target:
        code, argument = _POSTGRES_HOLDER, libpq_url(target)
    else:
        code, argument = _SQLITE_HOLDER, target
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), argument],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        yield
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        try:
            holder.wait(timeout=10)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()


_DROP_APPEND_ONLY = {
    "sqlite": (
        "DROP TRIGGER IF EXISTS events_no_update",
        "DROP TRIGGER IF EXISTS events_no_delete",
    ),
    "postgresql": ("ALTER TABLE events DISABLE TRIGGER USER",),
}


def drop_append_only(conn: sa.Connection | sqlite3.Connection) -> None:
    """Remove the append-only triggers, as someone tampering with the log would first."""
    if isinstance(conn, sqlite3.Connection):
        for statement in _DROP_APPEND_ONLY["sqlite"]:
            conn.execute(statement)
        return
    for statement in _DROP_APPEND_ONLY[conn.dialect.name]:
        conn.exec_driver_sql(statement)


def signal_at_begin(patches: pytest.MonkeyPatch, began: threading.Event) -> None:
    """Set `began` whenever a writer opens its transaction (on either backend), then open
    it: a test sees the writer take a batch, not a pause that hopes it has."""
    for dialect in (SqliteDialect, PostgresDialect):

        def beginning(
            self: Any, cursor: Any, begin: Callable[[Any, Any], None] = dialect.begin_write
        ) -> None:
            began.set()
            begin(self, cursor)

        patches.setattr(dialect, "begin_write", beginning)


def calls_recorded(patches: pytest.MonkeyPatch, method: str) -> list[object]:
    """Every call of a dialect's `method` (either backend), by its argument, from now on; each
    call goes on to the method itself."""
    calls: list[object] = []

    def recording(own: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def recorded(self: Any, argument: Any) -> None:
            calls.append(argument)
            own(self, argument)

        return recorded

    for dialect in (SqliteDialect, PostgresDialect):
        patches.setattr(dialect, method, recording(getattr(dialect, method)))
    return calls


def wait_until(condition: Callable[[], bool], deadline_s: float = 60.0) -> None:
    """Poll `condition` from a thread until it holds."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, "the awaited condition never held"
        time.sleep(0.005)


async def until(condition: Callable[[], bool], deadline_s: float = 60.0) -> None:
    """Poll `condition` on the loop (other tasks run meanwhile) until it holds."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, "the awaited condition never held"
        await asyncio.sleep(0.005)
