"""Stalls (FaultPlan.stall_until_*): a straggler waits before it generates until another
sibling is sealed or the weights reach a version, on a scripted engine and a real SQLite log.

The demo leans on them to make its checkpoint catch a group half-sealed on any machine, so
each release is pinned here: nothing is generated while the stall holds, everything once it
lets go, and a replacement worker keeps the stalls and the seals heard so far.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from eventlog import EventLog
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.demo.scenario import DemoDataset, demo_config, demo_faults
from eventlog.recovery.config import resolve_granularity
from eventlog.recovery.errors import ConfigError
from eventlog.recovery.vocabulary import attempt_stream
from eventlog.rollout.actor import ActorSpec
from eventlog.rollout.faults import FaultPlan
from eventlog.rollout.sampling import Sampling
from eventlog.rollout.settings import LoopSettings
from eventlog.rollout.worker import RolloutWorker
from tests.test_rollout_worker_path import TOKENS, ScriptedEngine

SAMPLING = Sampling(n=1, max_tokens=TOKENS, seed=1, ignore_eos=True)


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EventLog]:
    with EventLog.open(tmp_path / "run.db") as opened:
        yield opened


def _types(log: EventLog, rollout_id: str) -> list[str]:
    return [e.type for e in log.read_stream(attempt_stream(rollout_id))]


async def _held_until(
    release: Callable[[], None], attempt: asyncio.Task[object], log: EventLog
) -> None:
    """The attempt started but generates nothing while held; `release()` lets it finish."""
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert not attempt.done()
    assert _types(log, "late_g1") == ["GenerationStarted"]
    release()
    await asyncio.wait_for(attempt, timeout=10)


def test_an_attempt_stalled_on_a_seal_generates_only_once_that_seal_landed(
    log: EventLog,
) -> None:
    faults = FaultPlan(stall_until_sealed={"late_g1": "other_g0"})
    worker = RolloutWorker(ScriptedEngine(), log, InMemoryDataPlane(), faults=faults)

    async def scenario() -> None:
        attempt: asyncio.Task[object] = asyncio.create_task(
            worker.run_attempt("late", 1, 0, "p", SAMPLING, "overlap")
        )
        faults.seal_landed("other_g1")  # another sibling's seal releases nothing
        # A retry's seal (attempt 2 of the sibling) is the sibling's seal: it releases.
        await _held_until(lambda: faults.seal_landed("other_g0-a2"), attempt, log)

    asyncio.run(scenario())
    assert _types(log, "late_g1") == ["GenerationStarted", "TokensStaged", "GenerationFinished"]


def test_every_attempt_of_a_sibling_stalled_on_weights_waits_for_that_version(
    log: EventLog,
) -> None:
    faults = FaultPlan(stall_until_weights={"late_g1": 2})
    worker = RolloutWorker(ScriptedEngine(), log, InMemoryDataPlane(), faults=faults)
    assert faults.stalled("late_g1-a3", weight_version=1)  # a retry is held too
    assert not faults.stalled("late_g0", weight_version=0)  # another sibling is not

    def new_weights() -> None:
        worker.weight_version = 1
        assert faults.stalled("late_g1", worker.weight_version)
        worker.weight_version = 2

    async def scenario() -> None:
        attempt: asyncio.Task[object] = asyncio.create_task(
            worker.run_attempt("late", 1, 0, "p", SAMPLING, "overlap")
        )
        await _held_until(new_weights, attempt, log)

    asyncio.run(scenario())
    assert _types(log, "late_g1")[-1] == "GenerationFinished"


def test_a_replacement_workers_plan_drops_kills_and_shares_stalls_and_seals() -> None:
    faults = FaultPlan(
        fail_after_tokens={"a_g0": 3},
        kill_after_tokens={"a_g1": 2},
        stall_until_sealed={"a_g2": "b_g0"},
        stall_until_weights={"a_g3": 1},
    )
    fresh = faults.without_kills()
    assert (fresh.fail_after_tokens, fresh.kill_after_tokens) == ({"a_g0": 3}, {})
    assert fresh.stalled("a_g2", 0) and fresh.stalled("a_g3", 0)
    faults.seal_landed("b_g0")  # heard by the first plan: the replacement is released too
    assert not fresh.stalled("a_g2", 0)


def test_rollout_actors_refuse_stalls_they_would_never_see_end() -> None:
    """An actor hears neither the controller's seals nor new weights while an attempt waits."""
    with pytest.raises(ConfigError, match=r"stalls need in-process.*a_g2"):
        ActorSpec(engine=ScriptedEngine, faults=FaultPlan(stall_until_sealed={"a_g2": "b_g0"}))
    with pytest.raises(ConfigError, match=r"stalls need in-process.*a_g3"):
        ActorSpec(engine=ScriptedEngine, faults=FaultPlan(stall_until_weights={"a_g3": 1}))
    ActorSpec(engine=ScriptedEngine, faults=FaultPlan(fail_after_tokens={"a_g1": 2}))


def test_the_demo_stalls_only_in_process_workers_and_never_with_one_slot() -> None:
    settings = LoopSettings(groups_per_step=2, siblings=3, slots=4)
    plan = demo_faults(settings)
    assert plan.stall_until_sealed == {"step1-g0_g0": "step2-g0_g0"}
    assert plan.stall_until_weights == {"step2-g0_g2": 1}
    assert not demo_faults(settings, in_process=False).stall_until_sealed
    # One slot held by a straggler would leave none for the sibling that releases it.
    assert not demo_faults(LoopSettings(slots=1)).stall_until_sealed


@pytest.mark.parametrize("groups", [1, 2, 3, 5])
def test_the_demo_stalls_on_a_sibling_group_of_step_2_or_not_at_all(groups: int) -> None:
    """A prompt_group group seals its siblings only all at once: stalling step 1 on one of
    its siblings while its last one waits for step 1's weights would never end (an odd
    --groups put an arithmetic group first in step 2). The stalls name step 2's first echo
    group, which the demo's configuration resolves to `sibling`; with none, there are none."""
    settings = LoopSettings(groups_per_step=groups, siblings=3, slots=4)
    plan = demo_faults(settings)
    config, dataset = demo_config(), DemoDataset()
    step2 = dataset.sample_ids(2, groups)
    echo = [j for j, s in enumerate(step2) if dataset.get(s)["task_name"] == "echo"]
    if not echo:
        assert not plan.stall_until_sealed and not plan.stall_until_weights
        return
    (released_by,) = plan.stall_until_sealed.values()
    assert released_by == f"step2-g{echo[0]}_g0"
    (weights_wait,) = plan.stall_until_weights
    assert weights_wait == f"step2-g{echo[0]}_g2"
    assert resolve_granularity(config, dataset.get(step2[echo[0]])) == "sibling"
