"""`staging_paused` releases every hold it took, also when cancelled mid-hold (issue 12).

A controller stopped while a checkpoint was taking the actors' staging holds left the holds
the actors went on to take in place: their workers waited for the gate forever and the next
controller's run stalled. Stand-ins for the actor handles (no Ray): a hold that the actor
completes after the caller stopped waiting, as a Ray actor does.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from eventlog.rollout.actor import ActorPool
from eventlog.rollout.pool import WorkerPool
from eventlog.rollout.worker import StagingGate


class _Call:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self) -> Any:
        return self.fn()


class GatedActor:
    """An actor's gate; `hold_staging` is answered only once `holds_done` is set."""

    def __init__(self, holds_done: asyncio.Event) -> None:
        self.gate = StagingGate()
        self.holds_done = holds_done
        self.hold_staging = _Call(self._hold)
        self.release_staging = _Call(self.gate.release)

    def _hold(self) -> asyncio.Future[None]:
        async def hold() -> None:
            await self.holds_done.wait()
            await asyncio.to_thread(self.gate.hold)

        # The caller's cancellation does not reach the actor's call: it runs on.
        return asyncio.shield(asyncio.ensure_future(hold()))

    def can_stage(self) -> bool:
        """A put goes through (the gate holds nothing)."""
        put = threading.Thread(target=_stage, args=(self.gate,), daemon=True)
        put.start()
        put.join(timeout=30)
        return not put.is_alive()


def _stage(gate: StagingGate) -> None:
    with gate.staging():
        pass


def test_a_checkpoint_cancelled_while_the_holds_are_in_flight_still_releases_every_actor() -> None:
    actors: list[GatedActor] = []

    async def main() -> None:
        holds_done = asyncio.Event()
        actors.extend([GatedActor(holds_done), GatedActor(holds_done)])
        pool = ActorPool(log=None, actors=actors, slots=1)  # type: ignore[arg-type]

        async def checkpoint() -> None:
            async with pool.staging_paused():
                raise AssertionError("the holds were never answered: not reached")

        task = asyncio.ensure_future(checkpoint())
        await asyncio.sleep(0.05)  # the holds are in flight
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        holds_done.set()  # the actors take their holds after the caller stopped waiting
        await asyncio.sleep(0.2)

    asyncio.run(main())

    assert [actor.can_stage() for actor in actors] == [True, True]


def test_a_thread_pool_checkpoint_cancelled_while_a_put_is_in_flight_releases_the_gate() -> None:
    """The workers' pool in the controller's process: its hold is a thread that waits for the
    puts in flight and runs on after the caller is cancelled."""
    pool = WorkerPool(None, None, None, workers=1, slots=1, partition="p")  # type: ignore[arg-type]
    put_may_end, inside = threading.Event(), threading.Event()

    def put() -> None:
        with pool.gate.staging():
            inside.set()
            put_may_end.wait()

    in_flight = threading.Thread(target=put, daemon=True)
    in_flight.start()
    assert inside.wait(30)  # the put is in flight before the checkpoint asks for the hold

    async def main() -> None:
        async def checkpoint() -> None:
            async with pool.staging_paused():
                raise AssertionError("the put never ended: not reached")

        task = asyncio.ensure_future(checkpoint())
        await asyncio.sleep(0.1)  # the hold waits for the put in flight
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        put_may_end.set()  # the hold is taken now, after the caller stopped waiting
        await asyncio.sleep(0.2)

    asyncio.run(main())

    stage = threading.Thread(target=_stage, args=(pool.gate,), daemon=True)
    stage.start()
    stage.join(timeout=30)
    assert not stage.is_alive()  # a put goes through: nothing holds the gate


def test_a_put_waiting_while_a_release_overtook_its_hold_goes_through() -> None:
    """A checkpoint cancelled right after sending the holds releases an actor before the
    actor's hold thread took the gate (its count at -1 for a moment). A put that began in
    that moment must not wait: the hold that follows brings the count back to 0 and wakes
    nobody, so a waiting put slept until another put happened to end."""
    gate = StagingGate()
    gate.release()  # the release arrives first
    put = threading.Thread(target=_stage, args=(gate,), daemon=True)
    put.start()
    put.join(timeout=2)
    gate.hold()  # the hold's thread takes it now: nothing is held any more
    put.join(timeout=30)
    assert not put.is_alive()
    held_later = threading.Thread(target=_stage, args=(gate,), daemon=True)
    gate.hold()  # and a real hold still holds
    held_later.start()
    held_later.join(timeout=0.3)
    assert held_later.is_alive()
    gate.release()
    held_later.join(timeout=30)
    assert not held_later.is_alive()
