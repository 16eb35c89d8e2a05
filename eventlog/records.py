"""The log's own types: records, append requests and results, expected-version markers."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence

import msgspec

from eventlog.events import Event


class StreamState(enum.Enum):
    """Expected-version markers that are not a number."""

    NO_STREAM = "no stream"
    """The stream must not exist yet."""
    ANY = "any version"
    """No check: append whatever the stream's version."""

    def __repr__(self) -> str:
        return self.name


NO_STREAM = StreamState.NO_STREAM
ANY = StreamState.ANY
ExpectedVersion = int | StreamState


class Proposed(msgspec.Struct, frozen=True):
    """An event with the id the caller chose, so that a retry after a lost reply is idempotent."""

    event: Event
    event_id: uuid.UUID


class AppendRequest(msgspec.Struct, frozen=True):
    """Events for one stream, appended only if the stream is at `expected_version`.

    With no events it appends nothing but still requires the version: a fence that the
    other requests of the same atomic batch depend on.
    """

    stream: str
    events: Sequence[Event | Proposed]
    expected_version: ExpectedVersion = ANY


class AppendResult(msgspec.Struct, frozen=True, gc=False):
    """Where an append landed: one seq, version and event id per event, in order.

    Untracked by the garbage collector (it holds only lists of plain values, so it can be
    in no cycle): a batch makes one per request, and tracked ones were rescanned for nothing.
    """

    stream: str
    seqs: list[int]
    versions: list[int]
    event_ids: list[uuid.UUID]

    @property
    def last_seq(self) -> int:
        return self.seqs[-1] if self.seqs else 0


class Record(msgspec.Struct, frozen=True, gc=False):
    """One stored event with its envelope, exactly as the log holds it.

    Records and recorded events hold values only (no cycles), so the garbage collector
    does not track them: a read makes one per record.
    """

    seq: int
    stream: str
    version: int
    event_id: uuid.UUID
    type: str
    schema: int
    recorded_at: int
    payload: bytes
    chain: bytes


class RecordedEvent(msgspec.Struct, frozen=True, gc=False):
    """A record together with its decoded event."""

    seq: int
    stream: str
    version: int
    event_id: uuid.UUID
    type: str
    schema: int
    recorded_at: int
    chain: bytes
    event: Event
