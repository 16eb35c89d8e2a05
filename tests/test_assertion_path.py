"""What a request without events (an assertion: a fenced command's epoch check) costs an
append: it is checked like any expected version, and adds no row, no link and no statement.

Issue 8's fencing puts one in front of every ledger command's requests; these pin what
keeps it cheap, so that the saving cannot silently disappear.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eventlog import NO_STREAM, AppendRequest, ConcurrencyError, EventLog
from eventlog.store.sqlite import SqliteDialect
from tests.vocabulary import LogNote


@pytest.fixture
def log(log_target: str) -> Iterator[EventLog]:
    with EventLog.open(log_target) as opened:
        yield opened


def test_an_assertion_in_front_of_a_request_links_nothing_and_still_fails_the_batch(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fenced finalize-shaped append (assertion + one request of two events): only the
    two events are linked; with the assertion's version wrong, nothing is appended."""
    import eventlog.chain

    log.append("epoch", [LogNote(text="epoch 1")], NO_STREAM)
    linked: list[int] = []
    link_rows = eventlog.chain.link_rows

    def counting(previous: bytes, fields: Any, rows: Any) -> bytes:
        linked.append(len(fields))
        return link_rows(previous, fields, rows)

    monkeypatch.setattr(eventlog.chain, "link_rows", counting)
    two = [LogNote(text="finalized"), LogNote(text="cleared")]
    fence, request = AppendRequest("epoch", [], 0), AppendRequest("group/g1", two, NO_STREAM)
    results = log.append_batch([fence, request])
    assert linked == [2]
    assert [(r.stream, r.seqs, r.versions) for r in results] == [
        ("epoch", [], []),
        ("group/g1", [2, 3], [0, 1]),
    ]
    with pytest.raises(ConcurrencyError) as refused:
        log.append_batch([AppendRequest("epoch", [], 1), AppendRequest("group/g1", two, 1)])
    assert refused.value.stream == "epoch"
    assert log.head() == 3 and log.verify().ok


def test_an_assertion_on_a_stream_the_writer_knows_adds_no_statement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer knows the versions its own commits left, so the epoch check of a fenced
    command is a comparison in memory: the fenced append sends exactly the statements of
    the unfenced one (no version read for the asserted stream)."""
    statements: list[str] = []
    begin = SqliteDialect.begin_write

    def tracing(self: SqliteDialect, cursor: Any) -> None:
        connection = cursor.connection
        assert isinstance(connection, sqlite3.Connection)
        connection.set_trace_callback(statements.append)
        begin(self, cursor)

    monkeypatch.setattr(SqliteDialect, "begin_write", tracing)
    with EventLog.open(tmp_path / "log.db") as log:
        log.append("epoch", [LogNote(text="epoch 1")], NO_STREAM)
        log.append("group/g1", [LogNote(text="first")], NO_STREAM)
        statements.clear()
        log.append("group/g1", [LogNote(text="unfenced")], 0)
        unfenced = list(statements)
        statements.clear()
        log.append_batch(
            [AppendRequest("epoch", [], 0), AppendRequest("group/g1", [LogNote(text="f")], 1)]
        )
        fenced = list(statements)
    assert not any("max(version)" in s for s in fenced)
    assert [s.split()[0] for s in fenced] == [s.split()[0] for s in unfenced]
    assert len(fenced) == len(unfenced)
