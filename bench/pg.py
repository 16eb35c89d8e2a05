"""A throwaway PostgreSQL server for the benchmarks, started with the test suite's recipe.

The start/stop code is `eventlog.testing.postgres_server` (initdb and pg_ctl as the `postgres`
user via runuser when we are root, 127.0.0.1 on a free port, stop by PID); this module only
turns a server that cannot start into a reason the benchmark prints before it goes on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from eventlog.testing.postgres_server import PostgresServer, PostgresUnavailable, running_server

PgServer = PostgresServer


class PgUnavailable(Exception):
    """No server could be started; the message says why."""


@contextlib.contextmanager
def pg_server() -> Iterator[PostgresServer]:
    """Start a fresh cluster, yield it, stop it by PID and delete its files."""
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(running_server())
        except PostgresUnavailable as exc:
            raise PgUnavailable(str(exc)) from None
        except Exception as exc:  # initdb or pg_ctl failed: the message carries their output
            raise PgUnavailable(f"the server did not start: {exc}") from None
        yield server
