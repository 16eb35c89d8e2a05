"""The benchmark workload: ~200-byte seal events interleaved over ~1000 prompt-group streams.

Every implementation executes the same plan (the same calls, rows and per-stream versions),
so figures differ only by what each implementation does per call.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from eventlog import NO_STREAM
from eventlog.events import Event, event_type
from eventlog.records import ExpectedVersion
from eventlog.recovery.vocabulary import Receipt

STREAMS = 1000
"""Prompt groups written at once, like one training step of a real run."""


@event_type
class BenchSiblingSealed(Event, frozen=True, kw_only=True):
    """A SiblingSealed look-alike (ids, reward, staging keys); its msgpack is ~200 bytes."""

    schema: ClassVar[int] = 1
    group_id: str
    generation_index: int
    attempt: int
    rollout_id: str
    receipt: Receipt | None
    reward: float
    mask_sample: bool


@dataclass(frozen=True, slots=True)
class Request:
    """Events for one stream in one call; `first_version` is the version of events[0]."""

    stream: str
    events: list[Event]
    expected: ExpectedVersion
    first_version: int


Call = list[Request]
"""What one append call carries (one request for single-stream appends, many for a batch)."""


def _group_ids(seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"p{index:04d}-{rng.getrandbits(32):08x}" for index in range(STREAMS)]


def _event(group_id: str, version: int, rng: random.Random) -> BenchSiblingSealed:
    index, attempt = version % 16, version // 16
    rollout = f"{group_id}_g{index}" if attempt == 0 else f"{group_id}_g{index}-a{attempt}"
    keys = [f"{rollout}/c{call}" for call in range(2)]
    return BenchSiblingSealed(
        group_id=group_id,
        generation_index=index,
        attempt=attempt,
        rollout_id=rollout,
        receipt=Receipt(rollout_id=rollout, staging_keys=keys),
        reward=round(rng.random(), 6),
        mask_sample=rng.random() < 0.1,
    )


class _Streams:
    """Per-stream versions as the plan hands out events (version 0 first)."""

    def __init__(self, seed: int) -> None:
        self.ids = _group_ids(seed)
        self.next_version = [0] * STREAMS
        self.rng = random.Random(seed + 1)

    def take(self, stream_index: int) -> tuple[str, Event, int]:
        version = self.next_version[stream_index]
        self.next_version[stream_index] = version + 1
        group_id = self.ids[stream_index]
        return f"group/{group_id}", _event(group_id, version, self.rng), version


def _expected(first_version: int) -> ExpectedVersion:
    return NO_STREAM if first_version == 0 else first_version - 1


def batch_plan(events: int, batch: int, seed: int = 7) -> list[Call]:
    """One writer: `events` events on random streams, cut into calls of `batch` events.

    Inside a call, events of the same stream form one request (in first-appearance order),
    each with the exact expected version a controller would pass.
    """
    streams = _Streams(seed)
    rng = random.Random(seed + 2)
    calls: list[Call] = []
    for start in range(0, events, batch):
        grouped: dict[str, Request] = {}
        for _ in range(min(batch, events - start)):
            stream, event, version = streams.take(rng.randrange(STREAMS))
            request = grouped.get(stream)
            if request is None:
                grouped[stream] = Request(stream, [event], _expected(version), version)
            else:
                request.events.append(event)
        calls.append(list(grouped.values()))
    return calls


def writers_plan(events: int, writers: int, seed: int = 7) -> list[list[Call]]:
    """`writers` concurrent appenders, one event per call; writer w owns streams s ≡ w (mod W).

    Disjoint streams mean exact expected versions never conflict, as with one controller
    task per prompt group.
    """
    streams = _Streams(seed)
    rng = random.Random(seed + 2)
    owned = [list(range(w, STREAMS, writers)) for w in range(writers)]
    plans: list[list[Call]] = [[] for _ in range(writers)]
    per_writer = max(1, events // writers)
    for _ in range(per_writer):
        for w in range(writers):
            stream, event, version = streams.take(rng.choice(owned[w]))
            plans[w].append([Request(stream, [event], _expected(version), version)])
    return plans


def count_events(calls: Sequence[Call]) -> int:
    return sum(len(request.events) for call in calls for request in call)
