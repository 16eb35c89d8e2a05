"""How an append reaches the database: the work each one costs, pinned as behaviour.

Speed itself is measured in bench/ (ratios in one run); these tests pin the mechanisms the
figures rest on, so an optimisation cannot silently disappear.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from eventlog import NO_STREAM, EventLog
from eventlog.store.postgres import PostgresDialect
from eventlog.store.sqlite import SqliteDialect
from tests.vocabulary import LogNote


@pytest.fixture
def log(log_target: str) -> Iterator[EventLog]:
    with EventLog.open(log_target) as opened:
        yield opened


def test_an_uncontended_append_commits_in_its_callers_thread(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Handing each append to the writer thread cost a thread wake-up per call."""
    threads: list[str] = []
    dialect = SqliteDialect if log.backend == "sqlite" else PostgresDialect
    begin = dialect.begin_write

    def recording(self: Any, cursor: Any) -> None:
        threads.append(threading.current_thread().name)
        begin(self, cursor)

    monkeypatch.setattr(dialect, "begin_write", recording)
    for index in range(30):
        log.append(f"s{index}", [LogNote(text="x")], NO_STREAM)
    assert threads == [threading.current_thread().name] * 30
