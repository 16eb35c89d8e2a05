"""How a read reaches the database: pinned as behaviour (speed itself is measured in bench/)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from eventlog import AppendRequest, EventLog, InvalidEventError
from eventlog.events import Event, event_type
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
        assert log.stream_version("s0") == 9
        assert log.stream_versions(["s1", "nope"]) == {"s1": 9, "nope": None}
        assert log.versions_between(1, 30) == {"s0": 9, "s1": 9, "s2": 9}
    finally:
        sa.event.remove(sa.Engine, "before_cursor_execute", record)
    assert executed == []


def test_the_next_seq_the_log_holds_within_bounds(log: EventLog) -> None:
    """What replay --json and export start each chunk at, on every backend: one index seek."""
    assert [log.next_seq(1), log.next_seq(17), log.next_seq(30), log.next_seq(31)] == [
        1,
        17,
        30,
        None,
    ]
    assert (log.next_seq(5, 4), log.next_seq(5, 5), log.next_seq(2**63 - 1)) == (None, 5, None)


def test_stream_versions_of_many_streams_at_once_and_of_a_seq_range(log: EventLog) -> None:
    """What a restore and a rebuild ask instead of one stream_version per stream, or instead
    of reading every record for its version. Record i (seq i + 1) is stream s{i % 3},
    version i // 3."""
    many = [f"x{i}" for i in range(1200)] + ["s2", "s0"]  # more than one query's worth
    assert log.stream_versions(many) == {**dict.fromkeys(many), "s2": 9, "s0": 9}
    assert log.stream_versions([]) == {}
    # seqs 4..8 are records 3..7: s0 versions 1, 2; s1 versions 1, 2; s2 version 1.
    assert log.versions_between(4, 8) == {"s0": 2, "s1": 2, "s2": 1}
    assert log.versions_between(31, 40) == {}


def test_whole_log_audit_reads_give_the_records_columns(log: EventLog) -> None:
    """`read_rows`, `read_payloads` and `counts` (what stats, report and export read) give
    what `read_records` holds, up to the bound asked for, on every backend."""
    records = list(log.read_records())
    assert [(r.seq, r.stream, r.event_id.bytes, r.payload) for r in records] == [
        (row[0], row[1], row[3], row[7]) for row in log.read_rows()
    ]
    assert list(log.read_payloads(2, 25)) == [
        (r.seq, r.type, r.schema, r.recorded_at, r.payload) for r in records[1:25]
    ]
    kinds = [("LogNote", "s0", 7, 1), ("LogNote", "s1", 7, 2), ("LogNote", "s2", 6, 3)]
    assert sorted(log.counts(20)) == kinds


@event_type
class ReadPathMark(Event, frozen=True, kw_only=True):
    """A second type, for reads that keep only some types."""

    n: int


def test_payload_reads_keep_only_the_types_asked_for_across_pages(log: EventLog) -> None:
    """What a rebuild reads (`fold_records`): only the columns it decodes, only the types
    the fold handles, in seq order over several pages, on every backend."""
    log.append_batch([AppendRequest("marks", [ReadPathMark(n=i) for i in range(7)])])
    log.append_batch([AppendRequest("s0", [LogNote(text="after")], expected_version=9)])
    records = list(log.read_records())
    marks = [(r.seq, r.type, r.schema, r.recorded_at, r.payload) for r in records[30:37]]
    assert list(log.read_payloads(types=["ReadPathMark"], page_size=3)) == marks
    both = list(log.read_payloads(5, 36, types=["ReadPathMark", "LogNote"], page_size=4))
    assert [row[0] for row in both] == list(range(5, 37))
    notes = list(log.read_payloads(types=["LogNote", "Nope"], page_size=2))
    assert [row[0] for row in notes] == [*range(1, 31), 38]
    assert list(log.read_payloads(types=[])) == []


BAD_READS: dict[str, tuple[Callable[[EventLog], Iterable[object]], str]] = {
    "read page_size=0": (lambda log: log.read(page_size=0), "page_size"),
    "read page_size=-1": (lambda log: log.read(page_size=-1), "page_size"),
    "read_rows page_size=0": (lambda log: log.read_rows(page_size=0), "page_size"),
    "read_payloads page_size=0": (lambda log: log.read_payloads(page_size=0), "page_size"),
    "backwards page_size=0": (
        lambda log: log.read_stream_backwards("s0", page_size=0),
        "page_size",
    ),
    "read_stream from 2**63": (lambda log: log.read_stream("s0", 2**63), "from_version"),
    "read_stream from -2**63-1": (lambda log: log.read_stream("s0", -(2**63) - 1), "from_version"),
    "backwards before 2**63": (
        lambda log: log.read_stream_backwards("s0", 2**63),
        "before_version",
    ),
}


@pytest.mark.parametrize("case", BAD_READS)
def test_a_page_below_one_record_or_a_version_no_stream_reaches_is_an_input_error(
    log: EventLog, case: str
) -> None:
    """A page of no records would never move on, and a version beyond a 64-bit integer
    is no driver's to bind: both are the caller's mistake, named, not an IndexError or
    OverflowError from inside the store."""
    read, named = BAD_READS[case]
    with pytest.raises(InvalidEventError, match=named):
        list(read(log))


def test_the_smallest_page_and_the_widest_versions_still_read(log: EventLog) -> None:
    assert [r.seq for r in log.read(page_size=1)] == list(range(1, 31))
    assert [r.version for r in log.read_stream_backwards("s0", page_size=1)][:2] == [9, 8]
    assert list(log.read_stream("s0", 2**63 - 1)) == []
    assert len(list(log.read_stream("s0", -(2**63) + 1))) == 10
    assert len(list(log.read_stream_backwards("s0", 2**63 - 1))) == 10
