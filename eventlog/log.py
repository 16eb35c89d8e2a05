"""EventLog: the one object a controller, a worker or a tool opens to use a log."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal
from uuid import UUID

import sqlalchemy as sa

from eventlog import codec, collector
from eventlog.errors import InputError, InvalidEventError, LogClosedError
from eventlog.events import Event
from eventlog.ids import uuid_from_bytes
from eventlog.records import (
    ANY,
    NO_STREAM,
    AppendRequest,
    AppendResult,
    ExpectedVersion,
    Proposed,
    Record,
    RecordedEvent,
    StreamState,
)
from eventlog.store import migrate, runs
from eventlog.store.base import (
    EXPECT_ANY,
    EXPECT_NO_STREAM,
    LOG_CLOSED,
    PayloadRow,
    PreparedEvent,
    PreparedRequest,
    RecordRow,
    SqlStore,
    Submission,
    check_seconds,
    check_seq,
    checked_names,
    storable_text,
)
from eventlog.verify import VerifyReport, verify_records
from eventlog.writer import GroupCommitWriter

Durability = Literal["full", "normal"]

MAX_STREAM_LENGTH = 512

FEW_EVENTS = 8
"""An append of up to this many events to one stream leaves the collector as it is: pausing
it (a lock and two switches, twice) cost a single append more than the handful of objects
such an append makes could cost a collection. A commit that holds others' events still
pauses it (`GroupCommitWriter`)."""


def _pauses_collector(requests: Sequence[AppendRequest]) -> bool:
    """Whether an append pauses the collector (whatever it is handed: `_encode` names what
    is wrong with it)."""
    if requests.__class__ is not list or len(requests) != 1:
        return True
    events = getattr(requests[0], "events", None)
    return events.__class__ not in (list, tuple) or len(events) > FEW_EVENTS


def expanded_path(text: str) -> Path:
    """A path with `~` or `~user` expanded; a user this host does not know is named (its
    RuntimeError was no typed error)."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        raise InputError(f"{text}: cannot expand {text.split('/')[0]}: no such user") from None


def _path_text(name: str, value: object) -> str:
    """A path argument as text: a str or an os.PathLike of one (`str()` of None or of a
    number named a file in the current folder)."""
    text = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(text, str):
        raise InputError(
            f"{name} must be a path (a str or an os.PathLike), found "
            f"{type(value).__name__} {value!r:.60}"
        )
    return text


def _check_file_name(shown: str, name: str) -> None:
    """SQLite opens a file by its UTF-8 name, which holds no NUL (else a bare ValueError or
    UnicodeEncodeError)."""
    if storable_text(name):
        return
    if "\x00" in name:
        raise InputError(f"{shown!r}: a file name cannot hold a NUL character")
    raise InputError(f"{shown!r}: a file name must be UTF-8 text (it holds a lone surrogate)")


def resolve_url(target: str | Path) -> sa.URL:
    """A SQLAlchemy URL for a file path or a URL; PostgreSQL always goes through psycopg 3."""
    text = _path_text("target", target)
    if "://" not in text:  # a path, not a URL: `%20`, `?` and `#` are part of its name
        _check_file_name(text, text)
        return sa.URL.create("sqlite", database=str(expanded_path(text).resolve()))
    try:
        url = sa.make_url(text)
        url.port  # noqa: B018  (a port that is not a number raises here, not at connect)
    except (sa.exc.ArgumentError, ValueError) as exc:
        raise InputError(f"{_without_password(text)}: not a log location ({exc})") from None
    if url.drivername.startswith("sqlite") and not url.database:
        raise InputError(f"{text}: an SQLite URL needs a file (sqlite:///path/to/run.db)")
    if url.drivername.startswith("sqlite"):
        _check_file_name(_without_password(text), url.database or "")
    backend, _, driver = url.drivername.partition("+")
    if backend == "postgres":  # SQLAlchemy's other name for it
        backend = "postgresql"
        url = url.set(drivername=f"postgresql+{driver}" if driver else "postgresql")
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
        driver = "psycopg"
    if driver and (backend, driver) not in (("sqlite", "pysqlite"), ("postgresql", "psycopg")):
        # another driver's module may not even be installed (an import error, exit 70)
        raise InputError(
            f"{_without_password(text)}: driver {driver!r} is not supported "
            "(use sqlite:///path or postgresql://, which goes through psycopg 3)"
        )
    return url


