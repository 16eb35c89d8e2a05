"""The rules the eventsourcing integration adds on top of the peer's own test cases."""

from __future__ import annotations

import subprocess
import sys
from typing import Any
from uuid import uuid4

import msgspec
import pytest
from eventsourcing.persistence import (
    ApplicationRecorder,
    DataError,
    InfrastructureFactory,
    IntegrityError,
    InterfaceError,
    StoredEvent,
    Tracking,
)
from eventsourcing.tests.persistence import ApplicationRecorderTestCase
from eventsourcing.utils import Environment

from eventlog import NO_STREAM, ConcurrencyError, Event, EventLog, event_type
from eventlog.integrations.eventsourcing import (
    EventLogAggregateRecorder,
    EventLogApplicationRecorder,
    EventLogFactory,
    EventLogProcessRecorder,
)


@event_type
class OtherWriterNoted(Event, frozen=True, kw_only=True):
    """A record some other writer appends to the same log."""

    note: str


def _stored(originator_id: object, version: int, topic: str = "t") -> StoredEvent:
    return StoredEvent(
        originator_id=originator_id,  # type: ignore[arg-type]
        originator_version=version,
        topic=topic,
        state=b"{}",
    )


def test_notifications_skip_other_writers_records_and_other_applications(log: EventLog) -> None:
    mine = EventLogApplicationRecorder(log, namespace="es/Mine")
    theirs = EventLogApplicationRecorder(log, namespace="es/Theirs")
    first = mine.insert_events([_stored(uuid4(), 1)])
    log.append("controller", [OtherWriterNoted(note="x")])
    theirs.insert_events([_stored(uuid4(), 1)])
    second = mine.insert_events([_stored(uuid4(), 1)])
    assert first == [1]
    assert second == [4]  # seq 2 and 3 belong to others: a gap in this application's ids
    assert [n.id for n in mine.select_notifications(None, 10)] == [1, 4]
    assert [n.id for n in theirs.select_notifications(None, 10)] == [3]
    assert mine.max_notification_id() == 4
    assert theirs.max_notification_id() == 3
    log.append("controller", [OtherWriterNoted(note="y")])
    assert mine.max_notification_id() == 4


def test_a_lost_race_is_an_integrity_error_and_a_stale_tail_is_read_again(
    log_target: str, log: EventLog
) -> None:
    originator = uuid4()
    mine = EventLogApplicationRecorder(log)
    mine.insert_events([_stored(originator, 1)])  # mine now remembers version 1 as the tail
    with EventLog.open(log_target) as other_log:
        EventLogApplicationRecorder(other_log).insert_events([_stored(originator, 2)])
    with pytest.raises(IntegrityError) as lost:
        mine.insert_events([_stored(originator, 2)])
    assert isinstance(lost.value.__cause__, ConcurrencyError)  # eventlog's, mapped
    assert mine.insert_events([_stored(originator, 3)]) == [3]
    versions = [e.originator_version for e in mine.select_events(originator)]
    assert versions == [1, 2, 3]


def test_originator_versions_must_grow_within_a_sequence(log: EventLog) -> None:
    originator = uuid4()
    recorder = EventLogApplicationRecorder(log)
    recorder.insert_events([_stored(originator, 5)])
    with pytest.raises(IntegrityError):
        recorder.insert_events([_stored(originator, 4)])
    with pytest.raises(IntegrityError):
        recorder.insert_events([_stored(originator, 7), _stored(originator, 6)])
    assert log.head() == 1


def test_sparse_versions_select_by_range_and_from_the_end(log: EventLog) -> None:
    originator = uuid4()
    recorder = EventLogAggregateRecorder(log, purpose="snapshots")
    recorder.insert_events([_stored(originator, v) for v in (5, 10, 15, 20)])
    fresh = EventLogAggregateRecorder(log, purpose="snapshots")  # no cached tail
    for reader in (recorder, fresh):
        assert [e.originator_version for e in reader.select_events(originator, gt=7)] == [
            10,
            15,
            20,
        ]
        assert [e.originator_version for e in reader.select_events(originator, gt=7, lte=15)] == [
            10,
            15,
        ]
        last = reader.select_events(originator, desc=True, limit=2)
        assert [e.originator_version for e in last] == [20, 15]
        before = reader.select_events(originator, lte=12, desc=True, limit=1)
        assert [e.originator_version for e in before] == [10]
        assert reader.select_events(originator, gt=20) == []


def test_string_and_uuid_originator_ids_come_back_as_given(log: EventLog) -> None:
    recorder = EventLogApplicationRecorder(log)
    as_uuid, as_text = uuid4(), "account-7"
    recorder.insert_events([_stored(as_uuid, 1), _stored(as_text, 1)])
    assert recorder.select_events(as_uuid)[0].originator_id == as_uuid
    assert recorder.select_events(as_text)[0].originator_id == as_text
    ids = [n.originator_id for n in recorder.select_notifications(None, 10)]
    assert ids == [as_uuid, as_text]


def test_events_and_tracking_land_together_or_not_at_all(log: EventLog) -> None:
    recorder = EventLogProcessRecorder(log, namespace="es/Follower")
    taken = uuid4()
    recorder.insert_events([_stored(taken, 1)], tracking=Tracking("Leader", 3))
    with pytest.raises(IntegrityError):  # the event conflicts: the tracking record is not kept
        recorder.insert_events([_stored(taken, 1)], tracking=Tracking("Leader", 4))
    assert recorder.max_tracking_id("Leader") == 3
    with pytest.raises(IntegrityError):  # the tracking conflicts: the event is not kept
        recorder.insert_events([_stored(uuid4(), 1)], tracking=Tracking("Leader", 3))
    assert log.head() == 2
    stream = "es/Follower/tracking/Leader"
    assert [r.event.notification_id for r in log.read_stream(stream)] == [3]  # type: ignore[attr-defined]


