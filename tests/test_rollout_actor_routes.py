"""Event routes of rollout actors, without Ray: which route a log allows, and safe retries.

The actors themselves (real Ray, real vLLM) are pinned in tests/test_rollout_actor.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from eventlog import EventLog
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.errors import StorageUnavailableError
from eventlog.records import NO_STREAM, AppendRequest, AppendResult
from eventlog.recovery.errors import ConfigError
from eventlog.recovery.vocabulary import GenerationFailed, GenerationStarted, attempt_stream
from eventlog.rollout.routes import ChosenIds, check_route
from eventlog.rollout.worker import StagingGate


def started(rollout_id: str) -> GenerationStarted:
    return GenerationStarted(
        rollout_id=rollout_id,
        group_id="grp",
        generation_index=0,
        attempt=0,
        worker="w",
        model="m",
        weight_version=0,
        sampling_params={},
    )


class LostReplies:
    """A log whose first `lose` appends commit but answer StorageUnavailableError."""

    def __init__(self, log: EventLog, lose: int) -> None:
        self.log = log
        self.lose = lose
        self.calls = 0

    async def append_batch_async(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        self.calls += 1
        results = await self.log.append_batch_async(requests)
        if self.calls <= self.lose:
            raise StorageUnavailableError("connection lost after COMMIT (reply never came)")
        return results


def test_direct_route_is_refused_on_an_sqlite_log_naming_the_route(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"rollout\.route: 'direct' needs .*PostgreSQL"):
        check_route("direct", str(tmp_path / "run.db"))
    with pytest.raises(ConfigError, match=r"rollout\.route: expected one of"):
        check_route("sideways", None)
    assert check_route("forwarded", str(tmp_path / "run.db")) == "forwarded"
    assert check_route("direct", "postgresql+psycopg://u@127.0.0.1:5/db") == "direct"


def test_an_append_retried_after_a_lost_reply_lands_once_with_the_original_result(
    log_target: str,
) -> None:
    with EventLog.open(log_target) as log:
        flaky = LostReplies(log, lose=2)
        stream = attempt_stream("grp_g0")
        requests = [AppendRequest(stream, [started("grp_g0")], NO_STREAM)]

        results = asyncio.run(ChosenIds(flaky).append_batch_async(requests))
        more = asyncio.run(
            ChosenIds(log).append_batch_async(
                [AppendRequest(stream, [GenerationFailed(rollout_id="grp_g0", error="x")], 0)]
            )
        )

        records = list(log.read_stream(stream))
        assert flaky.calls == 3
        assert [r.type for r in records] == ["GenerationStarted", "GenerationFailed"]
        assert results[0].seqs == [records[0].seq]
        assert results[0].event_ids == [records[0].event_id]
        assert more[0].versions == [1]


def test_an_append_whose_replies_stay_lost_fails_after_the_retries(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "run.db") as log:
        flaky = LostReplies(log, lose=10)
        requests = [AppendRequest(attempt_stream("grp_g0"), [started("grp_g0")], NO_STREAM)]
        with pytest.raises(StorageUnavailableError):
            asyncio.run(ChosenIds(flaky, retries=2).append_batch_async(requests))
        assert flaky.calls == 3
        assert len(list(log.read_stream(attempt_stream("grp_g0")))) == 1


def test_a_held_staging_gate_waits_for_puts_in_flight_and_holds_new_ones_back() -> None:
    gate = StagingGate()
    plane = InMemoryDataPlane()
    inside, leave = threading.Event(), threading.Event()

    def slow_put() -> None:
        with gate.staging():
            inside.set()
            leave.wait(5)
            plane.put_rows("p", {"a": {"x": torch.zeros(1)}})

    first = threading.Thread(target=slow_put)
    first.start()
    inside.wait(5)
    held = threading.Thread(target=gate.hold)
    held.start()
    held.join(0.2)
    assert held.is_alive()  # a put is in flight: the checkpoint waits for it
    leave.set()
    held.join(5)
    first.join(5)
    assert not held.is_alive()

    def later_put() -> None:
        with gate.staging():
            plane.put_rows("p", {"b": {"x": torch.zeros(1)}})

    second = threading.Thread(target=later_put)
    second.start()
    second.join(0.2)
    assert sorted(plane.list_keys("p")) == ["a"]  # held back while the checkpoint saves
    gate.release()
    second.join(5)
    assert sorted(plane.list_keys("p")) == ["a", "b"]