def _without_password(text: str) -> str:
    """A URL as an error shows it: `user:secret@` becomes `user:***@`."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", text)


DEFAULT_BUSY_TIMEOUT = 60.0


def open_store(
    target: str | Path,
    durability: Durability = "full",
    *,
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
    read_only: bool = False,
    run: str | None = None,
    create: bool = True,
) -> SqlStore:
    """The store for a target, without checking its schema revision.

    `run` (or `?run=` in a PostgreSQL URL) selects one run's log among several in one
    database (eventlog.store.runs); the store then sees that run's records only. Without
    `create`, a missing SQLite file is refused, not made.
    """
    if durability not in ("full", "normal"):
        raise InvalidEventError(f"durability must be 'full' or 'normal', found {durability!r}")
    check_seconds("busy_timeout", busy_timeout)
    busy_ms = int(busy_timeout * 1000)
    url, run = runs.split_run(resolve_url(target), run)
    schema = runs.schema_for(run)
    shown = url.render_as_string(hide_password=True)
    if run is not None:
        shown = url.update_query_dict({runs.RUN_PARAM: run}).render_as_string(hide_password=True)
    backend = url.get_backend_name()
    if backend == "sqlite":
        from eventlog.store.sqlite import SqliteDialect

        sqlite = SqliteDialect(url, durability, busy_ms, read_only=read_only, create=create)
        return SqlStore(sqlite, shown)
    if backend == "postgresql":
        from eventlog.store.postgres import PostgresDialect

        dialect = PostgresDialect(url, durability, busy_ms, read_only=read_only, schema=schema)
        return SqlStore(dialect, shown)
    raise InvalidEventError(f"{shown}: unsupported backend {backend!r} (use SQLite or PostgreSQL)")


class EventLog:
    """An append-only, hash-chained log of events, durable when `append` returns."""

    def __init__(self, store: SqlStore, *, count_cpu: bool = False) -> None:
        self._store = store
        self._writer = GroupCommitWriter(store)
        self._closed = False
        self._count_cpu = count_cpu
        self._caller_cpu_seconds = 0.0
        # A thread's CPU clock is a system call: two on every append, for a benchmark's sake.
        self._cpu_clock: Callable[[], float] = time.thread_time if count_cpu else float

    @classmethod
    def open(
        cls,
        target: str | Path,
        *,
        durability: Durability = "full",
        create: bool = True,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        read_only: bool = False,
        run: str | None = None,
        count_cpu: bool = False,
    ) -> EventLog:
        """Open a log by file path (SQLite) or SQLAlchemy URL; a new log starts at head.

        `busy_timeout` (seconds) bounds how long an append waits for another writer's lock
        (or a connection) before it fails with StorageUnavailableError. `read_only` opens
        the log for audits: nothing is created, migrated or changed, and appends fail.
        `run` (or `?run=NAME` in the URL) opens one run's log of several sharing a
        PostgreSQL database; it reads and writes that run's records only. `count_cpu`
        keeps `cpu_seconds` (for benchmarks: it costs each append two clock readings).
        """
        store = open_store(
            target,
            durability,
            busy_timeout=busy_timeout,
            read_only=read_only,
            run=run,
            create=create,
        )
        try:
            migrate.ensure_at_head(
                store.engine, target=store.target, create=create and not read_only
            )
        except BaseException:
            store.close()
            raise
        return cls(store, count_cpu=count_cpu)

    # -- appending -------------------------------------------------------------------------

    def append(
        self,
        stream: str,
        events: Sequence[Event | Proposed],
        expected_version: ExpectedVersion = ANY,
    ) -> AppendResult:
        """Append events to one stream atomically, if it is at `expected_version`."""
        return self.append_batch([AppendRequest(stream, events, expected_version)])[0]

    def append_batch(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        """Append to several streams in one atomic step: every request lands, or none."""
        # The cyclic collector rests while the call encodes, plans and writes (`collector`),
        # unless it is a few events.
        pausing = _pauses_collector(requests)
        if pausing:
            collector.pause()
        started = self._cpu_clock()  # the caller's CPU: encoding, and any commit it leads
        try:
            return self._writer.write(self._encode(requests))
        finally:
            self._caller_cpu_seconds += self._cpu_clock() - started
            if pausing:
                collector.resume()

    async def append_async(
        self,
        stream: str,
        events: Sequence[Event | Proposed],
        expected_version: ExpectedVersion = ANY,
    ) -> AppendResult:
        """`append` for asyncio: waits for the shared commit without blocking the loop."""
        # Not through `append_batch_async`: one coroutine per append, not two.
        return (await self._queue_async([AppendRequest(stream, events, expected_version)]))[0]

    async def append_batch_async(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        return await self._queue_async(requests)

    def _queue_async(self, requests: Sequence[AppendRequest]) -> asyncio.Future[list[AppendResult]]:
        """Encode and queue for the writer thread; the future resolves on the running loop."""
        pausing = _pauses_collector(requests)  # while encoding and queueing, if at all:
        if pausing:  # never across the caller's await
            collector.pause()
        started = self._cpu_clock()
        try:
            return self._writer.submit_async(self._encode(requests))
        finally:
            self._caller_cpu_seconds += self._cpu_clock() - started
            if pausing:
                collector.resume()

    def _encode(self, requests: Sequence[AppendRequest]) -> Submission:
        if self._closed:
            raise LogClosedError(LOG_CLOSED)
        prepared: Submission = []
        encode = codec.encode
        new_tuple = tuple.__new__  # a NamedTuple's own __new__ is a Python call per event
        if requests.__class__ is not list and not isinstance(requests, Iterable):
            raise InvalidEventError(
                f"append_batch takes AppendRequests, found {type(requests).__name__}"
            )
        for request in requests:
            if request.__class__ is not AppendRequest and not isinstance(request, AppendRequest):
                raise InvalidEventError(
                    f"append_batch takes AppendRequests, found {type(request).__name__} "
                    f"{request!r:.60}"
                )
            stream = request.stream
            if (
                stream.__class__ is not str
                or not 0 < len(stream) <= MAX_STREAM_LENGTH
                or not stream.isprintable()  # (a NUL is not printable)
            ):
                stream = check_stream(stream)
            expected = request.expected_version
            if expected.__class__ is int and expected >= 0:
                code = expected
            elif isinstance(expected, StreamState):
                code = EXPECT_NO_STREAM if expected is NO_STREAM else EXPECT_ANY
            elif isinstance(expected, int) and expected >= 0 and expected.__class__ is not bool:
                code = int(expected)  # an int subclass (numpy's); a bool is no version
            else:
                raise InvalidEventError(
                    f"stream {stream!r}: expected_version must be NO_STREAM, ANY or a "
                    f"version >= 0, found {expected!r}"
                )
            items: list[PreparedEvent] = []
            chosen = False
            events = request.events
            if events.__class__ not in (list, tuple) and not isinstance(events, Iterable):
                raise InvalidEventError(
                    f"stream {stream!r}: events must be a list of events, found "
                    f"{type(events).__name__}"
                )
            for index, item in enumerate(events):
                if isinstance(item, Event):
                    event, event_id = item, None
                elif isinstance(item, Proposed):
                    event, event_id = item.event, item.event_id
                    chosen = True
                    if not isinstance(event, Event):
                        raise InvalidEventError(
                            f"stream {stream!r}: item {index} is a "
                            f"{type(event).__name__}, not an Event"
                        )
                    if event_id.__class__ is not UUID:
                        _check_uuid(
                            f"stream {stream!r}: item {index}: a Proposed event id", event_id
                        )
                else:
                    raise InvalidEventError(
                        f"stream {stream!r}: item {index} is a {type(item).__name__}, not an Event"
                    )
                try:
                    type_name, schema, payload = encode(event)
                except InvalidEventError as exc:
                    raise InvalidEventError(f"stream {stream!r}: item {index}: {exc}") from exc
                items.append(new_tuple(PreparedEvent, (type_name, schema, payload, event_id)))
            prepared.append(new_tuple(PreparedRequest, (stream, code, tuple(items), chosen)))
        return prepared

    # -- reading ---------------------------------------------------------------------------

    def head(self) -> int:
        """The newest seq (0 for an empty log)."""
        return self._store.head()

    def stream_version(self, stream: str) -> int | None:
        """The stream's newest version, or None when the stream does not exist."""
        return self._store.stream_version(stream)

    def stream_versions(self, streams: Iterable[str]) -> dict[str, int | None]:
        """`stream_version` of many streams at once (one query per 500 streams, not one each)."""
        return self._store.stream_versions(streams)

    def seq_of(self, event_id: UUID) -> int | None:
        """Where the record with this event id is, None if the log holds none: whether an
        append whose answer was lost (an interrupt, a connection lost at commit) landed. A
        batch is whole or absent, so one of its ids answers for all of them."""
        _check_uuid("event_id", event_id)
        return self._store.seq_of(event_id.bytes)

    def versions_between(self, from_seq: int, until_seq: int) -> dict[str, int]:
        """The newest version, as of `until_seq`, of every stream with a record in
        from_seq..until_seq (inclusive): what a reader of that range would have seen last,
        without reading the records."""
        return self._store.versions_between(from_seq, until_seq)

    def read(
        self,
        from_seq: int = 1,
        until_seq: int | None = None,
        streams: Sequence[str] | None = None,
        types: Sequence[str] | None = None,
        *,
        stream_prefix: str | None = None,
        page_size: int = 1000,
    ) -> Iterator[RecordedEvent]:
        """Decoded records in seq order, streamed a page at a time.

        `stream_prefix` keeps the records of streams whose name starts with it (the streams of
        one application sharing the log); `page_size` bounds each fetch (a reader that wants
        ten records should not fetch a thousand).
        """
        rows = self._store.read_rows(
            from_seq, until_seq, streams, types, page_size, stream_prefix=stream_prefix
        )
        return map(_decode_row, rows)

    def last_seq(
        self, types: Sequence[str] | None = None, *, stream_prefix: str | None = None
    ) -> int:
        """The newest seq among records of `types` in streams starting with `stream_prefix`."""
        return self._store.last_seq(types, stream_prefix)

    def read_records(
        self,
        from_seq: int = 1,
        until_seq: int | None = None,
        streams: Sequence[str] | None = None,
        types: Sequence[str] | None = None,
    ) -> Iterator[Record]:
        """Records as stored (payload undecoded): for audits of logs with unknown types."""
        return self._store.read(from_seq, until_seq, streams, types)

    def read_rows(
        self,
        from_seq: int = 1,
        until_seq: int | None = None,
        streams: Sequence[str] | None = None,
        types: Sequence[str] | None = None,
        *,
        page_size: int = 1000,
    ) -> Iterator[RecordRow]:
        """`read_records` as checked row tuples (seq, stream, version, event_id as 16 bytes,
        type, schema, recorded_at, payload, chain): for whole-log audits and rebuilds that
        build no object per record (`codec.decode` turns a row's payload into its event)."""
        return self._store.read_rows(from_seq, until_seq, streams, types, page_size)

    def read_payloads(
        self,
        from_seq: int = 1,
        until_seq: int | None = None,
        *,
        types: Sequence[str] | None = None,
        page_size: int = 1000,
    ) -> Iterator[PayloadRow]:
        """(seq, type, schema, recorded_at, payload) of each record (of `types`, when given),
        in seq order, checked: for whole-log audits and rebuilds that read only these
        (`codec.decode` turns a row's payload into its event)."""
        until = self.head() if until_seq is None else until_seq
        return self._store.read_payloads(from_seq, until, page_size, types)

    def next_seq(self, from_seq: int, until_seq: int | None = None) -> int | None:
        """The first seq at or after `from_seq` (up to `until_seq`, the head by default) that
        the log holds; None past them."""
        return self._store.next_seq(from_seq, self.head() if until_seq is None else until_seq)

    def counts(self, until_seq: int | None = None) -> list[tuple[str, str, int, int]]:
        """(type, stream kind, records, smallest seq) of the records up to `until_seq` (the
        head by default), counted by the database; a stream's kind is its name up to the
        first `/`."""
        return self._store.counts(self.head() if until_seq is None else until_seq)

    def read_stream(self, stream: str, from_version: int = 0) -> Iterator[RecordedEvent]:
        """One stream's decoded records in version order."""
        return map(_decode_row, self._store.read_stream_rows(stream, from_version))

    def read_stream_backwards(
        self, stream: str, before_version: int | None = None, *, page_size: int = 100
    ) -> Iterator[RecordedEvent]:
        """One stream's decoded records newest first, from just before `before_version`.

        The cheap way to a stream's last records: `page_size` bounds each fetch (one for the
        last record alone).
        """
        rows = self._store.read_stream_backwards_rows(stream, before_version, page_size)
        return map(_decode_row, rows)

    async def subscribe(
        self,
        from_seq: int = 1,
        streams: Sequence[str] | None = None,
        types: Sequence[str] | None = None,
        poll_interval: float = 1.0,
    ) -> AsyncIterator[RecordedEvent]:
        """Catch up from `from_seq`, then follow new appends for as long as the caller iterates."""
        # Checked before the first wait: a caught-up reader would read nothing to check them.
        check_seq("from_seq", from_seq, required=True)
        streams = checked_names("streams", streams)
        types = checked_names("types", types)
        check_seconds("poll_interval", poll_interval)
        next_seq = max(from_seq, 1)
        page_size = 500
        while True:
            head = await asyncio.to_thread(self._store.head)
            if head >= next_seq:
                page = await asyncio.to_thread(
                    self._page, next_seq, head, streams, types, page_size
                )
                for record in page:
                    yield decode_record(record)
                # Every seq <= head was committed before we read: a short page covers them all.
                next_seq = page[-1].seq + 1 if len(page) == page_size else head + 1
                continue
            await asyncio.to_thread(self._store.wait_for_append, head, poll_interval)

    def _page(
        self,
        from_seq: int,
        until_seq: int,
        streams: Sequence[str] | None,
        types: Sequence[str] | None,
        size: int,
    ) -> list[Record]:
        records = self._store.read(from_seq, until_seq, streams, types, size)
        return list(itertools.islice(records, size))

    def wait_for_append(self, after_seq: int, timeout: float) -> None:
        """Block until something may have been appended after `after_seq`, or `timeout` passes.

        A wake-up, not a promise: re-read after it (SQLite polls, PostgreSQL listens).
        `after_seq` is the head the caller read before it last looked: a wait for an append
        after an older seq returns at once where the log had passed it already.
        """
        self._store.wait_for_append(after_seq, timeout)

    # -- integrity and metadata ------------------------------------------------------------

    def verify(self) -> VerifyReport:
        """Recompute the chain over every record; report the first gap, break or duplicate."""
        return verify_records(self._store.read(page_size=5000), self._store.duplicate_event_ids())

    def info(self) -> dict[str, str]:
        """The log's own metadata: id, creation time, hash algorithm, head and its chain value."""
        info = dict(self._store.meta())
        seq, link = self._store.tail_chain()
        info["revision"] = migrate.current_revision(self._store.engine, self._store.target) or ""
        info["head"] = str(seq)
        info["chain"] = link.hex()
        return info

    def tail_chain(self) -> tuple[int, bytes]:
        """The newest seq and its chain value: keep it elsewhere to detect truncation."""
        return self._store.tail_chain()

    def backup(self, dest: str | Path) -> None:
        """Write a consistent copy of the log to `dest` (SQLite: a log file; PostgreSQL: a
        pg_dump archive), while appends go on."""
        text = _path_text("dest", dest)
        _check_file_name(text, text)
        self._store.backup(Path(text))

    def save_snapshot(self, name: str, seq: int, payload: bytes | bytearray | memoryview) -> None:
        """Store a projection's state as of `seq` (replaces one saved at the same seq)."""
        self._store.save_snapshot(name, seq, payload)

    def load_snapshot(
        self, name: str, at_or_before_seq: int | None = None
    ) -> tuple[int, bytes] | None:
        """The newest snapshot of `name` at or before a seq, as (seq, payload)."""
        return self._store.load_snapshot(name, at_or_before_seq)

    @property
    def commits(self) -> int:
        """Transactions this process has committed (events per commit shows group commit)."""
        return self._writer.batches

    @property
    def cpu_seconds(self) -> float | None:
        """CPU time this process spent appending: in callers (encoding, and the commits a
        synchronous caller leads) plus the writer thread's commits. None unless the log was
        opened with `count_cpu=True`."""
        if not self._count_cpu:
            return None
        return self._caller_cpu_seconds + self._writer.cpu_seconds

    @property
    def backend(self) -> str:
        return self._store.dialect.name

    def close(self) -> None:
        """Wait for pending appends, then release connections."""
        if self._closed:
            return
        self._closed = True
        self._writer.close()
        self._store.close()

    def __enter__(self) -> EventLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def decode_record(record: Record) -> RecordedEvent:
    """A record with its event decoded (SchemaError names the seq when it can't be)."""
    return RecordedEvent(
        seq=record.seq,
        stream=record.stream,
        version=record.version,
        event_id=record.event_id,
        type=record.type,
        schema=record.schema,
        recorded_at=record.recorded_at,
        chain=record.chain,
        event=codec.decode(record.type, record.schema, record.payload, seq=record.seq),
    )