def test_a_recorder_on_a_stream_that_is_not_eventsourcing_s_names_the_record(
    log: EventLog,
) -> None:
    log.append("es/events/intruder", [OtherWriterNoted(note="z")], expected_version=NO_STREAM)
    recorder = EventLogApplicationRecorder(log)
    with pytest.raises(DataError, match=r"seq 1.*not a record of an eventsourcing application"):
        recorder.insert_events([_stored("intruder", 1)])


def test_a_closed_log_is_an_interface_error(log_target: str) -> None:
    log = EventLog.open(log_target)
    recorder = EventLogApplicationRecorder(log)
    log.close()
    with pytest.raises(InterfaceError):
        recorder.insert_events([_stored(uuid4(), 1)])


def test_the_factory_names_the_missing_setting() -> None:
    env = {"PERSISTENCE_MODULE": "eventlog.integrations.eventsourcing"}
    with pytest.raises(OSError, match="EVENTLOG_URL"):
        InfrastructureFactory.construct(env)


def test_applications_sharing_a_log_keep_apart(log_target: str) -> None:
    base = {"PERSISTENCE_MODULE": "eventlog.integrations.eventsourcing", "EVENTLOG_URL": log_target}
    factories = [
        InfrastructureFactory.construct(Environment(name, base)) for name in ("Left", "Right")
    ]
    try:
        assert all(isinstance(f, EventLogFactory) for f in factories)
        left, right = (f.application_recorder() for f in factories)
        left.insert_events([_stored("same-id", 1)])
        right.insert_events([_stored("same-id", 1)])  # no conflict: another application
        assert len(left.select_events("same-id")) == len(right.select_events("same-id")) == 1
    finally:
        for factory in factories:
            factory.close()


def test_replay_decodes_the_application_s_records(log_target: str, log: EventLog) -> None:
    EventLogApplicationRecorder(log).insert_events([_stored(uuid4(), 1, topic="bank:Opened")])
    # A fresh process: this one has the vocabulary registered already.
    code = "import sys; from eventlog.cli.main import main; sys.exit(main())"
    done = subprocess.run(
        [sys.executable, "-c", code, "replay", log_target], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "bank:Opened" in done.stdout


def test_importing_eventlog_does_not_import_eventsourcing() -> None:
    code = (
        "import sys, eventlog, eventlog.integrations.eventsourcing_events; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'eventsourcing'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_records_are_plain_msgpack_with_the_topic_readable_without_eventsourcing(
    log: EventLog,
) -> None:
    EventLogApplicationRecorder(log).insert_events([_stored("x", 1, topic="bank:Opened")])
    record = next(log.read_records())
    assert record.type == "eventsourcing.StoredEvent"
    assert msgspec.msgpack.decode(record.payload)["topic"] == "bank:Opened"


class _SubscribingCase(ApplicationRecorderTestCase[ApplicationRecorder]):
    """The peer's optional subscription test (not run by its suite), run on our recorder."""

    __test__ = False
    recorder: ApplicationRecorder

    def create_recorder(self) -> ApplicationRecorder:
        return self.recorder


def test_the_peer_s_optional_subscription_test_passes(log: EventLog) -> None:
    case = _SubscribingCase("optional_test_insert_subscribe")
    case.recorder = EventLogApplicationRecorder(log)
    case.optional_test_insert_subscribe()


def test_a_caught_up_subscription_waits_for_an_append_instead_of_polling(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records that are no notification of the application (its snapshots here) lie past
    its last notification id; the subscription waited for an append after that id, which
    returns at once on PostgreSQL: it asked for notifications thousands of times a second
    while there were none. It waits on the log's head."""
    import threading
    import time

    app = EventLogApplicationRecorder(log, namespace="es/App")
    snapshots = EventLogAggregateRecorder(log, namespace="es/App", purpose="snapshots")
    originator = uuid4()
    app.insert_events([_stored(originator, 1)])
    snapshots.insert_events([_stored(originator, 1, "snapshot")])  # past the notification
    calls: list[float] = []
    select = app.select_notifications

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(time.monotonic())
        return select(*args, **kwargs)

    monkeypatch.setattr(app, "select_notifications", counted)
    subscription = app.subscribe(gt=None)
    got: list[int] = []
    reader = threading.Thread(target=lambda: got.extend(n.id for n in subscription))
    reader.start()
    time.sleep(1.0)
    subscription.stop()
    reader.join()
    assert got == [1]
    assert len(calls) <= 60  # SQLite polls every 20 ms; PostgreSQL waits for NOTIFY (0.2 s)


def test_a_limit_of_zero_selects_no_event(log: EventLog) -> None:
    """Read from the stream's end with a page of 0 events, it was a DataError; the peer's
    SQLite recorder answers an empty list."""
    recorder = EventLogAggregateRecorder(log)
    originator = uuid4()
    recorder.insert_events([_stored(originator, v) for v in (1, 2, 3)])
    for desc in (True, False):
        assert recorder.select_events(originator, desc=desc, limit=0) == []
    assert len(recorder.select_events(originator, desc=True, limit=2)) == 2
