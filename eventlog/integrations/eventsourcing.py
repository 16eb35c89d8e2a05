"""eventlog as a persistence module of the `eventsourcing` library.

Set ``PERSISTENCE_MODULE=eventlog.integrations.eventsourcing`` and ``EVENTLOG_URL`` (an SQLite
file path or a ``postgresql+psycopg://`` URL) in an application's environment. Its recorders
keep everything in the log's one records table, so `eventlog replay`, `verify` and the hash
chain cover the application:

- an originator's sequence is the stream ``es/<app>/events/<originator id>`` (snapshots:
  ``es/<app>/snapshots/<id>``), one `EsStoredEvent` per stored event;
- a notification id is the record's seq; an application's notifications are its records of
  type `EsStoredEvent` in its ``events`` streams, so ids have gaps where other writers appended;
- a process application's position in an upstream application is the stream
  ``es/<app>/tracking/<upstream>``, one `EsTracking` per processed notification, appended in
  the same atomic `append_batch` as the events it led to (exactly-once processing).

A sequence only grows: an insert whose originator versions (or notification id) are not
greater than the stream's last one raises eventsourcing's `IntegrityError`, as does losing a
race to another writer (eventlog's `ConcurrencyError`, re-checked against the stream).
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    DataError,
    InfrastructureFactory,
    IntegrityError,
    InterfaceError,
    Notification,
    OperationalError,
    PersistenceError,
    ProcessRecorder,
    StoredEvent,
    Subscription,
    Tracking,
    TrackingRecorder,
)
from eventsourcing.utils import Environment, EnvType, resolve_topic, strtobool

from eventlog.errors import (
    ConcurrencyError,
    DuplicateEventError,
    EventLogError,
    InvalidEventError,
    LogClosedError,
)
from eventlog.integrations.eventsourcing_events import EsStoredEvent, EsTracking
from eventlog.log import EventLog
from eventlog.records import NO_STREAM, AppendRequest, ExpectedVersion, RecordedEvent

__all__ = [
    "EventLogAggregateRecorder",
    "EventLogApplicationRecorder",
    "EventLogFactory",
    "EventLogProcessRecorder",
    "EventLogTrackingRecorder",
]

STORED_TYPE = "eventsourcing.StoredEvent"
TRACKING_TYPE = "eventsourcing.Tracking"
_RETRIES = 10
"""Lost races re-read the streams and try again; each retry means another writer appended."""
_KNOWN_TAILS = 100_000
"""Streams whose tail a recorder remembers (forgotten all at once past this: a re-read each)."""
_WAIT_S = 0.2
"""How long a subscription sleeps between checks that it has not been stopped."""


_Run = tuple[str, list[tuple[int, EsStoredEvent | EsTracking]]]
"""Consecutive items of one stream in an insert: (position, event) each."""


@dataclass(frozen=True, slots=True)
class _Tail:
    """A stream's last record: its version and its position (originator version or id)."""

    version: int
    position: int


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    """eventlog's errors as eventsourcing's persistence errors (the ones its callers catch)."""
    try:
        yield
    except PersistenceError:
        raise
    except (ConcurrencyError, DuplicateEventError) as exc:
        raise IntegrityError(str(exc)) from exc
    except InvalidEventError as exc:
        raise DataError(str(exc)) from exc
    except LogClosedError as exc:
        raise InterfaceError(str(exc)) from exc
    except EventLogError as exc:
        raise OperationalError(str(exc)) from exc