def _decode_row(row: RecordRow) -> RecordedEvent:
    """A checked row straight into a decoded record (no intermediate Record)."""
    seq, stream, version, event_id, type_name, schema, recorded_at, payload, link = row
    return RecordedEvent(
        seq,
        stream,
        version,
        uuid_from_bytes(event_id),
        type_name,
        schema,
        recorded_at,
        link,
        codec.decode(type_name, schema, payload, seq=seq),
    )


def check_stream(stream: object) -> str:
    """A stream name as a plain str (a str subclass is one no driver binds as text), or
    InvalidEventError naming one no backend stores alike (shortened)."""
    if not isinstance(stream, str) or not stream or len(stream) > MAX_STREAM_LENGTH:
        raise InvalidEventError(
            f"stream must be a non-empty string of at most {MAX_STREAM_LENGTH} characters, "
            f"found {_shortened(stream)}"
        )
    if not storable_text(stream):
        raise InvalidEventError(
            f"stream {_shortened(stream)}: a stream name is UTF-8 text without NUL characters"
        )
    return str.__str__(stream)


def _check_uuid(name: str, value: object) -> None:
    """An event id is a uuid.UUID (a str or None has no 16 bytes to look up or store)."""
    if not isinstance(value, UUID):
        raise InvalidEventError(
            f"{name} must be a uuid.UUID, found {type(value).__name__} {value!r:.60}"
        )


def _shortened(value: object) -> str:
    """A refused value as an error names it: its repr, cut to a line's worth."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text):,} characters)"
