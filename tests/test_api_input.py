"""Bad input to the public API gets a typed error naming what was wrong, and writes nothing:
no bare TypeError, ValueError or driver error, no file made, no record or snapshot stored."""

from __future__ import annotations

import asyncio
import enum
import errno
import math
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from eventlog import EventLog
from eventlog.errors import InputError, InvalidEventError, LogClosedError, LogRevisionError
from eventlog.records import Proposed
from tests.vocabulary import LogNote

Call = Callable[[EventLog], object]


def _first_of_subscription(log: EventLog, **arguments: Any) -> object:
    """The first record `subscribe` yields (it checks its arguments on the first one); a
    subscription that waits instead fails the test after a few seconds, not never."""

    async def first() -> object:
        async for record in log.subscribe(**arguments):
            return record
        return None

    return asyncio.run(asyncio.wait_for(first(), timeout=5))


# -- a closed log --------------------------------------------------------------------------

CLOSED_CALLS: dict[str, Call] = {
    "head": lambda log: log.head(),
    "read": lambda log: list(log.read()),
    "read_payloads": lambda log: list(log.read_payloads(1, 1)),
    "stream_version": lambda log: log.stream_version("s"),
    "save_snapshot": lambda log: log.save_snapshot("p", 1, b"state"),
    "load_snapshot": lambda log: log.load_snapshot("p"),
    "wait_for_append": lambda log: log.wait_for_append(1, 0.01),
    "subscribe": _first_of_subscription,
    "verify": lambda log: log.verify(),
    "info": lambda log: log.info(),
    "tail_chain": lambda log: log.tail_chain(),
    "seq_of": lambda log: log.seq_of(uuid.uuid4()),
    "read_stream": lambda log: list(log.read_stream("s")),
    "last_seq": lambda log: log.last_seq(),
    "counts": lambda log: log.counts(1),
    "backup": lambda log: log.backup("/nonexistent-folder/copy.db"),  # (refused, or fails)
}


@pytest.mark.parametrize("call", CLOSED_CALLS.values(), ids=CLOSED_CALLS.keys())
def test_a_closed_log_refuses_every_read_and_write_and_stores_nothing(
    log_target: str, call: Call
) -> None:
    log = EventLog.open(log_target)
    log.append("s", [LogNote(text="x")])
    log.close()
    with pytest.raises(LogClosedError, match="the log is closed"):
        call(log)
    log.close()  # a second close is still nothing
    with EventLog.open(log_target) as reopened:
        assert reopened.head() == 1
        assert reopened.load_snapshot("p") is None


# -- snapshots -----------------------------------------------------------------------------

BAD_SNAPSHOTS = {
    "seq str": ("p", "x", b"state", "seq must be an int seq, found str 'x'"),
    "seq bool": ("p", True, b"state", "seq must be an int seq, found bool"),
    "seq huge": ("p", 2**70, b"state", f"seq {2**70} is beyond"),
    "seq negative": ("p", -1, b"state", r"seq -1 is not in 0\.\.1"),
    "seq past head": ("p", 2, b"state", r"seq 2 is not in 0\.\.1 \(the log's head\)"),
    "payload str": ("p", 1, "state", "payload must be bytes, found str 'state'"),
    "name surrogate": ("\udc00", 1, b"state", r"snapshot name must be UTF-8 .* '\\udc00'"),
    "name empty": ("", 1, b"state", "snapshot name must not be empty"),
    "name int": (5, 1, b"state", "snapshot name must be UTF-8 text .* found int 5"),
}


@pytest.mark.parametrize(
    ("name", "seq", "payload", "message"), BAD_SNAPSHOTS.values(), ids=BAD_SNAPSHOTS.keys()
)
def test_a_snapshot_with_a_bad_argument_is_refused_naming_it_and_stores_nothing(
    log: EventLog, name: Any, seq: Any, payload: Any, message: str
) -> None:
    log.append("s", [LogNote(text="x")])
    with pytest.raises(InvalidEventError, match=message):
        log.save_snapshot(name, seq, payload)
    assert log.load_snapshot("p") is None  # and every later load still works


def test_a_snapshot_payload_may_be_any_bytes_like_value(log: EventLog) -> None:
    log.append("s", [LogNote(text="x")])
    log.save_snapshot("p", 0, bytearray(b"zero"))
    log.save_snapshot("p", 1, memoryview(b"one"))
    assert log.load_snapshot("p") == (1, b"one")
    assert log.load_snapshot("p", 0) == (0, b"zero")


@pytest.mark.parametrize(
    ("name", "at", "message"),
    [
        ("p", "x", "at_or_before_seq must be an int seq, found str 'x'"),
        ("p", 2**70, f"at_or_before_seq {2**70} is beyond"),
        (None, None, "snapshot name must be UTF-8 text .* found NoneType None"),
    ],
    ids=["seq str", "seq huge", "name None"],
)
def test_a_snapshot_load_with_a_bad_argument_is_refused_naming_it(
    log: EventLog, name: Any, at: Any, message: str
) -> None:
    with pytest.raises(InvalidEventError, match=message):
        log.load_snapshot(name, at)


