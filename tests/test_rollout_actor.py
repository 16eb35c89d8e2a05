"""Rollout workers as Ray actors on the real Ray + TransferQueue + vLLM (tiny model).

Two actors for the whole module (each starts its own engine, in its own process): one
forwards its appends to the caller, one appends directly to a PostgreSQL log. What is pinned:
the worker's ordering rules hold across the hop (TokensStaged only once the row is in the
data plane, GenerationStarted before the first token), a direct actor's events are its own
appends, and a second worker on the same rollout id fails whichever route either one takes.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from eventlog import EventLog
from eventlog.errors import ConcurrencyError
from eventlog.records import AppendRequest, AppendResult, Proposed
from eventlog.recovery.vocabulary import GenerationStarted, TokensStaged, attempt_stream
from eventlog.rollout.sampling import Sampling
from tests.fixtures.tq import ClearableDataPlane
from tests.fixtures.vllm import stream_types

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.tq, pytest.mark.postgres]

PROMPT = "Question: what is 2 + 3? Answer:"
PARTITION = "actor-staging"
HOLD_START_S = 1.5
_databases = itertools.count()


@dataclass
class Actors:
    forwarded: Any
    direct: Any
    pg_url: str


@pytest.fixture(scope="module")
def actors(tq_runtime: object, tiny_model_dir: Path, postgres_server: Any) -> Iterator[Actors]:
    import psycopg
    from psycopg import sql

    from eventlog.rollout.actor import ActorSpec, VllmEngineFactory, start_actors, stop_actors

    name = f"actors_{next(_databases)}"
    server = dict(host=postgres_server.host, port=postgres_server.port, user=postgres_server.user)
    with psycopg.connect(**server, dbname="postgres", autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = postgres_server.url(name)
    EventLog.open(url).close()  # at head: a direct actor opens it without creating
    engine = VllmEngineFactory(str(tiny_model_dir))
    handles = start_actors(
        [
            ActorSpec(engine=engine, route="forwarded", partition=PARTITION),
            ActorSpec(engine=engine, route="direct", log_target=url, partition=PARTITION),
        ],
        name="test-actor",
    )
    try:
        yield Actors(forwarded=handles[0], direct=handles[1], pg_url=url)
    finally:
        stop_actors(handles)
        with psycopg.connect(**server, dbname="postgres", autocommit=True) as conn:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            conn.execute(drop.format(sql.Identifier(name)))


def sampling(seed: int, n: int = 1) -> Sampling:
    return Sampling(n=n, max_tokens=6, seed=seed, ignore_eos=True)


def events_of(requests: Sequence[AppendRequest]) -> list[object]:
    return [e.event if isinstance(e, Proposed) else e for r in requests for e in r.events]


class Watching:
    """The caller's side of ``forwarded``: notes what held when each append arrived."""

    def __init__(self, log: EventLog, plane: ClearableDataPlane, actor: Any) -> None:
        self.log = log
        self.plane = plane
        self.actor = actor
        self.tokens_before = -1
        self.tokens_at_start: list[int] = []
        self.row_present_at_staged: dict[str, bool] = {}

    async def append_batch_async(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        for event in events_of(requests):
            if isinstance(event, GenerationStarted):
                # Hold the acknowledgement: a worker that generated before its start is
                # durable would count tokens meanwhile.
                await asyncio.sleep(HOLD_START_S)
                stats = await self.actor.stats.remote()
                self.tokens_at_start.append(int(stats["generated_tokens"]) - self.tokens_before)
            elif isinstance(event, TokensStaged):
                keys = self.plane.list_keys(event.partition)
                self.row_present_at_staged[event.staging_key] = event.staging_key in keys
        return await self.log.append_batch_async(requests)


def test_forwarded_appends_keep_the_order_rules_and_land_in_the_callers_sqlite_log(
    actors: Actors, tq_data_plane: ClearableDataPlane, tmp_path: Path
) -> None:
    from eventlog.rollout.actor import ActorPool

    with EventLog.open(tmp_path / "run.db") as log:
        watching = Watching(log, tq_data_plane, actors.forwarded)
        pool = ActorPool(watching, [actors.forwarded], slots=2)

        async def run() -> list[Any]:
            watching.tokens_before = int(
                (await actors.forwarded.stats.remote())["generated_tokens"]
            )
            return await pool.call(
                actors.forwarded,
                "fwd",
                [(0, 0), (1, 0)],
                PROMPT,
                sampling(3, n=2),
                "two_turn_digits",
            )

        results = asyncio.run(run())

        assert watching.tokens_at_start == [0, 0]  # one atomic start for both siblings
        assert [r.finished for r in results] == [True, True]
        staged = {k for r in results if r.receipt for k in r.receipt.staging_keys}
        assert len(staged) == 4  # two calls per sibling
        assert watching.row_present_at_staged == dict.fromkeys(staged, True)
        for result in results:
            assert stream_types(log, result.rollout_id) == [
                "GenerationStarted",
                "TokensStaged",
                "TokensStaged",
                "GenerationFinished",
            ]


def test_a_direct_actor_appends_its_own_attempt_stream_to_postgresql(
    actors: Actors, tq_data_plane: ClearableDataPlane
) -> None:
    from eventlog.rollout.actor import ActorPool

    with EventLog.open(actors.pg_url) as log:
        head = log.head()
        pool = ActorPool(log, [actors.direct], slots=1)
        (result,) = asyncio.run(
            pool.call(actors.direct, "dir", [(0, 0)], PROMPT, sampling(5), None)
        )
        worker_id = asyncio.run(_remote(actors.direct.worker_id.remote()))

        records = list(log.read_stream(attempt_stream(result.rollout_id)))
        assert stream_types(log, result.rollout_id) == [
            "GenerationStarted",
            "TokensStaged",
            "GenerationFinished",
        ]
        assert isinstance(records[0].event, GenerationStarted)
        assert records[0].event.worker == worker_id
        assert log.commits == 0  # nothing went through the caller's writer
        assert log.head() == head + len(records)  # every record of the call is its attempt's
        assert result.receipt is not None
        assert set(result.receipt.staging_keys) <= set(tq_data_plane.list_keys(PARTITION))


async def _remote(ref: Any) -> Any:
    return await ref


@pytest.mark.parametrize("first", ["direct", "forwarded"])
def test_a_second_worker_on_the_same_rollout_id_fails_and_appends_nothing(
    actors: Actors, first: str
) -> None:
    from eventlog.rollout.actor import ActorPool, RemoteAttemptError

    one, two = (
        (actors.direct, actors.forwarded)
        if first == "direct"
        else (actors.forwarded, actors.direct)
    )
    group = f"twice-{first}"
    with EventLog.open(actors.pg_url) as log:
        pool = ActorPool(log, [one, two], slots=2)
        (done,) = asyncio.run(pool.call(one, group, [(0, 0)], PROMPT, sampling(7), None))
        head = log.head()

        with pytest.raises((ConcurrencyError, RemoteAttemptError)) as failed:
            asyncio.run(pool.call(two, group, [(0, 0)], PROMPT, sampling(7), None))

        assert "ConcurrencyError" in repr(failed.value) or isinstance(
            failed.value, ConcurrencyError
        )
        assert log.head() == head
        first_worker = asyncio.run(_remote(one.worker_id.remote()))
        starts = [
            r.event
            for r in log.read_stream(attempt_stream(done.rollout_id))
            if isinstance(r.event, GenerationStarted)
        ]
        assert [s.worker for s in starts] == [first_worker]