class _Recorder:
    """What every recorder shares: the log, the application's namespace, the streams' tails.

    The tails cache only spares reads: a stale tail (another process appended) makes the
    append fail with ConcurrencyError, and the retry reads the stream afresh.
    """

    def __init__(self, log: EventLog, *, namespace: str = "es", purpose: str = "events") -> None:
        if not namespace or not purpose or "/" in purpose or purpose == "tracking":
            raise DataError(
                f"namespace must be non-empty and purpose a name other than 'tracking', "
                f"found {namespace!r} and {purpose!r}"
            )
        self.log = log
        self.namespace = namespace
        self.purpose = purpose
        self.events_prefix = f"{namespace}/{purpose}/"
        self._tails: dict[str, _Tail] = {}

    # -- streams ---------------------------------------------------------------------------

    def _event_stream(self, originator_id: UUID | str) -> str:
        return f"{self.events_prefix}{originator_id}"

    def _tracking_stream(self, application_name: str) -> str:
        return f"{self.namespace}/tracking/{application_name}"

    def _read_tail(self, stream: str) -> _Tail | None:
        """The stream's last record as stored now (one indexed read of one row)."""
        for record in self.log.read_stream_backwards(stream, page_size=1):
            tail = self._tails[stream] = _Tail(record.version, _position(record))
            return tail
        self._tails.pop(stream, None)
        return None

    # -- writing ---------------------------------------------------------------------------

    def _write(self, stored_events: Sequence[StoredEvent], tracking: Tracking | None) -> list[int]:
        """Append the events (and the tracking record) in one atomic step; their seqs."""
        runs: list[_Run] = []
        for stored in stored_events:
            stream = self._event_stream(stored.originator_id)
            item: tuple[int, EsStoredEvent | EsTracking] = (
                stored.originator_version,
                _to_event(stored),
            )
            if runs and runs[-1][0] == stream:
                runs[-1][1].append(item)
            else:
                runs.append((stream, [item]))
        if tracking is not None:
            stream = self._tracking_stream(tracking.application_name)
            runs.append((stream, [(tracking.notification_id, _tracking_event(tracking))]))
        if not runs:
            return []
        _check_increasing(runs)
        streams = {stream for stream, _ in runs}
        lost: ConcurrencyError | None = None
        for _ in range(_RETRIES):
            tails = {
                s: self._read_tail(s) if lost or s not in self._tails else self._tails[s]
                for s in streams
            }
            try:
                requests = _requests(runs, tails)
            except IntegrityError as exc:
                raise exc from lost  # after a lost race: the append that beat this one
            try:
                results = self.log.append_batch(requests)
            except ConcurrencyError as exc:
                lost = exc  # another writer appended: look again, it may be a real conflict
                continue
            if len(self._tails) > _KNOWN_TAILS:
                self._tails.clear()
            for request, result in zip(requests, results, strict=True):
                last = request.events[-1]
                assert isinstance(last, EsStoredEvent | EsTracking)
                self._tails[request.stream] = _Tail(result.versions[-1], _position_of(last))
            count = len(runs) - (tracking is not None)
            return [seq for result in results[:count] for seq in result.seqs]
        raise OperationalError(
            f"gave up after {_RETRIES} lost races appending to {sorted(streams)}"
        )

    def _select_events(
        self,
        originator_id: UUID | str,
        gt: int | None,
        lte: int | None,
        desc: bool,
        limit: int | None,
    ) -> list[StoredEvent]:
        stream = self._event_stream(originator_id)
        if limit == 0:  # as the peer's recorders answer (a page of 0 is no read of ours)
            return []
        if lte is None and (gt is not None or (desc and limit is not None)):
            found = self._select_from_the_end(stream, gt, desc, limit)
        else:
            found = self._select_forwards(stream, self._tails.get(stream), gt, lte, desc, limit)
        if desc:
            found.reverse()
        return found if limit is None else found[:limit]

    def _select_from_the_end(
        self, stream: str, gt: int | None, desc: bool, limit: int | None
    ) -> list[StoredEvent]:
        """The last records (a snapshot, the events after one): one read from the stream's end,
        whatever the stream's length or the cached tail."""
        found: list[StoredEvent] = []
        page_size = limit if desc and limit is not None else 100
        for record in self.log.read_stream_backwards(stream, page_size=page_size):
            event = record.event
            if not found:
                self._tails[stream] = _Tail(record.version, _position(record))
            assert isinstance(event, EsStoredEvent)
            if gt is not None and event.originator_version <= gt:
                break
            found.append(_from_event(event))
            if desc and limit is not None and len(found) >= limit:
                break
        found.reverse()
        return found

    def _select_forwards(
        self,
        stream: str,
        tail: _Tail | None,
        gt: int | None,
        lte: int | None,
        desc: bool,
        limit: int | None,
    ) -> list[StoredEvent]:
        """Records in version order, from the first one that can match."""
        from_version = 0
        if tail is not None:
            # Positions grow by at least one per version, so the record at version v has a
            # position <= tail.position - (tail.version - v): nothing before `start` is > gt.
            if gt is not None:
                start = gt + 1 - (tail.position - tail.version)
                from_version = min(max(start, 0), tail.version + 1)
            if desc and limit is not None and lte is None:
                from_version = max(from_version, tail.version - limit + 1)
        found: list[StoredEvent] = []
        last: RecordedEvent | None = None
        for record in self.log.read_stream(stream, from_version):
            event = record.event
            assert isinstance(event, EsStoredEvent)
            if lte is not None and event.originator_version > lte:
                break
            last = record
            if gt is None or event.originator_version > gt:
                found.append(_from_event(event))
        else:
            if last is not None:  # read to the end: the stream's tail as of now
                self._tails[stream] = _Tail(last.version, _position(last))
        return found


def _check_increasing(runs: list[_Run]) -> None:
    seen: dict[str, int] = {}
    for stream, items in runs:
        for position, _ in items:
            before = seen.get(stream)
            if before is not None and position <= before:
                raise IntegrityError(
                    f"stream {stream!r}: position {position} follows {before} in one insert"
                )
            seen[stream] = position


