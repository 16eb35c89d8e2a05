"""The mutation barrier: shared mutations, exclusive checkpoints, live cuts, no nesting."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from eventlog.recovery.barrier import Cut, MutationBarrier
from eventlog.recovery.errors import BarrierError

TIMEOUT_S = 30.0


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run one async test body on a fresh event loop, failing (not hanging) on a deadlock."""

    async def bounded() -> None:
        await asyncio.wait_for(main(), TIMEOUT_S)

    asyncio.run(bounded())


async def settle() -> None:
    """Let every runnable task advance as far as it can."""
    for _ in range(10):
        await asyncio.sleep(0)


async def hold(
    section: Any, entered: list[str], label: str, release: asyncio.Event, cuts: list[Cut]
) -> None:
    async with section as cut:
        entered.append(label)
        cuts.append(cut)
        await release.wait()
    entered.append(f"{label} left")


def test_many_mutations_are_inside_the_barrier_at_the_same_time() -> None:
    async def main() -> None:
        barrier = MutationBarrier()
        release = asyncio.Event()
        entered: list[str] = []
        cuts: list[Cut] = []
        tasks = [
            asyncio.create_task(hold(barrier.mutation("seal"), entered, f"m{i}", release, cuts))
            for i in range(5)
        ]
        await settle()
        assert sorted(entered) == ["m0", "m1", "m2", "m3", "m4"]
        assert all(cut.live and cut.kind == "seal" for cut in cuts)
        assert barrier.active_mutations == 5
        release.set()
        await asyncio.gather(*tasks)
        assert not any(cut.live for cut in cuts)
        assert barrier.active_mutations == 0

    run(main)


def test_checkpoint_waits_until_active_mutations_drain() -> None:
    async def main() -> None:
        barrier = MutationBarrier()
        release_mutation, release_checkpoint = asyncio.Event(), asyncio.Event()
        entered: list[str] = []
        cuts: list[Cut] = []
        mutation = asyncio.create_task(
            hold(barrier.mutation("seal"), entered, "m", release_mutation, cuts)
        )
        await settle()
        checkpoint = asyncio.create_task(
            hold(barrier.checkpoint(), entered, "c", release_checkpoint, cuts)
        )
        await settle()
        assert entered == ["m"]
        release_mutation.set()
        await settle()
        assert entered == ["m", "m left", "c"]
        assert cuts[1].kind == "checkpoint" and cuts[1].exclusive
        release_checkpoint.set()
        await asyncio.gather(mutation, checkpoint)

    run(main)


def test_new_mutations_wait_while_a_checkpoint_is_active() -> None:
    async def main() -> None:
        barrier = MutationBarrier()
        release_checkpoint, release_mutation = asyncio.Event(), asyncio.Event()
        entered: list[str] = []
        cuts: list[Cut] = []
        checkpoint = asyncio.create_task(
            hold(barrier.checkpoint(), entered, "c", release_checkpoint, cuts)
        )
        await settle()
        mutation = asyncio.create_task(
            hold(barrier.mutation("dispatch"), entered, "m", release_mutation, cuts)
        )
        await settle()
        assert entered == ["c"]
        release_checkpoint.set()
        await settle()
        assert entered == ["c", "c left", "m"]
        release_mutation.set()
        await asyncio.gather(checkpoint, mutation)

    run(main)


def test_waiting_checkpoint_blocks_new_mutations_so_it_is_not_starved() -> None:
    async def main() -> None:
        barrier = MutationBarrier()
        release_first, release_checkpoint, release_late = (asyncio.Event() for _ in range(3))
        entered: list[str] = []
        cuts: list[Cut] = []
        first = asyncio.create_task(
            hold(barrier.mutation("seal"), entered, "m1", release_first, cuts)
        )
        await settle()
        checkpoint = asyncio.create_task(
            hold(barrier.checkpoint(), entered, "c", release_checkpoint, cuts)
        )
        await settle()
        late = asyncio.create_task(
            hold(barrier.mutation("seal"), entered, "m2", release_late, cuts)
        )
        await settle()
        assert entered == ["m1"], "a mutation arriving after a waiting checkpoint must queue"
        release_first.set()
        await settle()
        assert entered == ["m1", "m1 left", "c"]
        release_checkpoint.set()
        await settle()
        assert entered == ["m1", "m1 left", "c", "c left", "m2"]
        release_late.set()
        await asyncio.gather(first, checkpoint, late)

    run(main)


SECTIONS: dict[str, Callable[[MutationBarrier], Any]] = {
    "mutation": lambda barrier: barrier.mutation("seal"),
    "checkpoint": lambda barrier: barrier.checkpoint(),
}


@pytest.mark.parametrize("outer", sorted(SECTIONS))
@pytest.mark.parametrize("inner", sorted(SECTIONS))
def test_opening_a_second_section_in_the_same_task_is_refused(outer: str, inner: str) -> None:
    async def main() -> None:
        barrier = MutationBarrier()
        async with SECTIONS[outer](barrier) as cut:
            with pytest.raises(BarrierError, match="pass the cut you have"):
                async with SECTIONS[inner](barrier):
                    pytest.fail("the nested section must not be entered")
            cut.require_live()  # the refusal leaves the outer section intact
        # and leaves the barrier clean: an exclusive section is available at once
        async with barrier.checkpoint() as checkpoint_cut:
            assert checkpoint_cut.live

    run(main)


