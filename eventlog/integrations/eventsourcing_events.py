"""The records an `eventsourcing` application keeps in an eventlog log.

Kept apart from `eventlog.integrations.eventsourcing` so that reading such a log (replay, an
audit) needs neither the `eventsourcing` package nor its import time.
"""

from __future__ import annotations

from eventlog.events import Event, event_type


@event_type
class EsStoredEvent(Event, frozen=True, kw_only=True, tag="eventsourcing.StoredEvent"):
    """One stored event of an application (an aggregate event or a snapshot), as its mapper
    made it: the topic names the class, the state is the mapper's bytes (maybe encrypted)."""

    originator_id: str
    originator_id_is_uuid: bool
    """`originator_id` was a UUID (given back as one), not a string id."""
    originator_version: int
    topic: str
    state: bytes


@event_type
class EsTracking(Event, frozen=True, kw_only=True, tag="eventsourcing.Tracking"):
    """A process application has processed `notification_id` of `application_name`."""

    application_name: str
    notification_id: int
