"""A throwaway PostgreSQL server for the benchmarks, started with the test suite's recipe.

The start/stop code lives in tests/fixtures/postgres.py (initdb and pg_ctl as the `postgres`
user via runuser when we are root, 127.0.0.1 on a free port, stop by PID); this module only
turns its pytest skips into a reason string so the benchmark can print it and go on.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PgServer:
    host: str
    port: int
    user: str
    pid: int
    bindir: Path

    def conninfo(self, dbname: str) -> str:
        return f"host={self.host} port={self.port} user={self.user} dbname={dbname}"

    def url(self, dbname: str) -> str:
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{dbname}"


class PgUnavailable(Exception):
    """No server could be started; the message says why."""


@contextlib.contextmanager
def pg_server() -> Iterator[PgServer]:
    """Start a fresh cluster, yield it, stop it by PID and delete its files."""
    try:
        import psycopg  # noqa: F401
        import pytest

        from tests.fixtures import postgres as fixture
    except ImportError as exc:
        raise PgUnavailable(f"cannot import the PostgreSQL recipe or psycopg: {exc}") from exc
    bindir = fixture.find_pg_bindir()
    if bindir is None:
        raise PgUnavailable(
            "no PostgreSQL server binaries (looked in /usr/lib/postgresql/*/bin and on PATH)"
        )
    # The recipe reports a missing prerequisite through pytest.skip / pytest.fail.
    outcomes = (pytest.skip.Exception, pytest.fail.Exception)
    try:
        workdir = fixture._make_workdir()
    except outcomes as exc:
        raise PgUnavailable(str(exc)) from None
    server = None
    try:
        try:
            server = fixture._start(bindir, workdir)
        except (Exception, *outcomes) as exc:
            raise PgUnavailable(f"the server did not start: {exc}") from None
        yield PgServer(server.host, server.port, server.user, server.pid, bindir)
    finally:
        if server is not None:
            fixture._stop(server.pid)
        shutil.rmtree(workdir, ignore_errors=True)