def _requests(runs: list[_Run], tails: dict[str, _Tail | None]) -> list[AppendRequest]:
    """One request per run, each at the exact version the stream will be at; IntegrityError
    when a position is not above the stream's last (tails only grow: a cached one suffices)."""
    versions: dict[str, int | None] = {}
    requests = []
    for stream, items in runs:
        if stream not in versions:
            tail = tails[stream]
            if tail is not None and items[0][0] <= tail.position:
                raise IntegrityError(
                    f"stream {stream!r}: position {items[0][0]} is already taken "
                    f"(the stream is at {tail.position})"
                )
            versions[stream] = None if tail is None else tail.version
        current = versions[stream]
        expected: ExpectedVersion = NO_STREAM if current is None else current
        requests.append(AppendRequest(stream, [event for _, event in items], expected))
        versions[stream] = (-1 if current is None else current) + len(items)
    return requests


def _to_event(stored: StoredEvent) -> EsStoredEvent:
    return EsStoredEvent(
        originator_id=str(stored.originator_id),
        originator_id_is_uuid=isinstance(stored.originator_id, UUID),
        originator_version=stored.originator_version,
        topic=stored.topic,
        state=bytes(stored.state),
    )


def _from_event(event: EsStoredEvent) -> StoredEvent:
    return StoredEvent(
        originator_id=_originator_id(event),
        originator_version=event.originator_version,
        topic=event.topic,
        state=event.state,
    )


def _originator_id(event: EsStoredEvent) -> UUID | str:
    return UUID(event.originator_id) if event.originator_id_is_uuid else event.originator_id


def _tracking_event(tracking: Tracking) -> EsTracking:
    return EsTracking(
        application_name=tracking.application_name, notification_id=tracking.notification_id
    )


def _position_of(event: EsStoredEvent | EsTracking) -> int:
    if isinstance(event, EsStoredEvent):
        return event.originator_version
    return event.notification_id


def _position(record: RecordedEvent) -> int:
    event = record.event
    if not isinstance(event, EsStoredEvent | EsTracking):
        raise DataError(
            f"seq {record.seq}: stream {record.stream!r} holds a {record.type}, "
            "not a record of an eventsourcing application"
        )
    return _position_of(event)


class EventLogAggregateRecorder(_Recorder, AggregateRecorder):
    """An aggregate recorder on an eventlog log (the factory makes one per purpose: snapshots)."""

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        with _translated():
            self._write(stored_events, None)
        return None

    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        with _translated():
            return self._select_events(originator_id, gt, lte, desc, limit)


class EventLogApplicationRecorder(EventLogAggregateRecorder, ApplicationRecorder):
    """An application recorder: notification ids are the log's seqs."""

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        with _translated():
            return self._write(stored_events, None)

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        from_seq = 1 if start is None else start if inclusive_of_start else start + 1
        wanted = set(topics)
        found: list[Notification] = []
        if limit <= 0:
            return found
        with _translated():
            records = self.log.read(
                from_seq,
                stop,
                types=[STORED_TYPE],
                stream_prefix=self.events_prefix,
                page_size=max(1, min(limit, 1000)) if not wanted else 1000,
            )
            for record in records:
                event = record.event
                assert isinstance(event, EsStoredEvent)
                if wanted and event.topic not in wanted:
                    continue
                found.append(
                    Notification(
                        id=record.seq,
                        originator_id=_originator_id(event),
                        originator_version=event.originator_version,
                        topic=event.topic,
                        state=event.state,
                    )
                )
                if len(found) >= limit:
                    break
        return found

    def max_notification_id(self) -> int | None:
        with _translated():
            seq = self.log.last_seq([STORED_TYPE], stream_prefix=self.events_prefix)
        return seq or None

    def subscribe(
        self, gt: int | None = None, topics: Sequence[str] = ()
    ) -> Subscription[ApplicationRecorder]:
        return EventLogSubscription(self, gt=gt, topics=topics)


class EventLogSubscription(Subscription[ApplicationRecorder]):
    """Notifications after `gt`, then new ones as they are appended (until stopped)."""

    def __init__(
        self, recorder: EventLogApplicationRecorder, gt: int | None, topics: Sequence[str]
    ) -> None:
        super().__init__(recorder, gt, topics)
        self._source = recorder
        self._after = gt or 0
        self._wanted = tuple(topics)
        self._buffer: deque[Notification] = deque()
        self._stopped = threading.Event()

    def stop(self) -> None:
        super().stop()
        self._stopped.set()

    def __next__(self) -> Notification:
        while not self._stopped.is_set():
            if self._buffer:
                notification = self._buffer.popleft()
                self._after = notification.id
                return notification
            with _translated():
                head = self._source.log.head()  # what a wait must see the log pass
            page = self._source.select_notifications(
                self._after, 500, topics=self._wanted, inclusive_of_start=False
            )
            if page:
                self._buffer.extend(page)
                continue
            with _translated():
                # Not the last notification's id: records that are no notification of ours
                # (snapshots, tracking, other applications) lie past it, and a wait for an
                # append after it returns at once on PostgreSQL: the subscription spun.
                self._source.log.wait_for_append(head, _WAIT_S)
        raise StopIteration