# -- opening -------------------------------------------------------------------------------


def test_opening_a_missing_log_without_create_leaves_no_file(tmp_path: Path) -> None:
    with pytest.raises(LogRevisionError, match=r"absent\.db: no eventlog log here"):
        EventLog.open(tmp_path / "absent.db", create=False)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_log_opens_without_create_whatever_its_file_name_holds(
    tmp_path: Path,
) -> None:
    """Without `create` the file is opened by SQLite's URI form (`mode=rw`), in which `%`,
    `?` and `#` mean something: they must still name the file they name as a path."""
    target = tmp_path / "run 100%20?#1.db"
    with EventLog.open(target) as log:
        log.append("s", [LogNote(text="x")])
    with EventLog.open(target, create=False) as log:
        assert log.append("s", [LogNote(text="y")]).seqs == [2]
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (None, "target must be a path .* found NoneType None"),
        (5, "target must be a path .* found int 5"),
        (b"run.db", "target must be a path .* found bytes b'run.db'"),
        ("a\x00b.db", r"'a\\x00b.db': a file name cannot hold a NUL character"),
        ("a\udc00b.db", r"'a\\udc00b.db': a file name must be UTF-8 text"),
    ],
    ids=["None", "int", "bytes", "NUL", "surrogate"],
)
def test_a_target_that_names_no_openable_file_is_refused_and_makes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: Any, message: str
) -> None:
    monkeypatch.chdir(tmp_path)  # where `str(target)` would have made the file
    with pytest.raises(InputError, match=message):
        EventLog.open(target)
    assert list(tmp_path.iterdir()) == []


# -- appends -------------------------------------------------------------------------------


def test_a_retry_that_lists_one_chosen_id_twice_is_refused_and_writes_nothing(
    log: EventLog,
) -> None:
    chosen = uuid.uuid4()
    note = Proposed(LogNote(text="x", n=1), chosen)
    assert log.append("s", [note]).seqs == [1]
    with pytest.raises(InvalidEventError, match=f"event id {chosen} appears twice in one append"):
        log.append("s", [note, note])
    assert log.head() == 1
    assert log.append("s", [note]).seqs == [1]  # the retry as it was sent is still answered


class _Name(str):
    """A str subclass, as an application's own name type may be."""


class _Streams(enum.StrEnum):
    ORDERS = "orders"


@pytest.mark.parametrize("stream", [_Name("orders"), _Streams.ORDERS], ids=["subclass", "enum"])
def test_a_stream_named_by_a_str_subclass_is_appended_as_its_text(
    log: EventLog, stream: str
) -> None:
    result = log.append(stream, [LogNote(text="x")])
    assert type(result.stream) is str and result.stream == "orders"
    assert [(type(r.stream), r.stream) for r in log.read()] == [(str, "orders")]


def _nested(depth: int) -> list[object]:
    outer: list[object] = []
    inner = outer
    for _ in range(depth):
        inner.append([])
        inner = inner[0]  # type: ignore[assignment]
    return outer


def _cyclic() -> list[object]:
    holder: list[object] = []
    holder.append(holder)
    return holder


@pytest.mark.parametrize("value", [_cyclic(), _nested(100_000)], ids=["cyclic", "deep"])
def test_an_event_too_deep_to_encode_is_refused_naming_it_and_writes_nothing(
    log: EventLog, value: list[object]
) -> None:
    # msgspec checks no field type when a struct is built in code: `text` holds a list
    with pytest.raises(InvalidEventError, match=r"stream 's': item 0: LogNote: .*recursion"):
        log.append("s", [LogNote(text=value)])  # type: ignore[arg-type]
    assert log.head() == 0


# -- reads and waits -----------------------------------------------------------------------

