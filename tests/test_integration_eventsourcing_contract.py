"""The `eventsourcing` library's own recorder test cases, unmodified, judging eventlog.

Each class below subclasses one of its test cases (eventsourcing.tests.persistence) and adds
only the hook that makes the recorder or the factory, on a fresh log per test: an SQLite file,
or a new database on the session's PostgreSQL server. Cases that cannot pass are listed, with
the reason, in the README ("Using eventlog from eventsourcing").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    ProcessRecorder,
    TrackingRecorder,
)
from eventsourcing.tests.persistence import (
    AggregateRecorderTestCase,
    ApplicationRecorderTestCase,
    InfrastructureFactoryTestCase,
    NonInterleavingNotificationIDsBaseCase,
    ProcessRecorderTestCase,
    TrackingRecorderTestCase,
)
from eventsourcing.utils import Environment

from eventlog import EventLog
from eventlog.integrations.eventsourcing import (
    EventLogAggregateRecorder,
    EventLogApplicationRecorder,
    EventLogFactory,
    EventLogProcessRecorder,
    EventLogTrackingRecorder,
)

MODULE = "eventlog.integrations.eventsourcing"


class _Target:
    """The current test's log location and the logs its hook opened (closed after it)."""

    location = ""
    logs: list[EventLog] = []  # noqa: RUF012 - one test at a time


@pytest.fixture(autouse=True)
def _fresh_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
    backend = getattr(request.cls, "backend", "sqlite")
    if backend == "sqlite":
        _Target.location = str(tmp_path / "es.db")
    else:
        _Target.location = request.getfixturevalue("fresh_postgres_url")
    _Target.logs = []
    yield
    for log in _Target.logs:
        log.close()


def _log() -> EventLog:
    log = EventLog.open(_Target.location)
    _Target.logs.append(log)
    return log


# -- aggregate recorder ------------------------------------------------------------------------


class TestAggregateRecorder(AggregateRecorderTestCase):
    backend = "sqlite"

    def create_recorder(self) -> AggregateRecorder:
        return EventLogAggregateRecorder(_log(), purpose="snapshots")


@pytest.mark.postgres
@pytest.mark.slow
class TestAggregateRecorderPostgres(TestAggregateRecorder):
    backend = "postgresql"


# -- application recorder ----------------------------------------------------------------------


class TestApplicationRecorder(ApplicationRecorderTestCase[ApplicationRecorder]):
    backend = "sqlite"

    def create_recorder(self) -> ApplicationRecorder:
        return EventLogApplicationRecorder(_log())


@pytest.mark.postgres
@pytest.mark.slow
class TestApplicationRecorderPostgres(TestApplicationRecorder):
    backend = "postgresql"


class TestNonInterleavingNotificationIds(NonInterleavingNotificationIDsBaseCase):
    backend = "sqlite"

    def create_recorder(self) -> ApplicationRecorder:
        return EventLogApplicationRecorder(_log())


@pytest.mark.postgres
@pytest.mark.slow
class TestNonInterleavingNotificationIdsPostgres(TestNonInterleavingNotificationIds):
    backend = "postgresql"


# -- tracking and process recorders ------------------------------------------------------------


class TestTrackingRecorder(TrackingRecorderTestCase):
    backend = "sqlite"

    def create_recorder(self) -> TrackingRecorder:
        return EventLogTrackingRecorder(_log())


@pytest.mark.postgres
@pytest.mark.slow
class TestTrackingRecorderPostgres(TestTrackingRecorder):
    backend = "postgresql"


class TestProcessRecorder(ProcessRecorderTestCase):
    backend = "sqlite"

    def create_recorder(self) -> ProcessRecorder:
        return EventLogProcessRecorder(_log())


@pytest.mark.postgres
@pytest.mark.slow
class TestProcessRecorderPostgres(TestProcessRecorder):
    backend = "postgresql"


# -- infrastructure factory --------------------------------------------------------------------


class _TrackingRecorderSubclass(EventLogTrackingRecorder):
    pass


class TestInfrastructureFactory(InfrastructureFactoryTestCase[EventLogFactory]):
    backend = "sqlite"

    def setUp(self) -> None:
        env: dict[str, Any] = {"PERSISTENCE_MODULE": MODULE, "EVENTLOG_URL": _Target.location}
        self.env = Environment("TestCase", env)
        super().setUp()

    def expected_factory_class(self) -> type[EventLogFactory]:
        return EventLogFactory

    def expected_aggregate_recorder_class(self) -> type[AggregateRecorder]:
        return EventLogAggregateRecorder

    def expected_application_recorder_class(self) -> type[ApplicationRecorder]:
        return EventLogApplicationRecorder

    def expected_tracking_recorder_class(self) -> type[TrackingRecorder]:
        return EventLogTrackingRecorder

    def tracking_recorder_subclass(self) -> type[TrackingRecorder]:
        return _TrackingRecorderSubclass

    def expected_process_recorder_class(self) -> type[ProcessRecorder]:
        return EventLogProcessRecorder


@pytest.mark.postgres
@pytest.mark.slow
class TestInfrastructureFactoryPostgres(TestInfrastructureFactory):
    backend = "postgresql"


del AggregateRecorderTestCase, ApplicationRecorderTestCase, InfrastructureFactoryTestCase
del NonInterleavingNotificationIDsBaseCase, ProcessRecorderTestCase, TrackingRecorderTestCase