class EventLogTrackingRecorder(_Recorder, TrackingRecorder):
    """Tracking records as events: one stream per upstream application."""

    def insert_tracking(self, tracking: Tracking) -> None:
        with _translated():
            self._write([], tracking)

    def max_tracking_id(self, application_name: str) -> int | None:
        with _translated():
            tail = self._read_tail(self._tracking_stream(application_name))
        return None if tail is None else tail.position


class EventLogProcessRecorder(
    EventLogTrackingRecorder, EventLogApplicationRecorder, ProcessRecorder
):
    """Events and the tracking record that led to them, in one atomic append."""

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        tracking = kwargs.get("tracking")
        if tracking is not None and not isinstance(tracking, Tracking):
            raise DataError(f"tracking must be a Tracking, found {tracking!r}")
        with _translated():
            return self._write(stored_events, tracking)


class EventLogFactory(InfrastructureFactory[EventLogTrackingRecorder]):
    """Recorders for one application, on the log named by `EVENTLOG_URL`.

    Every recorder of the factory shares one `EventLog` (one writer, group commit), opened on
    first use and closed by `close()`. Streams are namespaced by the application's name, so
    several applications can share one log.
    """

    EVENTLOG_URL = "EVENTLOG_URL"
    EVENTLOG_DURABILITY = "EVENTLOG_DURABILITY"
    CREATE_TABLE = "CREATE_TABLE"

    aggregate_recorder_class = EventLogAggregateRecorder
    application_recorder_class = EventLogApplicationRecorder
    tracking_recorder_class = EventLogTrackingRecorder
    process_recorder_class = EventLogProcessRecorder

    def __init__(self, env: Environment | EnvType | None) -> None:
        super().__init__(env)
        url = self.env.get(self.EVENTLOG_URL)
        if not url:
            keys = ", ".join(self.env.create_keys(self.EVENTLOG_URL))
            raise OSError(f"eventlog location not found in the environment (keys: {keys})")
        durability = (self.env.get(self.EVENTLOG_DURABILITY) or "full").strip()
        if durability not in ("full", "normal"):
            raise OSError(
                f"{self.EVENTLOG_DURABILITY} must be 'full' or 'normal', found {durability!r}"
            )
        self.url = url
        self.durability: Any = durability
        self._log: EventLog | None = None
        self._lock = threading.Lock()

    @property
    def namespace(self) -> str:
        """Where this application's streams live: ``es/<application name>``."""
        name = self.env.name
        return f"es/{name}" if name else "es"

    def log(self) -> EventLog:
        """The factory's log, opened (and created unless CREATE_TABLE is false) on first use."""
        with self._lock:
            if self._log is None:
                create = strtobool(self.env.get(self.CREATE_TABLE) or "yes")
                with _translated():
                    self._log = EventLog.open(self.url, durability=self.durability, create=create)
            return self._log

    def aggregate_recorder(self, purpose: str = "events") -> AggregateRecorder:
        return self.aggregate_recorder_class(self.log(), namespace=self.namespace, purpose=purpose)

    def application_recorder(self) -> ApplicationRecorder:
        cls = self._topic_class(self.APPLICATION_RECORDER_TOPIC, self.application_recorder_class)
        recorder: ApplicationRecorder = cls(self.log(), namespace=self.namespace)
        return recorder

    def tracking_recorder(
        self, tracking_recorder_class: type[EventLogTrackingRecorder] | None = None
    ) -> EventLogTrackingRecorder:
        cls = tracking_recorder_class or self._topic_class(
            self.TRACKING_RECORDER_TOPIC, self.tracking_recorder_class
        )
        return cls(self.log(), namespace=self.namespace)

    def process_recorder(self) -> ProcessRecorder:
        cls = self._topic_class(self.PROCESS_RECORDER_TOPIC, self.process_recorder_class)
        recorder: ProcessRecorder = cls(self.log(), namespace=self.namespace)
        return recorder

    def _topic_class(self, key: str, default: type[Any]) -> type[Any]:
        topic = self.env.get(key)
        if not topic:
            return default
        cls = resolve_topic(topic)
        if not (isinstance(cls, type) and issubclass(cls, default)):
            raise OSError(f"{key}={topic!r} is not a subclass of {default.__qualname__}")
        return cls

    def close(self) -> None:
        with self._lock:
            if self._log is not None:
                self._log.close()
                self._log = None
