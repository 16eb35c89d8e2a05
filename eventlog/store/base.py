"""The SQL store: one write path and one read path for every dialect.

Writes happen in one transaction per group-commit batch, under the dialect's write lock
(SQLite `BEGIN IMMEDIATE`, PostgreSQL a transaction-scoped advisory lock), so seq is
assigned in commit order and a reader that has seen seq N never later finds a smaller one.
Every submission in a batch is validated on its own against the stored state plus the
submissions accepted before it; a rejected submission adds no row and fails nobody else.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from eventlog import chain, forks
from eventlog.errors import (
    ConcurrencyError,
    DamagedRecordError,
    DuplicateEventError,
    EventLogError,
    InputError,
    InvalidEventError,
    LogClosedError,
    StorageDamagedError,
    StorageIntegrityError,
    StorageUnavailableError,
)
from eventlog.ids import mint_event_ids, uuid_from_bytes
from eventlog.records import AppendResult, Record
from eventlog.store.errors import translate, translating
from eventlog.store.tables import events, log_meta, snapshots

log = logging.getLogger(__name__)

_ID_CHUNK = 500  # bound parameters per lookup (SQLite's limit is far above; PG has none)
_KNOWN_STREAMS = 100_000  # versions remembered between batches (cleared when exceeded)
_WHOLE_BATCH_FAILURES = (StorageUnavailableError, StorageDamagedError)
"""Failures of the database, not of one submission: retrying one by one would only wait again."""

# Read-side statements, built once (constructing a Core statement costs ~100 µs of Python).
_HEAD = sa.select(sa.func.coalesce(sa.func.max(events.c.seq), 0))
_TAIL = sa.select(events.c.seq, events.c.chain).order_by(events.c.seq.desc()).limit(1)
# The writer's statements, as plain SQL both dialects accept (markers filled per driver).
_TAIL_SQL = "SELECT seq, chain FROM events ORDER BY seq DESC LIMIT 1"
_VERSIONS_SQL = "SELECT stream, max(version) FROM events WHERE stream IN ({}) GROUP BY stream"
_VERSIONS_BETWEEN_SQL = (
    "SELECT stream, max(version) FROM events WHERE seq >= {m} AND seq <= {m} GROUP BY stream"
)
_BY_ID_SQL = (
    "SELECT event_id, stream, seq, version, type, schema, payload FROM events"
    " WHERE event_id IN ({})"
)
# The read statements, as templates for `SqlStore._sql` ({m}: the driver's marker, {}: an
# IN list). Both dialects accept them as they are.
_NO_VERSION_LIMIT = 2**62
_SELECT_RECORDS = (
    "SELECT seq, stream, version, event_id, type, schema, recorded_at, payload, chain FROM events"
)
_SELECT_PAYLOADS = "SELECT seq, type, schema, recorded_at, payload FROM events"
_SEQ_FROM = "seq >= {m}"
_SEQ_UNTIL = "seq <= {m}"
_STREAM_IN = "stream IN ({})"
_TYPE_IN = "type IN ({})"
_BY_SEQ = " ORDER BY seq LIMIT {m}"
_STREAM_FORWARDS = (
    _SELECT_RECORDS + " WHERE stream = {m} AND version >= {m} ORDER BY version LIMIT {m}"
)
_STREAM_BACKWARDS_SQL = (
    _SELECT_RECORDS + " WHERE stream = {m} AND version < {m} ORDER BY version DESC LIMIT {m}"
)


def _prefix_clause(prefix: str) -> str:
    """`stream` begins with `prefix`, compared exactly (LIKE is case-blind on SQLite); the
    length is part of the statement so that no driver has to guess a parameter's type."""
    check_text("stream_prefix", prefix)
    return f"substr(stream, 1, {len(prefix)}) = {{m}}"


class PreparedEvent(NamedTuple):
    """An event already encoded by its caller; the store fills in id, positions and chain.

    A tuple, not a class: a batch holds thousands, and a tuple of plain values leaves the
    garbage collector's view at its first pass instead of being promoted and rescanned.
    """

    type: str
    schema: int
    payload: bytes
    chosen: uuid.UUID | None
    """The id the caller chose (a retry may find it stored); None: the writer mints one."""


EXPECT_NO_STREAM = -1
EXPECT_ANY = -2
"""A prepared request's expected version: >= 0, or one of these for NO_STREAM and ANY."""


class PreparedRequest(NamedTuple):
    """One request, all plain values (untracked by the collector like its events)."""

    stream: str
    expected: int
    events: tuple[PreparedEvent, ...]
    chosen: bool = False
    """Whether any event carries a caller-chosen id (only those need idempotency checks)."""


Submission = list[PreparedRequest]
"""Requests that succeed or fail together (one append or one append_batch call)."""

Outcome = list[AppendResult] | EventLogError


class Dialect(Protocol):
    """What differs between backends; everything else is shared SQL."""

    name: str

    def write_engine(self) -> Engine: ...

    def read_engine(self) -> Engine: ...

    placeholder: str
    """The driver's positional parameter marker (`?` or `%s`)."""

    stream_kind: str
    """SQL expression of a record's stream kind: `stream` up to its first `/` (all of it
    when it has none)."""

    insert_checks_tail: bool
    """Whether the writer may link to the tail of its own last commit without reading it:
    a statement fewer per transaction (on PostgreSQL also the wait for its reply before the
    inserts could be planned, a round trip of its own)."""

    def writer_connection(self, dbapi: Any) -> None:
        """Set up the DB-API connection the writer keeps (transactions are its own)."""

    def begin_write(self, cursor: Any) -> None:
        """Open the writer's transaction and take the log's write lock (DB-API cursor)."""

    def commit_write(self, cursor: Any) -> None:
        """Commit the writer's transaction (inside the pipeline, so no extra round trip)."""

    def pipeline(self, dbapi: Any) -> contextlib.AbstractContextManager[Any]:
        """Statements issued inside go out without waiting for each other's replies (the
        first fetch waits for all); a no-op where the database is in-process."""

    def write_rows(self, cursor: Any, rows: list[tuple[Any, ...]], last_seq: int) -> None:
        """Insert the transaction's record rows, in seq order, ending at `last_seq`
        (PostgreSQL: and NOTIFY the readers waiting for it, in the last row's statement)."""

    def wait_for_append(self, after_seq: int, timeout: float) -> None:
        """Block until something may have been appended after `after_seq`, or timeout."""

    def backup(self, engine: Engine, dest: Path) -> None:
        """Write a consistent copy of the whole log to `dest` (a new file)."""

    def find_damaged(self, engine: Engine, from_seq: int) -> tuple[int, str, str] | None:
        """The first record from `from_seq` whose stored value the driver cannot read, as
        (seq, column, what it holds); None where the database enforces column types."""

    def dispose(self) -> None: ...

    def after_fork_in_child(self) -> None:
        """Leave the parent's connections alone (`forks.abandon_pools`)."""