def test_task_spawned_inside_a_section_is_refused_until_that_section_exits() -> None:
    async def main() -> None:
        barrier = MutationBarrier()

        async def child() -> str:
            async with barrier.mutation("seal") as cut:
                return cut.kind

        async with barrier.mutation("dispatch"):
            with pytest.raises(BarrierError, match="pass the cut you have"):
                await asyncio.create_task(child())
            late_child = asyncio.create_task(asyncio.sleep(0.01))
            spawned_here = asyncio.create_task(_after(late_child, child))
        assert await spawned_here == "seal"

    run(main)


async def _after(first: Awaitable[object], then: Callable[[], Awaitable[str]]) -> str:
    await first
    return await then()


def test_sections_in_different_barriers_do_not_count_as_nesting() -> None:
    async def main() -> None:
        ledger, other = MutationBarrier("ledger"), MutationBarrier("other")
        async with ledger.mutation("seal"), other.checkpoint() as cut:
            cut.require_live()

    run(main)


def test_cancelled_waiting_mutation_leaves_the_barrier_clean() -> None:
    async def main() -> None:
        barrier = MutationBarrier()
        release_checkpoint = asyncio.Event()
        entered: list[str] = []
        cuts: list[Cut] = []
        checkpoint = asyncio.create_task(
            hold(barrier.checkpoint(), entered, "c", release_checkpoint, cuts)
        )
        await settle()
        waiting = asyncio.create_task(
            hold(barrier.mutation("seal"), entered, "m", asyncio.Event(), cuts)
        )
        await settle()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        release_checkpoint.set()
        await checkpoint
        assert entered == ["c", "c left"]
        assert barrier.active_mutations == 0
        # nothing leaked: another checkpoint enters at once, and so does a mutation after it
        async with barrier.checkpoint() as cut:
            assert cut.live
        async with barrier.mutation("seal") as cut:
            assert cut.live

    run(main)


def test_cancelled_waiting_checkpoint_unblocks_mutations_and_leaves_the_barrier_clean() -> None:
    async def main() -> None:
        barrier = MutationBarrier()
        release_first, release_late = asyncio.Event(), asyncio.Event()
        entered: list[str] = []
        cuts: list[Cut] = []
        first = asyncio.create_task(
            hold(barrier.mutation("seal"), entered, "m1", release_first, cuts)
        )
        await settle()
        checkpoint = asyncio.create_task(
            hold(barrier.checkpoint(), entered, "c", asyncio.Event(), cuts)
        )
        await settle()
        late = asyncio.create_task(
            hold(barrier.mutation("seal"), entered, "m2", release_late, cuts)
        )
        await settle()
        assert entered == ["m1"]
        checkpoint.cancel()
        with pytest.raises(asyncio.CancelledError):
            await checkpoint
        await settle()
        assert entered == ["m1", "m2"], "the mutation held back by the checkpoint must now enter"
        assert barrier.waiting_checkpoints == 0
        release_first.set()
        release_late.set()
        await asyncio.gather(first, late)
        async with barrier.checkpoint() as cut:
            assert cut.live

    run(main)


def test_cancelling_a_section_body_releases_the_section() -> None:
    async def main() -> None:
        barrier = MutationBarrier()
        entered: list[str] = []
        cuts: list[Cut] = []
        body = asyncio.create_task(hold(barrier.checkpoint(), entered, "c", asyncio.Event(), cuts))
        await settle()
        body.cancel()
        with pytest.raises(asyncio.CancelledError):
            await body
        assert not cuts[0].live
        async with barrier.mutation("seal") as cut:
            assert cut.live

    run(main)


def test_section_left_by_an_exception_releases_the_section_and_kills_the_cut() -> None:
    async def main() -> None:
        barrier = MutationBarrier()
        kept: list[Cut] = []
        with pytest.raises(RuntimeError, match="boom"):
            async with barrier.mutation("seal") as cut:
                kept.append(cut)
                raise RuntimeError("boom")
        assert not kept[0].live
        async with barrier.checkpoint() as checkpoint_cut:
            assert checkpoint_cut.live

    run(main)


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_stale_cut_fails_require_live_after_its_section_exits(section: str) -> None:
    async def main() -> None:
        barrier = MutationBarrier()
        async with SECTIONS[section](barrier) as cut:
            assert cut.live
            cut.require_live()
        assert cut.kind == ("seal" if section == "mutation" else "checkpoint")
        assert not cut.live
        with pytest.raises(BarrierError, match=r"stale.*exited"):
            cut.require_live()

    run(main)


@pytest.mark.parametrize("kind", ["", "checkpoint"])
def test_mutation_kind_must_be_a_name_other_than_checkpoint(kind: str) -> None:
    with pytest.raises(BarrierError, match="mutation kind"):
        MutationBarrier().mutation(kind)