BAD_ARGUMENTS: dict[str, tuple[Call, str]] = {
    "read streams str": (lambda log: list(log.read(streams="ab")), "streams must be a list"),
    "read types str": (lambda log: list(log.read(types="LogNote")), "types must be a list"),
    "stream_versions str": (lambda log: log.stream_versions("ab"), "streams must be a list"),
    "last_seq types str": (lambda log: log.last_seq(types="LogNote"), "types must be a list"),
    "subscribe streams str": (
        lambda log: _first_of_subscription(log, from_seq=5, streams="ab"),  # (caught up)
        "streams must be a list",
    ),
    "read from_seq str": (lambda log: list(log.read("1")), "from_seq must be an int seq"),  # type: ignore[arg-type]
    "read from_seq None": (lambda log: list(log.read(None)), "from_seq must be an int seq"),  # type: ignore[arg-type]
    "read_records until_seq str": (
        lambda log: list(log.read_records(1, "2")),  # type: ignore[arg-type]
        "until_seq must be an int seq",
    ),
    "read_rows from_seq str": (lambda log: list(log.read_rows("1")), "from_seq must be an int"),  # type: ignore[arg-type]
    "read_payloads from_seq None": (
        lambda log: list(log.read_payloads(None)),  # type: ignore[arg-type]
        "from_seq must be an int seq",
    ),
    "next_seq str": (lambda log: log.next_seq("1"), "from_seq must be an int seq"),  # type: ignore[arg-type]
    "counts str": (lambda log: log.counts("1"), "until_seq must be an int seq"),  # type: ignore[arg-type]
    "versions_between None": (
        lambda log: log.versions_between(None, 2),  # type: ignore[arg-type]
        "from_seq must be an int seq",
    ),
    "subscribe from_seq str": (
        lambda log: _first_of_subscription(log, from_seq="1"),
        "from_seq must be an int seq",
    ),
    "seq_of str": (lambda log: log.seq_of("abc"), "event_id must be a uuid.UUID, found str"),  # type: ignore[arg-type]
    "seq_of None": (lambda log: log.seq_of(None), "event_id must be a uuid.UUID, found None"),  # type: ignore[arg-type]
    "stream_version list": (
        lambda log: log.stream_version(["s"]),  # type: ignore[arg-type]
        r"stream must be UTF-8 text .* found list \['s'\]",
    ),
    "read stream_prefix int": (
        lambda log: list(log.read(stream_prefix=5)),  # type: ignore[arg-type]
        "stream_prefix must be UTF-8 text .* found int 5",
    ),
    "read streams surrogate": (
        lambda log: list(log.read(streams=["\udc00"])),
        r"a name in streams must be UTF-8 text .* '\\udc00'",
    ),
    "read types surrogate": (
        lambda log: list(log.read(types=["\udc00"])),
        r"a name in types must be UTF-8 text .* '\\udc00'",
    ),
    "read stream_prefix surrogate": (
        lambda log: list(log.read(stream_prefix="\udc00")),
        r"stream_prefix must be UTF-8 text .* '\\udc00'",
    ),
    "read_stream surrogate": (
        lambda log: list(log.read_stream("\udc00")),
        r"stream must be UTF-8 text .* '\\udc00'",
    ),
    "stream_version surrogate": (
        lambda log: log.stream_version("\udc00"),
        r"stream must be UTF-8 text .* '\\udc00'",
    ),
    "last_seq types surrogate": (
        lambda log: log.last_seq(types=["\udc00"]),
        r"a name in types must be UTF-8 text .* '\\udc00'",
    ),
    "wait_for_append negative": (
        lambda log: log.wait_for_append(0, -1),
        "timeout must be a number of seconds in 0..86400, found -1",
    ),
    "wait_for_append nan": (
        lambda log: log.wait_for_append(0, math.nan),
        "timeout must be a number of seconds in 0..86400, found nan",
    ),
    "subscribe poll_interval negative": (
        lambda log: _first_of_subscription(log, from_seq=5, poll_interval=-1),
        "poll_interval must be a number of seconds in 0..86400, found -1",
    ),
}


@pytest.mark.parametrize(("call", "message"), BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
def test_a_read_or_wait_with_a_bad_argument_is_refused_naming_it(
    log: EventLog, call: Call, message: str
) -> None:
    log.append("s", [LogNote(text="x")])
    with pytest.raises(InvalidEventError, match=message):
        call(log)
    assert log.head() == 1


def test_a_backup_into_an_existing_folder_is_refused_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "backups"
    folder.mkdir()
    with EventLog.open(tmp_path / "run.db") as log:
        log.append("s", [LogNote(text="x")])
        with pytest.raises(InputError, match=f"{folder}: the backup destination is a folder"):
            log.backup(folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backups", "run.db"]
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize(
    ("dest", "message"),
    [
        (None, "dest must be a path .* found NoneType None"),
        ("copy\x00.db", r"'copy\\x00.db': a file name cannot hold a NUL character"),
    ],
    ids=["None", "NUL"],
)
def test_a_backup_to_no_file_name_is_refused_and_makes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dest: Any, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with EventLog.open(tmp_path / "run.db") as log:
        log.append("s", [LogNote(text="x")])
        with pytest.raises(InputError, match=message):
            log.backup(dest)
    assert [p.name for p in tmp_path.iterdir()] == ["run.db"]


def test_a_backup_that_fails_midway_leaves_no_partial_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with EventLog.open(tmp_path / "run.db") as log:
        log.append("s", [LogNote(text="x")])
        monkeypatch.setattr(os, "fsync", full_disk)  # the copy is written, then not made durable
        with pytest.raises(OSError, match="No space left"):
            log.backup(tmp_path / "copy.db")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.db"]


def test_an_existing_log_opened_without_create_keeps_the_url_s_own_options(
    tmp_path: Path,
) -> None:
    """A missing file is refused, not made, through SQLite's `mode=rw`; the options the URL
    carried (here the driver's timeout) are kept beside it, not replaced."""
    import sqlalchemy as sa

    from eventlog.store.sqlite import SqliteDialect

    path = tmp_path / "run.db"
    EventLog.open(path).close()
    url = sa.make_url(f"sqlite:///{path}?timeout=7")
    engine = SqliteDialect(url, "full", create=False).write_engine()
    assert (engine.url.query["timeout"], engine.url.query["mode"]) == ("7", "rw")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM events").scalar_one() == 0
    engine.dispose()
