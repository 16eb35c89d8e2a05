"""How a read reaches the database: pinned as behaviour (speed itself is measured in bench/)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from eventlog import AppendRequest, EventLog
from tests.vocabulary import LogNote


@pytest.fixture
def log(log_target: str) -> Iterator[EventLog]:
    with EventLog.open(log_target) as opened:
        for start in range(0, 30, 10):
            opened.append_batch(
                [
                    AppendRequest(f"s{i % 3}", [LogNote(text=str(i))])
                    for i in range(start, start + 10)
                ]
            )
        yield opened


def test_reads_run_on_the_driver_cursor_without_sqlalchemy_statements(log: EventLog) -> None:
    """SQLAlchemy's statement compilation and Row objects cost more per record than the
    read itself: every read call goes to the driver with a prebuilt SQL string."""
    executed: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        executed.append(statement)

    sa.event.listen(sa.Engine, "before_cursor_execute", record)
    try:
        assert [r.event for r in log.read(page_size=7)] == [LogNote(text=str(i)) for i in range(30)]
        assert len(list(log.read(streams=["s1"], types=["LogNote"], page_size=4))) == 10
        assert len(list(log.read(stream_prefix="s2", until_seq=20))) == 6
        assert [r.version for r in log.read_stream("s0")] == list(range(10))
        assert len(list(log.read_stream_backwards("s0", page_size=3))) == 10
        assert log.last_seq(types=["LogNote"], stream_prefix="s1") == 29
    finally:
        sa.event.remove(sa.Engine, "before_cursor_execute", record)
    assert executed == []