_Placed = tuple[str, int, int, str, int, bytes]
"""Where a caller-chosen event id landed: stream, seq, version, type, schema, payload."""


@dataclass
class _Batch:
    """The writer's view of the log while it plans one transaction."""

    head: int
    last_chain: bytes
    versions: dict[str, int | None]
    placed: dict[bytes, _Placed]
    """Caller-chosen event ids already stored, or accepted earlier in this batch."""
    rows: list[tuple[int, str, int, bytes, str, int, int, bytes, bytes]] = field(
        default_factory=list
    )
    recorded_at: int = 0
    """The transaction's time (ns): every record it writes carries it."""
    minted: list[uuid.UUID] = field(default_factory=list)
    minted_bytes: list[bytes] = field(default_factory=list)
    """Ids minted for the whole transaction at once (a request with chosen ids takes none),
    and each one's 16 bytes; `taken` of them are used."""
    taken: int = 0
    assumed: list[str] = field(default_factory=list)
    """Streams taken to be new without reading their version (see `_assumable`)."""
    own_tail: bool = False
    """The tail was taken to be this writer's last commit, unread (see `_open_batch`)."""


class SqlStore:
    """Append and read records through SQLAlchemy Core; dialect specifics stay in `dialect`."""

    def __init__(self, dialect: Dialect, target: str) -> None:
        self.dialect = dialect
        self.target = target
        self._engine_for_writes = dialect.write_engine()
        self._engine_for_reads = dialect.read_engine()
        self._closed = False
        # Stream versions as of seq `_known_head`, from our own commits. Valid only while the
        # log's head is still that seq (nobody else appended since), checked in each batch.
        self._known_head = -1
        self._known_chain = chain.GENESIS
        """The chain value of seq `_known_head` (ours: we wrote it)."""
        self._tail_shared = True
        """Whether the last tail read found another writer's records (or none was read)."""
        self._known_versions: dict[str, int | None] = {}
        self._writer_conn: Connection | None = None
        self._writer_dbapi: Any = None
        self._statements: dict[tuple[str, tuple[int, ...]], str] = {}
        self._assumed = False
        """Whether the transaction being written took a stream to be new unread."""
        forks.watch(self)

    def _require_open(self) -> None:
        """Refuse any use of a closed store: SQLAlchemy reconnects a disposed engine, so a
        closed log would go on reading and writing its file."""
        if self._closed:
            raise LogClosedError(LOG_CLOSED)

    @property
    def _write_engine(self) -> Engine:
        self._require_open()
        return self._engine_for_writes

    @property
    def _read_engine(self) -> Engine:
        self._require_open()
        return self._engine_for_reads

    def after_fork_in_child(self) -> None:
        """The parent's connections stay the parent's (`forks`): the child's writer and
        readers connect afresh, and the tail is read again before it is assumed."""
        forks.keep(self._writer_conn)
        self._writer_conn, self._writer_dbapi, self._tail_shared = None, None, True
        self.dialect.after_fork_in_child()

    # -- writing ---------------------------------------------------------------------------

    def write(self, submissions: Sequence[Submission], *, assume: bool = True) -> list[Outcome]:
        """Commit every valid submission in one transaction; return one outcome each.

        A storage error raises the same typed error whether the batch held one submission or
        many. Only a failure that may be one submission's (a constraint, a value the database
        or the driver rejects, a damaged record of one stream) is retried one submission at a
        time, to isolate the culprit; a lock held past the busy timeout, a lost connection or a
        full disk fails the whole batch once.

        `assume`: streams the writer does not know, appended to once with NO_STREAM, are
        taken to be new without a version read; the unique (stream, version) index refuses
        version 0 of a stream that exists, and then the batch is planned again with every
        version read (so such a request fails with its ConcurrencyError, nothing else).
        """
        try:
            return self._write_once(submissions, assume)
        except _PlanAgain as exc:
            log.debug("a batch assumed what was not so (%s); planning again", exc.__cause__)
            return self.write(submissions, assume=False)
        except DamagedRecordError as exc:
            # A damaged record (of one stream, most often) is not every submission's concern.
            if len(submissions) == 1:
                raise
            log.warning("batch of %d failed (%s); retrying one by one", len(submissions), exc)
        except EventLogError:
            raise
        except Exception as exc:
            typed = translate(exc, self.target)
            if typed is None:
                # Not the database's refusal but something one submission brought (a value
                # no driver can bind): only one by one tells whose, so never fail them all.
                if len(submissions) == 1:
                    raise
                log.warning(
                    "batch of %d failed (%s: %s); retrying one by one",
                    len(submissions),
                    type(exc).__name__,
                    exc,
                )
            else:
                if len(submissions) == 1 or isinstance(typed, _WHOLE_BATCH_FAILURES):
                    raise typed from exc
                log.warning("batch of %d failed (%s); retrying one by one", len(submissions), typed)
        outcomes: list[Outcome] = []
        for index, submission in enumerate(submissions):
            try:
                outcomes.extend(self._write_once([submission], assume=False))
            except EventLogError as exc:
                outcomes.append(exc)
            except Exception as exc:
                typed = translate(exc, self.target)
                if typed is None:
                    typed = EventLogError(f"{self.target}: append failed: {exc}")
                typed.__cause__ = exc
                if isinstance(typed, _WHOLE_BATCH_FAILURES):  # the rest would wait in vain
                    outcomes.extend([typed] * (len(submissions) - index))
                    break
                outcomes.append(typed)
        return outcomes

    def _connection(self) -> tuple[Connection, Any]:
        """The writer's own connection, kept open (checking one out per batch costs a
        reset), and its DB-API connection, which the writer's transactions run on."""
        conn = self._writer_conn
        if conn is None or conn.closed or conn.invalidated:
            conn = self._writer_conn = self._write_engine.connect()
            self._tail_shared = True  # a new connection may see another file: read the tail
            self._writer_dbapi = conn.connection.dbapi_connection
            self.dialect.writer_connection(self._writer_dbapi)
        return conn, self._writer_dbapi

    def _write_once(self, submissions: Sequence[Submission], assume: bool) -> list[Outcome]:
        conn, dbapi = self._connection()
        self._assumed = False
        try:
            return self._write_in(dbapi, submissions, assume)
        except _PlanAgain:  # rolled back, nothing wrong with the connection
            raise
        except BaseException as exc:
            if self._assumed and isinstance(translate(exc, self.target), StorageIntegrityError):
                # a row the batch's assumption put in is refused: a stream taken to be new
                # exists, or the seq after our own tail is taken
                raise _PlanAgain from exc
            # After a failed commit the connection's state is not worth trusting: drop it from
            # the pool too (a connection the server closed would fail the next batch again).
            self._writer_conn = None
            with contextlib.suppress(Exception):
                conn.invalidate()
            raise

    def _write_in(
        self, dbapi: Any, submissions: Sequence[Submission], assume: bool
    ) -> list[Outcome]:
        # The writer's transaction runs on the driver's own connection: it is the hot path of
        # every append, and Core's per-statement machinery cost more than the SQL itself.
        # On PostgreSQL the statements go out pipelined: a writer alone on its log with
        # nothing to read sends lock, rows, NOTIFY and COMMIT in one round trip; versions and
        # chosen ids to read, or the tail after another writer's append, cost one more.
        cursor = dbapi.cursor()
        try:
            with self.dialect.pipeline(dbapi):
                self.dialect.begin_write(cursor)
                batch = self._open_batch(dbapi, submissions, assume)
                # One clock reading and one minting for the whole transaction, not one per
                # submission (a group commit of single-event appends paid both per event).
                batch.recorded_at = time.time_ns()
                batch.minted, batch.minted_bytes = mint_event_ids(
                    sum(
                        [
                            _minted_of_chosen(r) if r.chosen else len(r.events)
                            for s in submissions
                            for r in s
                        ]
                    )
                )
                plan = self._plan
                outcomes = [plan(batch, submission) for submission in submissions]
                if batch.rows:
                    self.dialect.write_rows(cursor, batch.rows, batch.head)
                elif batch.own_tail:  # no row of seq head + 1 checked the tail: read it
                    _require_own_tail(dbapi, batch.head, batch.last_chain)
                self.dialect.commit_write(cursor)
        except BaseException:
            with contextlib.suppress(Exception):
                dbapi.rollback()
            raise
        finally:
            cursor.close()
        # Committed: the versions we planned with are the log's versions as of batch.head,
        # except a stream taken to be new that nothing was appended to (never checked).
        versions = batch.versions
        for stream in batch.assumed:
            if versions[stream] is None:
                del versions[stream]
        if len(self._known_versions) > _KNOWN_STREAMS:
            self._known_versions = {}
        self._known_versions.update(versions)
        self._known_head, self._known_chain = batch.head, batch.last_chain
        return outcomes

    def _open_batch(self, dbapi: Any, submissions: Sequence[Submission], assume: bool) -> _Batch:
        """Read what planning needs. Every query is sent before the first result is read
        (pipelined on PostgreSQL), betting that our cached versions are still the log's;
        when the tail shows another writer, the cached ones are read again."""
        # The tail of our own last commit is not read where an insert checks it: seq is the
        # primary key, seqs have no gaps and records are never deleted, so if another writer
        # appended since, the row of seq head + 1 exists; its insert then fails and the batch
        # is planned again with everything read (like a stream taken to be new). Only while
        # the last tail read, on this connection, found no other writer: writers that take
        # turns would otherwise fail one insert per transaction.
        own_tail = (
            assume
            and self.dialect.insert_checks_tail
            and self._known_head >= 0
            and not self._tail_shared
        )
        self._assumed = own_tail
        known = self._known_versions
        if own_tail and len(submissions) == 1 and len(submissions[0]) == 1:
            # One request, ids minted, to a stream this writer knows or one it takes to be new
            # (`_assumable`'s rule for a request alone): nothing at all to read.
            stream, expected, items, chosen = submissions[0][0]
            new = stream not in known and _may_be_new(expected, items)
            if not chosen and (stream in known or new):
                return _Batch(
                    head=self._known_head,
                    last_chain=self._known_chain,
                    versions={stream: known.get(stream)},
                    placed={},
                    assumed=[stream] if new else [],
                    own_tail=True,
                )
        tail = None
        if not own_tail:
            tail = dbapi.cursor()
            tail.execute(_TAIL_SQL)
        streams = {request.stream for submission in submissions for request in submission}
        missing = [stream for stream in streams if stream not in known]
        assumed: list[str] = []
        if missing and assume:
            missing, assumed = _assumable(submissions, missing)
            self._assumed = self._assumed or bool(assumed)
        version_reads = (
            [self._query(dbapi, _VERSIONS_SQL, chunk) for chunk in _chunks(missing)]
            if missing
            else []
        )
        supplied = [
            event.chosen.bytes
            for submission in submissions
            for request in submission
            if request.chosen
            for event in request.events
            if event.chosen is not None
        ]
        id_reads = (
            [self._query(dbapi, _BY_ID_SQL, chunk) for chunk in _chunks(supplied)]
            if supplied
            else []
        )
        if tail is None:
            head, last_chain = self._known_head, self._known_chain
        else:
            head, last_chain = _fetched_tail(tail)
        versions: dict[str, int | None] = dict.fromkeys(missing)
        if assumed:
            versions.update(dict.fromkeys(assumed))
        for read in version_reads:
            _update_versions(versions, read.fetchall())
        self._tail_shared = head != self._known_head  # (an unread tail is our own)
        if not self._tail_shared:
            versions.update({stream: known[stream] for stream in streams if stream in known})
        else:  # another writer appended (or a commit failed): what we cached may be stale
            self._known_head, self._known_chain, self._known_versions = -1, chain.GENESIS, {}
            stale = [stream for stream in streams if stream in known]
            versions.update(dict.fromkeys(stale))
            for read in [self._query(dbapi, _VERSIONS_SQL, chunk) for chunk in _chunks(stale)]:
                _update_versions(versions, read.fetchall())
        placed: dict[bytes, _Placed] = {}
        for read in id_reads:
            for row in read.fetchall():
                placed[bytes(row[0])] = _checked_placed(row)
        return _Batch(
            head=head,
            last_chain=last_chain,
            versions=versions,
            placed=placed,
            assumed=assumed,
            own_tail=own_tail,
        )

    def _query(self, dbapi: Any, sql: str, values: list[Any]) -> Any:
        """A cursor on which `sql` (with one marker per value for its IN list) was sent."""
        cursor = dbapi.cursor()
        cursor.execute(sql.format(", ".join([self.dialect.placeholder] * len(values))), values)
        return cursor

    def _plan(self, batch: _Batch, submission: Submission) -> Outcome:
        """Validate one submission against the batch so far; on success, add its rows."""
        if len(submission) == 1:
            stream, expected, events, chosen = submission[0]
            if not chosen and len(events) == 1:
                return self._plan_one(batch, stream, expected, events[0])
        elif len(submission) == 2 and not submission[0].events:
            # An assertion in front of one minted event (a fenced ledger command): checked
            # here, it changes nothing, so the event takes the short path too.
            (held, wanted, _, _), (stream, expected, events, chosen) = submission
            if not chosen and len(events) == 1:
                current = batch.versions.get(held)
                if wanted != EXPECT_ANY and wanted != (
                    EXPECT_NO_STREAM if current is None else current
                ):
                    return _mismatch(held, wanted, current)
                outcome = self._plan_one(batch, stream, expected, events[0])
                if isinstance(outcome, EventLogError):
                    return outcome
                return [AppendResult(held, [], [], []), *outcome]
        results: list[AppendResult] = []
        rows: list[tuple[int, str, int, bytes, str, int, int, bytes, bytes]] = []
        versions: dict[str, int | None] = {}
        supplied: set[bytes] = set()
        head, last_chain, known = batch.head, batch.last_chain, batch.versions
        recorded_at = batch.recorded_at
        link_rows, link = chain.link_rows, chain.link_fields
        minted, minted_bytes, taken = batch.minted, batch.minted_bytes, batch.taken
        add_row, add_result = rows.append, results.append
        try:
            if any([request.chosen for request in submission]):
                supplied = _chosen_once(submission)
            for request in submission:
                stream, expected, events, chosen = request
                if chosen:
                    retried = self._retried(batch, request)
                    if retried is not None:
                        add_result(retried)
                        continue
                current = versions[stream] if stream in versions else known.get(stream)
                if expected != EXPECT_ANY and expected != (
                    EXPECT_NO_STREAM if current is None else current
                ):
                    raise _mismatch(stream, expected, current)
                count = len(events)
                if not count:  # an assertion: checked above, adds nothing
                    add_result(AppendResult(stream, [], [], []))
                    continue
                first_version = 0 if current is None else current + 1
                if count == 1 and not chosen:  # the common request: one event, minted id
                    head += 1
                    type_name, schema, payload, _ = events[0]
                    fields = (
                        head,
                        stream,
                        first_version,
                        minted_bytes[taken],
                        type_name,
                        schema,
                        recorded_at,
                        payload,
                    )
                    last_chain = link(last_chain, fields)
                    add_row((*fields, last_chain))
                    add_result(AppendResult(stream, [head], [first_version], [minted[taken]]))
                    taken += 1
                    versions[stream] = first_version
                    continue
                if chosen:
                    ids, taken = _chosen_ids(request, minted, taken)
                    id_bytes = [event_id.bytes for event_id in ids]
                else:
                    ids = minted[taken : taken + count]
                    id_bytes = minted_bytes[taken : taken + count]
                    taken += count
                first_seq = head + 1
                # The canonical fields of each record (chain order), then one call links them.
                last_chain = link_rows(
                    last_chain,
                    [
                        (
                            first_seq + i,
                            stream,
                            first_version + i,
                            key,
                            type_name,
                            schema,
                            recorded_at,
                            payload,
                        )
                        for i, ((type_name, schema, payload, _), key) in enumerate(
                            zip(events, id_bytes, strict=True)
                        )
                    ],
                    rows,
                )
                head += count
                versions[stream] = first_version + count - 1
                seqs = list(range(first_seq, head + 1))
                span = list(range(first_version, first_version + count))
                add_result(AppendResult(stream, seqs, span, ids))
        except EventLogError as exc:
            return exc
        batch.head, batch.last_chain, batch.taken = head, last_chain, taken
        batch.versions.update(versions)
        if supplied:  # minted ids cannot come back; only chosen ones are tracked
            for row in rows:
                if row[3] in supplied:
                    batch.placed[row[3]] = (row[1], row[0], row[2], row[4], row[5], row[7])
        batch.rows.extend(rows)
        return results

    def _plan_one(self, batch: _Batch, stream: str, expected: int, event: PreparedEvent) -> Outcome:
        """`_plan` of the commonest submission (one event, its id minted): the expected
        version is the only check and comes before anything changes, so no undo state."""
        known = batch.versions
        current = known.get(stream)
        if expected != EXPECT_ANY and expected != (
            EXPECT_NO_STREAM if current is None else current
        ):
            return _mismatch(stream, expected, current)
        seq = batch.head + 1
        version = 0 if current is None else current + 1
        taken = batch.taken
        type_name, schema, payload, _ = event
        fields = (
            seq,
            stream,
            version,
            batch.minted_bytes[taken],
            type_name,
            schema,
            batch.recorded_at,
            payload,
        )
        link = chain.link_fields(batch.last_chain, fields)
        batch.rows.append((*fields, link))
        batch.head, batch.last_chain, batch.taken = seq, link, taken + 1
        known[stream] = version
        return [AppendResult(stream, [seq], [version], [batch.minted[taken]])]

    def _retried(self, batch: _Batch, request: PreparedRequest) -> AppendResult | None:
        """The original result when every event of the request is already stored as is."""
        found: list[_Placed] = []
        for event in request.events:
            placed = None if event.chosen is None else batch.placed.get(event.chosen.bytes)
            if placed is None:
                continue
            found.append(placed)
            stream, seq, _, type_name, schema, payload = placed
            if (stream, type_name, schema, payload) != (
                request.stream,
                event.type,
                event.schema,
                event.payload,
            ):
                raise DuplicateEventError(str(event.chosen), stream, seq)
        if not found:
            return None
        if len(found) != len(request.events):
            minted = sum(event.chosen is None for event in request.events)
            if minted:  # its minted ids are new on every try: it cannot be retried as is
                raise InvalidEventError(
                    f"stream {request.stream!r}: {len(found)} of {len(request.events)} event "
                    f"ids are already stored, and {minted} of its events have no chosen id; "
                    "an append is retried by its ids only when every event's id is chosen"
                )
            raise InvalidEventError(
                f"stream {request.stream!r}: {len(found)} of {len(request.events)} event ids are "
                "already stored; a retry must repeat the original append exactly"
            )
        return AppendResult(
            request.stream,
            [f[1] for f in found],
            [f[2] for f in found],
            [e.chosen for e in request.events if e.chosen is not None],
        )

    # -- reading ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Connection]:
        """A read connection whose driver errors surface as typed eventlog errors."""
        with translating(self.target), self._read_engine.connect() as conn:
            yield conn

    def _fetch(
        self,
        sql: str,
        params: Sequence[Any],
        from_seq: int,
        check: Callable[[Sequence[Any]], Any] | None = None,
    ) -> list[Any]:
        """One page of checked record rows; a value the driver cannot even read is named by
        its seq. The page is read on the driver's own cursor: SQLAlchemy's Row objects and
        statement compilation cost more per record than the read itself."""
        try:
            with self._read_engine.connect() as conn:
                dbapi = conn.connection.dbapi_connection
                assert dbapi is not None
                cursor = dbapi.cursor()
                try:
                    cursor.execute(sql, params)
                    rows = cursor.fetchall()
                finally:
                    cursor.close()
            return [(check or _checked)(row) for row in rows]
        except EventLogError:
            raise
        except Exception as exc:
            try:
                found = self.dialect.find_damaged(self._read_engine, from_seq)
            except Exception:  # the scan fails too (a damaged schema): report the first error
                found = None
            if found is not None:
                seq, column, stored = found
                raise DamagedRecordError(
                    f"seq {seq}: column {column} holds {stored}, which eventlog never writes "
                    "(the record was edited outside eventlog)",
                    seq=seq,
                    column=column,
                ) from exc
            typed = translate(exc, self.target)
            if typed is None:
                raise
            raise typed from exc

    def _sql(self, template: str, *lists: int) -> str:
        """`template` with `{m}` as the driver's marker and each `{n}` an IN list of that
        many markers; built once per shape (building a Core statement per call cost more
        than an indexed read)."""
        key = (template, lists)
        sql = self._statements.get(key)
        if sql is None:
            marker = self.dialect.placeholder
            sql = template.format(*[", ".join([marker] * n) for n in lists], m=marker)
            self._statements[key] = sql
        return sql

    def head(self) -> int:
        with self._reading() as conn:
            return int(conn.execute(_HEAD).scalar_one())

    def tail_chain(self) -> tuple[int, bytes]:
        """The newest seq and its chain value (the anchor to keep elsewhere)."""
        with self._reading() as conn:
            row = conn.execute(_TAIL).first()
        if row is None:
            return 0, chain.GENESIS
        if not isinstance(row[1], bytes | memoryview):
            raise _damaged(row[0], "chain", row[1])
        return row[0], bytes(row[1])

    def stream_version(self, stream: str) -> int | None:
        check_text("stream", stream)
        return self.stream_versions([stream])[stream]

    def stream_versions(self, streams: Iterable[str]) -> dict[str, int | None]:
        """Each stream's newest version (None: no such stream), one query per 500 streams."""
        wanted = sorted(set(checked_names("streams", streams) or ()))
        versions: dict[str, int | None] = dict.fromkeys(wanted)
        for chunk in _chunks(wanted):
            for stream, version in self._rows(self._sql(_VERSIONS_SQL, len(chunk)), chunk):
                versions[stream] = _stored_version(stream, version)
        return versions

    def versions_between(self, from_seq: int, until_seq: int) -> dict[str, int]:
        """The newest version of every stream with a record in from_seq..until_seq, as of
        until_seq (one grouped scan of that range)."""
        check_seq("from_seq", from_seq, required=True)
        check_seq("until_seq", until_seq, required=True)
        rows = self._rows(self._sql(_VERSIONS_BETWEEN_SQL), [from_seq, until_seq])
        return {stream: _stored_version(stream, version) for stream, version in rows}

    def _rows(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Every row of a prebuilt statement, on the driver's cursor."""
        with self._reading() as conn:
            dbapi = conn.connection.dbapi_connection
            assert dbapi is not None
            cursor = dbapi.cursor()
            try:
                cursor.execute(sql, params)
                return list(cursor.fetchall())
            finally:
                cursor.close()

    def read(
        self,
        from_seq: int = 1,
        until_seq: int | None = None,
        streams: Sequence[str] | None = None,
        types: Sequence[str] | None = None,
        page_size: int = 1000,
        stream_prefix: str | None = None,
    ) -> Iterator[Record]:
        """Records in seq order, fetched a page at a time so memory stays bounded."""
        rows = self.read_rows(from_seq, until_seq, streams, types, page_size, stream_prefix)
        return map(record_of_row, rows)

    def read_rows(
        self,
        from_seq: int = 1,
        until_seq: int | None = None,
        streams: Sequence[str] | None = None,
        types: Sequence[str] | None = None,
        page_size: int = 1000,
        stream_prefix: str | None = None,
    ) -> Iterator[RecordRow]:
        """`read` as checked rows (the columns in table order), for callers that build
        their own objects from them (`EventLog.read` decodes straight into its records)."""
        check_seq("from_seq", from_seq, required=True)
        check_seq("until_seq", until_seq)
        streams = checked_names("streams", streams)
        types = checked_names("types", types)
        if (streams is not None and not streams) or (types is not None and not types):
            return
        yield from self._by_seq(
            _SELECT_RECORDS, from_seq, until_seq, streams, types, stream_prefix, page_size
        )

    def read_payloads(
        self,
        from_seq: int,
        until_seq: int,
        page_size: int = 1000,
        types: Sequence[str] | None = None,
    ) -> Iterator[PayloadRow]:
        """(seq, type, schema, recorded_at, payload) of the records in from_seq..until_seq
        (only those of `types`, when given), in seq order, checked: what a whole-log audit
        or a rebuild decodes, without the columns it does not read (a third fewer values for
        the driver to build per record)."""
        check_seq("from_seq", from_seq, required=True)
        check_seq("until_seq", until_seq, required=True)
        types = checked_names("types", types)
        if types is not None and not types:
            return
        yield from self._by_seq(
            _SELECT_PAYLOADS, from_seq, until_seq, None, types, None, page_size, _checked_payload
        )

    def _by_seq(
        self,
        select: str,
        from_seq: int,
        until_seq: int | None,
        streams: Sequence[str] | None,
        types: Sequence[str] | None,
        stream_prefix: str | None,
        page_size: int,
        check: Callable[[Sequence[Any]], Any] | None = None,
    ) -> Iterator[Any]:
        """The rows of `select` (its first column the seq) from `from_seq` on that match
        the filters given, in seq order, `page_size` at a time: the one paging of
        `read_rows` and `read_payloads`."""
        _check_page_size(page_size)
        where = [_SEQ_FROM]
        params: list[Any] = []
        lists: list[int] = []
        if until_seq is not None:
            where.append(_SEQ_UNTIL)
            params.append(until_seq)
        if streams is not None:
            where.append(_STREAM_IN)
            params.extend(streams)
            lists.append(len(streams))
        if types is not None:
            where.append(_TYPE_IN)
            params.extend(types)
            lists.append(len(types))
        if stream_prefix is not None:
            where.append(_prefix_clause(stream_prefix))
            params.append(stream_prefix)
        sql = self._sql(select + " WHERE " + " AND ".join(where) + _BY_SEQ, *lists)

        last = MAX_SEQ if until_seq is None else until_seq
        next_seq = max(from_seq, 1)
        while True:
            page = self._fetch(sql, [next_seq, *params, page_size], next_seq, check)
            yield from page
            # a short page is the last; no page follows the largest seq (a damaged log's
            # record at 2**63 - 1 asked for one from a seq beyond SQL's integers)
            if len(page) < page_size or page[-1][0] >= last:
                return
            next_seq = page[-1][0] + 1

    def next_seq(self, from_seq: int, until_seq: int) -> int | None:
        """The first seq in from_seq..until_seq the log holds, None if none: one index seek,
        no row read (a damaged row is for its reader to name)."""
        check_seq("from_seq", from_seq, required=True)
        check_seq("until_seq", until_seq, required=True)
        sql = self._sql("SELECT min(seq) FROM events WHERE seq >= {m} AND seq <= {m}")
        ((found,),) = self._fetch(sql, [from_seq, until_seq], from_seq, tuple)
        return None if found is None else int(found)

    def counts(self, until_seq: int) -> list[tuple[str, str, int, int]]:
        """(type, stream kind, records, smallest seq) of every record up to `until_seq`, in
        one aggregate query: counting needs no record in Python."""
        check_seq("until_seq", until_seq, required=True)
        sql = self._sql(
            f"SELECT type, {self.dialect.stream_kind}, count(*), min(seq) FROM events "
            "WHERE seq <= {m} GROUP BY 1, 2"
        )
        found = self._fetch(sql, [until_seq], 1, tuple)  # a value the driver cannot read is named
        return [(str(t), str(k), int(n), int(first)) for t, k, n, first in found]

    def last_seq(self, types: Sequence[str] | None = None, stream_prefix: str | None = None) -> int:
        """The newest seq among the records that match (0 when none does).

        Walks the seq index backwards and stops at the first match: cheap when matching
        records are recent, as an application's own records are in a log it writes to.
        """
        types = checked_names("types", types)
        if types is not None and not types:
            return 0
        where: list[str] = []
        params: list[Any] = []
        lists: list[int] = []
        if types is not None:
            where.append(_TYPE_IN)
            params.extend(types)
            lists.append(len(types))
        if stream_prefix is not None:
            where.append(_prefix_clause(stream_prefix))
            params.append(stream_prefix)
        template = "SELECT seq FROM events" + (" WHERE " + " AND ".join(where) if where else "")
        sql = self._sql(template + " ORDER BY seq DESC LIMIT 1", *lists)
        with self._reading() as conn:
            dbapi = conn.connection.dbapi_connection
            assert dbapi is not None
            cursor = dbapi.cursor()
            try:
                cursor.execute(sql, params)
                found = cursor.fetchone()
            finally:
                cursor.close()
        return int(found[0]) if found else 0

    def read_stream(
        self, stream: str, from_version: int = 0, page_size: int = 1000
    ) -> Iterator[Record]:
        """One stream's records in version order, through the (stream, version) index."""
        return map(record_of_row, self.read_stream_rows(stream, from_version, page_size))

    def read_stream_rows(
        self, stream: str, from_version: int = 0, page_size: int = 1000
    ) -> Iterator[RecordRow]:
        """`read_stream` as checked rows."""
        check_text("stream", stream)
        _check_version("from_version", from_version)
        _check_page_size(page_size)
        sql = self._sql(_STREAM_FORWARDS)
        next_version = from_version
        while True:
            page = self._fetch(sql, [stream, next_version, page_size], 1)
            yield from page
            if len(page) < page_size:
                return
            next_version = page[-1][2] + 1

    def read_stream_backwards(
        self, stream: str, before_version: int | None = None, page_size: int = 100
    ) -> Iterator[Record]:
        """One stream's records newest first, through the (stream, version) index."""
        return map(
            record_of_row, self.read_stream_backwards_rows(stream, before_version, page_size)
        )

    def read_stream_backwards_rows(
        self, stream: str, before_version: int | None = None, page_size: int = 100
    ) -> Iterator[RecordRow]:
        """`read_stream_backwards` as checked rows."""
        check_text("stream", stream)
        if before_version is not None:
            _check_version("before_version", before_version)
        _check_page_size(page_size)
        sql = self._sql(_STREAM_BACKWARDS_SQL)
        upper = _NO_VERSION_LIMIT if before_version is None else before_version
        while True:
            page = self._fetch(sql, [stream, upper, page_size], 1)
            yield from page
            if len(page) < page_size:
                return
            upper = page[-1][2]

    def seq_of(self, event_id: bytes) -> int | None:
        """The seq of the record with this event id (the smallest, in a tampered log that
        holds it twice); None when the log holds none."""
        query = sa.select(sa.func.min(events.c.seq)).where(events.c.event_id == event_id)
        with self._reading() as conn:
            found = conn.execute(query).scalar()
        return None if found is None else int(found)

    def duplicate_event_ids(self) -> list[tuple[bytes, int]]:
        """(event id, smallest seq) for ids stored more than once (only a tampered log has any)."""
        query = (
            sa.select(events.c.event_id, sa.func.min(events.c.seq))
            .group_by(events.c.event_id)
            .having(sa.func.count() > 1)
        )
        with self._reading() as conn:
            return [(row[0], row[1]) for row in conn.execute(query)]

    def meta(self) -> dict[str, str]:
        with self._reading() as conn:
            return {key: value for key, value in conn.execute(sa.select(log_meta))}

    # -- snapshots -------------------------------------------------------------------------

    def save_snapshot(self, name: str, seq: int, payload: bytes | bytearray | memoryview) -> None:
        """Store a state as of `seq`, a seq the log has reached (checked in the snapshot's
        own transaction; the head only grows): a snapshot ahead of its log would be taken
        for one of records it does not hold."""
        _check_snapshot_name(name)
        check_seq("seq", seq, required=True)
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise InvalidEventError(
                f"snapshot {name!r}: payload must be bytes, found {type(payload).__name__} "
                f"{payload!r:.40}"
            )
        with translating(self.target), self._write_engine.connect() as conn, conn.begin():
            head = conn.execute(_HEAD).scalar_one()
            if not 0 <= seq <= head:
                raise InvalidEventError(
                    f"snapshot {name!r}: seq {seq} is not in 0..{head} (the log's head): a "
                    "snapshot is of a state the log has reached"
                )
            conn.execute(snapshots.delete().where(snapshots.c.name == name, snapshots.c.seq == seq))
            conn.execute(
                snapshots.insert().values(
                    name=name, seq=seq, created_at=time.time_ns(), payload=bytes(payload)
                )
            )

    def load_snapshot(self, name: str, at_or_before_seq: int | None) -> tuple[int, bytes] | None:
        _check_snapshot_name(name)
        check_seq("at_or_before_seq", at_or_before_seq)
        query = sa.select(snapshots.c.seq, snapshots.c.payload).where(snapshots.c.name == name)
        if at_or_before_seq is not None:
            query = query.where(snapshots.c.seq <= at_or_before_seq)
        query = query.order_by(snapshots.c.seq.desc()).limit(1)
        with self._reading() as conn:
            row = conn.execute(query).first()
        return (int(row[0]), bytes(row[1])) if row else None

    def wait_for_append(self, after_seq: int, timeout: float) -> None:
        check_seq("after_seq", after_seq, required=True)
        check_seconds("timeout", timeout)
        self._require_open()  # (SQLite's wait is a sleep that touches no engine)
        with translating(self.target):
            self.dialect.wait_for_append(after_seq, timeout)

    def backup(self, dest: Path) -> None:
        """A consistent copy of the log in a new file, taken while writers go on."""
        if os.path.isdir(dest):  # the copy would be made, then fail to take its name
            raise InputError(
                f"{dest}: the backup destination is a folder; name a new file in it instead"
            )
        with translating(self.target):
            self.dialect.backup(self._read_engine, dest)

    @property
    def engine(self) -> Engine:
        return self._write_engine

    def close(self) -> None:
        self._closed = True
        if self._writer_conn is not None:
            self._writer_conn.close()
            self._writer_conn = None
        self.dialect.dispose()


MAX_SEQ = 2**63 - 1
"""The largest seq any backend can store (a signed 64-bit integer)."""


LOG_CLOSED = "the log is closed"
"""What every use of a closed log is refused with (LogClosedError)."""


def check_seq(name: str, value: int | None, *, required: bool = False) -> None:
    """A seq bound that is no int, or one no log can reach, is a caller's mistake, not a
    driver's TypeError or OverflowError. None is no bound, where one may be left out."""
    if value is None and not required:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidEventError(
            f"{name} must be an int seq, found {type(value).__name__} {value!r:.40}"
        )
    if not -MAX_SEQ <= value <= MAX_SEQ:
        raise InvalidEventError(
            f"{name} {value} is beyond the largest seq a log can hold ({MAX_SEQ})"
        )


MOST_SECONDS = 86_400
"""The longest wait an argument may ask for (a day): NaN, infinity and negative waits are no
wait a sleep or a socket takes."""


def check_seconds(name: str, value: float) -> None:
    """A duration is a number of seconds in 0..MOST_SECONDS (a bool is none)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= MOST_SECONDS
    ):
        raise InvalidEventError(
            f"{name} must be a number of seconds in 0..{MOST_SECONDS}, found {value!r:.40}"
        )


def storable_text(text: str) -> bool:
    """Whether both backends store (and SQLite opens) `text` alike: PostgreSQL text holds no
    NUL and every driver needs UTF-8, which a lone surrogate has none of."""
    if text.isprintable():  # the common case: no NUL, no surrogate
        return True
    if "\x00" in text:
        return False
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def check_text(name: str, value: object) -> None:
    """A name argument (a stream, a type, a prefix) is text a record can hold: anything else
    is the caller's mistake, not a driver's TypeError or UnicodeEncodeError."""
    if not isinstance(value, str) or not storable_text(value):
        raise InvalidEventError(
            f"{name} must be UTF-8 text without NUL characters, found "
            f"{type(value).__name__} {value!r:.60}"
        )


def checked_names(name: str, values: Iterable[str] | None) -> list[str] | None:
    """A filter's names as a list (None: no filter), each checked by `check_text`. A bare
    str is refused: as a sequence it is its characters, and filters by them."""
    if values is None:
        return None
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise InvalidEventError(
            f"{name} must be a list of names, found {type(values).__name__} {values!r:.60}"
        )
    listed = list(values)
    for value in listed:
        check_text(f"a name in {name}", value)
    return listed


def _check_snapshot_name(name: str) -> None:
    check_text("snapshot name", name)
    if not name:
        raise InvalidEventError("snapshot name must not be empty")


def _check_version(name: str, value: int) -> None:
    """A version bound is an int a stream can reach (as `check_seq` bounds a seq)."""
    if isinstance(value, bool) or not isinstance(value, int) or not -MAX_SEQ <= value <= MAX_SEQ:
        raise InvalidEventError(
            f"{name} must be an int in -{MAX_SEQ}..{MAX_SEQ} (no stream's version is beyond "
            f"them), found {value!r:.40}"
        )


def _check_page_size(page_size: int) -> None:
    """A page holds at least one record, or paging would never move on."""
    if (
        isinstance(page_size, bool)
        or not isinstance(page_size, int)
        or not 1 <= page_size <= MAX_SEQ
    ):
        raise InvalidEventError(
            f"page_size must be an int in 1..{MAX_SEQ}, found {page_size!r:.40}"
        )


def _assumable(
    submissions: Sequence[Submission], missing: list[str]
) -> tuple[list[str], list[str]]:
    """`missing` split into the streams whose version must be read and those taken to be
    new unread: a stream named by one request only in the whole batch, expecting NO_STREAM
    and carrying events. Its version-0 row is then what checks the guess (the unique
    (stream, version) index refuses it when the stream exists, failing the transaction),
    and no other request's outcome rests on it."""
    once: dict[str, bool] = {}
    for submission in submissions:
        for stream, expected, items, _ in submission:
            once[stream] = stream not in once and _may_be_new(expected, items)
    return [s for s in missing if not once[s]], [s for s in missing if once[s]]


def _may_be_new(expected: int, items: Sequence[object]) -> bool:
    """Whether a request's stream may be taken to be new unread: it expects NO_STREAM and
    carries events, so its version-0 row is what checks the guess."""
    return expected == EXPECT_NO_STREAM and bool(items)


def _chunks(values: Sequence[Any]) -> Iterator[list[Any]]:
    for start in range(0, len(values), _ID_CHUNK):
        yield list(values[start : start + _ID_CHUNK])


def _minted_of_chosen(request: PreparedRequest) -> int:
    """How many events of a request with chosen ids take a minted id (those without one)."""
    return sum([event.chosen is None for event in request.events])


def _chosen_once(submission: Submission) -> set[bytes]:
    """The submission's chosen ids, each once: checked before any retry is matched, so that
    a retry repeating an id is refused as the same append sent fresh is (else both events
    were answered with the one stored record)."""
    supplied: set[bytes] = set()
    for request in submission:
        for event in request.events:
            if event.chosen is None:
                continue
            key = event.chosen.bytes
            if key in supplied:
                raise InvalidEventError(
                    f"stream {request.stream!r}: event id {event.chosen} appears twice in one "
                    "append"
                )
            supplied.add(key)
    return supplied


def _chosen_ids(
    request: PreparedRequest, minted: list[uuid.UUID], taken: int
) -> tuple[list[uuid.UUID], int]:
    """The request's ids: the caller's where chosen (each once per append: `_chosen_once`),
    else the next of the transaction's minted ones (so ids follow seq order whatever the
    requests mix); with how many minted ids are taken now."""
    ids: list[uuid.UUID] = []
    for event in request.events:
        if event.chosen is None:
            ids.append(minted[taken])
            taken += 1
        else:
            ids.append(event.chosen)
    return ids, taken


def _mismatch(stream: str, expected: int, current: int | None) -> ConcurrencyError:
    """The refusal of a request whose expected version (NO_STREAM or a version) the planner
    found is not the stream's `current` one (the comparison is inline: it runs per request)."""
    wanted = "no stream" if expected == EXPECT_NO_STREAM else f"version {expected}"
    return ConcurrencyError(stream, wanted, current)


_BINARY = (bytes, memoryview)
_EXPECTED: tuple[tuple[str, type | tuple[type, ...]], ...] = (
    ("seq", int),
    ("stream", str),
    ("version", int),
    ("event_id", _BINARY),
    ("type", str),
    ("schema", int),
    ("recorded_at", int),
    ("payload", _BINARY),
    ("chain", _BINARY),
)
_STORAGE = {str: "TEXT", bytes: "BLOB", memoryview: "BLOB", int: "INTEGER", float: "REAL"}


RecordRow = tuple[int, str, int, bytes, str, int, int, bytes, bytes]
"""An events row as read: seq, stream, version, event_id, type, schema, recorded_at, payload,
chain; checked to hold what eventlog writes."""


def _checked(row: Sequence[Any]) -> RecordRow:
    """The row itself when every column holds what eventlog writes (the common case, one
    boolean expression per record); memoryviews become bytes; anything else is named."""
    seq, stream, version, event_id, type_name, schema, recorded_at, payload, link = row
    if (
        type(seq) is int
        and type(stream) is str
        and type(version) is int
        and type(type_name) is str
        and type(schema) is int
        and type(recorded_at) is int
        and type(payload) is bytes
        and type(link) is bytes
        and type(event_id) is bytes
        and len(event_id) == 16
        and type(row) is tuple
    ):
        return row
    if not (
        type(seq) is int
        and type(stream) is str
        and type(version) is int
        and type(type_name) is str
        and type(schema) is int
        and type(recorded_at) is int
        and isinstance(payload, _BINARY)
        and isinstance(link, _BINARY)
        and isinstance(event_id, _BINARY)
        and len(event_id) == 16
    ):
        raise _damaged_row(row)
    return (
        seq,
        stream,
        version,
        bytes(event_id),
        type_name,
        schema,
        recorded_at,
        bytes(payload),
        bytes(link),
    )


PayloadRow = tuple[int, str, int, int, bytes]
"""seq, type, schema, recorded_at, payload of a record (`read_payloads`)."""


def _checked_payload(row: Sequence[Any]) -> PayloadRow:
    """`_checked` for the columns of `read_payloads`."""
    seq, type_name, schema, recorded_at, payload = row
    if (
        type(seq) is int
        and type(type_name) is str
        and type(schema) is int
        and type(recorded_at) is int
        and type(payload) is bytes
        and type(row) is tuple
    ):
        return row
    _require_columns(
        seq,
        ("seq", seq, int),
        ("type", type_name, str),
        ("schema", schema, int),
        ("recorded_at", recorded_at, int),
        ("payload", payload, _BINARY),
    )
    return (seq, type_name, schema, recorded_at, bytes(payload))


def record_of_row(row: RecordRow) -> Record:
    """A checked row as the Record the read API hands out."""
    seq, stream, version, event_id, type_name, schema, recorded_at, payload, link = row
    return Record(
        seq,
        stream,
        version,
        uuid_from_bytes(event_id),
        type_name,
        schema,
        recorded_at,
        payload,
        link,
    )


def _damaged_row(row: Sequence[Any]) -> DamagedRecordError:
    seq = row[0]
    for (column, expected), value in zip(_EXPECTED, row, strict=True):
        if not isinstance(value, expected) or isinstance(value, bool):
            return _damaged(seq, column, value)
    return DamagedRecordError(
        f"seq {seq}: column event_id holds a BLOB of {len(row[3])} bytes, expected 16 "
        "(the record was edited outside eventlog)",
        seq=seq if type(seq) is int else 0,
        column="event_id",
    )


def _stored_version(stream: str, version: object) -> int:
    """A stream's newest version as the database gave it: an int, or the stream is damaged
    (SQLite's max() over a column edited to hold text or a real returns that value)."""
    if type(version) is int:
        return version
    stored = _STORAGE.get(type(version), "NULL" if version is None else type(version).__name__)
    raise DamagedRecordError(
        f"stream {stream!r}: its newest version is {stored} {version!r:.40}, which eventlog "
        "never writes (a record was edited outside eventlog; `eventlog verify` names it)",
        seq=0,
        column="version",
    )


def _require_own_tail(dbapi: Any, head: int, last_chain: bytes) -> None:
    """A batch that inserts nothing has no row to check the tail it assumed: it is read.
    Another writer's tail means versions were taken from a stale cache: the batch is planned
    again with everything read."""
    cursor = dbapi.cursor()
    try:
        cursor.execute(_TAIL_SQL)
        if _fetched_tail(cursor) != (head, last_chain):
            raise _PlanAgain
    finally:
        cursor.close()


class _PlanAgain(Exception):
    """What a batch assumed unread was not so (another writer appended since the commit
    whose tail it took, or made a stream it took to be new): rolled back, it is planned
    again with everything read, on the same connection."""


def _fetched_tail(cursor: Any) -> tuple[int, bytes]:
    """The newest seq and chain from a cursor that ran `_TAIL_SQL` (an empty log: 0 and the
    genesis value)."""
    last = cursor.fetchone()
    return _checked_tail(last) if last else (0, chain.GENESIS)


def _checked_tail(row: Sequence[Any]) -> tuple[int, bytes]:
    """The newest seq and chain the writer links to, as stored: a chain of another storage
    type would be linked from (INTEGER 32 is `bytes(32)`, the genesis value) or crash."""
    seq, link = row
    if type(seq) is not int:
        raise _damaged(seq, "seq", seq)
    if not isinstance(link, _BINARY):
        raise _damaged(seq, "chain", link)
    return seq, bytes(link)


def _update_versions(versions: dict[str, int | None], rows: Sequence[Sequence[Any]]) -> None:
    """`versions` with each (stream, max(version)) row read under the write lock, checked:
    SQLite's max() returns an edited value as it is, and a version planned from a real
    would be stored as one."""
    for stream, version in rows:
        versions[stream] = version if type(version) is int else _stored_version(stream, version)


def _checked_placed(row: Sequence[Any]) -> _Placed:
    """Where a chosen id is stored (event_id, stream, seq, version, type, schema,
    payload), checked before a retry is compared with it or answered from it."""
    _, stream, seq, version, type_name, schema, payload = row
    _require_columns(
        seq,
        ("seq", seq, int),
        ("stream", stream, str),
        ("version", version, int),
        ("type", type_name, str),
        ("schema", schema, int),
        ("payload", payload, _BINARY),
    )
    return (stream, seq, version, type_name, schema, bytes(payload))


def _require_columns(seq: object, *checks: tuple[str, object, Any]) -> None:
    """Each (column, value, storage class) holds that class (a bool is no integer column),
    else the record at `seq` is named damaged (the slow path of a row that failed the fast
    one-expression check)."""
    for column, value, expected in checks:
        if not isinstance(value, expected) or isinstance(value, bool):
            raise _damaged(seq, column, value)


def _damaged(seq: object, column: str, value: object) -> DamagedRecordError:
    stored = _STORAGE.get(type(value), "NULL" if value is None else type(value).__name__)
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return DamagedRecordError(
        f"seq {seq}: column {column} holds {stored} {shown}, which eventlog never writes "
        "(the record was edited outside eventlog)",
        seq=seq if type(seq) is int else 0,
        column=column,
    )
