"""The controller loop in process: the session's real vLLM engine, a real SQLite log.

Each test runs a small run (one or a few steps) and reads the log back: what was sealed is
what the workers reported, failures are retried by the group's stored granularity, a dead
worker is replaced, and a controller that stops mid-step is replaced by one that restores
from the checkpoint and finishes without training anything twice.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlog import EventLog
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.demo.checks import check_run
from eventlog.demo.scenario import DemoDataset, demo_config
from eventlog.records import RecordedEvent
from eventlog.recovery.vocabulary import (
    AttemptFailed,
    CheckpointCommitted,
    GenerationFailed,
    GenerationFinished,
    GenerationStarted,
    GroupAbandoned,
    GroupFinalized,
    GroupReserved,
    GroupSealed,
    RetryPrepared,
    SealResult,
    SiblingsDispatched,
    SiblingSealed,
    StaleResultRejected,
    UnsealedAbandoned,
    group_stream,
    logical_id,
)
from eventlog.rollout.agents import get_agent
from eventlog.rollout.controller import Controller, LoopSettings, RunReport
from eventlog.rollout.faults import FaultPlan
from projections.history import rebuild, rolled_back
from tests.fixtures.vllm import VllmSession

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

MAX_TOKENS = 8
ONE_STEP = LoopSettings(steps=1, groups_per_step=2, siblings=3, max_tokens=MAX_TOKENS, slots=8)


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EventLog]:
    with EventLog.open(tmp_path / "run.db") as opened:
        yield opened


def run_controller(
    session: VllmSession,
    log: EventLog,
    tmp_path: Path,
    settings: LoopSettings = ONE_STEP,
    faults: FaultPlan | None = None,
    restore_step: int | None = None,
) -> RunReport:
    controller = Controller(
        log=log,
        data_plane=InMemoryDataPlane(),
        engine=session.engine,
        source=DemoDataset(),
        config=demo_config(),
        settings=settings,
        checkpoint_dir=tmp_path / "checkpoints",
        faults=faults,
        restore_step=restore_step,
    )
    return session.run(controller.run())


def seals(records: list[RecordedEvent]) -> dict[tuple[str, int], SealResult]:
    """The sealed result per (group, sibling), from SiblingSealed and GroupSealed alike."""
    found: dict[tuple[str, int], SealResult] = {}
    for r in records:
        if isinstance(r.event, GroupSealed):
            for result in r.event.results:
                found[(r.event.group_id, result.generation_index)] = result
        elif isinstance(r.event, SiblingSealed):
            e = r.event
            found[(e.group_id, e.generation_index)] = SealResult(
                generation_index=e.generation_index,
                attempt=e.attempt,
                rollout_id=e.rollout_id,
                receipt=e.receipt,
                reward=e.reward,
                mask_sample=e.mask_sample,
            )
    return found


def events_of(log: EventLog, stream: str) -> list[object]:
    return [r.event for r in log.read_stream(stream)]


def test_seals_carry_the_reward_and_mask_sample_each_attempt_reported(
    vllm_session: VllmSession, log: EventLog, tmp_path: Path
) -> None:
    faults = FaultPlan()
    report = run_controller(vllm_session, log, tmp_path, faults=faults)

    records = list(log.read())
    reserved = {r.event.group_id: r.event for r in records if isinstance(r.event, GroupReserved)}
    # The YAML's agent override made the arithmetic group prompt_group; echo stays sibling.
    assert {g: e.granularity for g, e in reserved.items()} == {
        "step1-g0": "sibling",
        "step1-g1": "prompt_group",
    }
    finished = {
        r.event.rollout_id: r.event for r in records if isinstance(r.event, GenerationFinished)
    }
    sealed = seals(records)
    assert len(sealed) == 2 * 3
    # Each seal, of one sibling or of the whole group, was reported to the fault plan (a
    # stall waiting on it lets go then).
    assert faults.sealed == {logical_id(gid, index) for gid, index in sealed}
    for (gid, _), result in sealed.items():
        outcome = finished[result.rollout_id]
        agent = get_agent(reserved[gid].agent_name)
        assert result.reward == outcome.reward
        assert result.mask_sample == agent.mask_sample(outcome.finish_reason)
        assert result.receipt is not None
        assert result.receipt.staging_keys == outcome.staging_keys
    # The trainer saw exactly those rewards and masks in the canonical rows.
    kept = [r.reward for r in sealed.values() if not r.mask_sample]
    (step,) = report.steps
    assert step.masked_rows == sum(r.mask_sample for r in sealed.values())
    assert step.mean_reward == pytest.approx(sum(kept) / len(kept) if kept else 0.0)


def test_a_failed_sibling_attempt_reruns_only_that_sibling(
    vllm_session: VllmSession, log: EventLog, tmp_path: Path
) -> None:
    faults = FaultPlan(fail_after_tokens={"step1-g0_g1": 3})
    run_controller(vllm_session, log, tmp_path, faults=faults)

    group = events_of(log, group_stream("step1-g0"))
    failed = [e for e in group if isinstance(e, AttemptFailed)]
    assert [(e.generation_index, e.rollout_id) for e in failed] == [(1, "step1-g0_g1")]
    (retry,) = [e for e in group if isinstance(e, RetryPrepared)]
    assert [a.rollout_id for a in retry.attempts] == ["step1-g0_g1-a1"]
    assert not [e for e in group if isinstance(e, UnsealedAbandoned | GroupAbandoned)]
    sealed = seals(list(log.read()))
    assert [sealed[("step1-g0", i)].attempt for i in range(3)] == [0, 1, 0]


def test_a_failed_prompt_group_attempt_reruns_every_sibling_and_rejects_late_results(
    vllm_session: VllmSession, log: EventLog, tmp_path: Path
) -> None:
    # In the second call of the two-call agent: its first row is already staged.
    faults = FaultPlan(fail_after_tokens={"step1-g1_g0": MAX_TOKENS + 2})
    report = run_controller(vllm_session, log, tmp_path, faults=faults)

    group = events_of(log, group_stream("step1-g1"))
    (abandoned,) = [e for e in group if isinstance(e, GroupAbandoned)]
    assert [(a.generation_index, a.attempt) for a in abandoned.attempts] == [(0, 0), (1, 0), (2, 0)]
    (retry,) = [e for e in group if isinstance(e, RetryPrepared)]
    assert [(a.generation_index, a.attempt) for a in retry.attempts] == [(0, 1), (1, 1), (2, 1)]
    rejected = [e for e in group if isinstance(e, StaleResultRejected)]
    assert rejected and report.rejected_results == len(rejected)
    assert {e.rollout_id for e in rejected} <= {"step1-g1_g1", "step1-g1_g2"}
    assert all(e.current_rollout_id == f"{e.rollout_id}-a1" for e in rejected)
    (sealed,) = [e for e in group if isinstance(e, GroupSealed)]
    assert [r.rollout_id for r in sealed.results] == [f"step1-g1_g{i}-a1" for i in range(3)]


def test_a_killed_worker_is_replaced_and_every_attempt_it_was_running_is_retried(
    vllm_session: VllmSession, log: EventLog, tmp_path: Path
) -> None:
    faults = FaultPlan(kill_after_tokens={"step1-g0_g0": 3})
    report = run_controller(vllm_session, log, tmp_path, faults=faults)

    ((dead, fresh),) = report.replaced_workers
    records = list(log.read())
    ended = {
        r.event.rollout_id
        for r in records
        if isinstance(r.event, GenerationFinished | GenerationFailed)
    }
    cut_off = [
        r.event
        for r in records
        if isinstance(r.event, GenerationStarted)
        and r.event.worker == dead
        and r.event.rollout_id not in ended
    ]
    assert "step1-g0_g0" in {e.rollout_id for e in cut_off}
    sealed = seals(records)
    for started in cut_off:  # each was retried, and a later attempt's result was sealed
        final = sealed[(started.group_id, started.generation_index)]
        assert final.attempt > started.attempt, started.rollout_id
    assert any(isinstance(r.event, GenerationStarted) and r.event.worker == fresh for r in records)
    finalized = Counter(r.event.group_id for r in records if isinstance(r.event, GroupFinalized))
    assert finalized == {"step1-g0": 1, "step1-g1": 1}


def test_a_restarted_controller_restores_the_checkpoint_and_trains_nothing_twice(
    vllm_session: VllmSession, tmp_path: Path
) -> None:
    settings = LoopSettings(steps=3, groups_per_step=2, siblings=3, max_tokens=MAX_TOKENS, slots=4)
    path = tmp_path / "run.db"
    first_log = EventLog.open(path)
    first = Controller(
        log=first_log,
        data_plane=InMemoryDataPlane(),
        engine=vllm_session.engine,
        source=DemoDataset(),
        config=demo_config(),
        settings=settings,
        checkpoint_dir=tmp_path / "checkpoints",
    )

    async def stop_mid_step_two() -> int:
        """Cancel the controller once step 1 is checkpointed and a seal followed it."""
        run = asyncio.create_task(first.run())
        seen, checkpointed = 0, False
        while not run.done():
            await asyncio.sleep(0.002)
            for record in first_log.read(from_seq=seen + 1):
                seen = record.seq
                event = record.event
                if isinstance(event, CheckpointCommitted) and event.step == 1:
                    checkpointed = True
                elif checkpointed and isinstance(event, SiblingSealed | GroupSealed):
                    run.cancel()
                    await asyncio.gather(run, return_exceptions=True)
                    return first_log.head()
        raise AssertionError("the run ended before it could be stopped")

    vllm_session.run(stop_mid_step_two())
    first_log.close()

    with EventLog.open(path) as log:  # a new process: new handle, empty data plane
        faults = FaultPlan()
        report = run_controller(vllm_session, log, tmp_path, settings=settings, faults=faults)
        plan = report.restore
        assert plan is not None and report.started_at_step == plan.checkpoint_step >= 1
        # The seals the restore kept are known sealed to the new process's fault plan.
        kept = {logical_id(g.group_id, s.generation_index) for g in plan.admitted for s in g.sealed}
        assert kept <= faults.sealed
        records = list(log.read())
        at_checkpoint = rebuild(
            [r for r in records if r.seq <= plan.checkpoint_seq], rolled_back([])
        )
        reused = sum(
            len(g.indices("sealed"))
            for g in at_checkpoint.groups.values()
            if g.granularity == "sibling" or g.status != "generating"
        )
        assert plan.counts["siblings_reused"] == reused
        assert [s.step for s in report.steps] == list(range(plan.checkpoint_step + 1, 4))
        check = check_run(log, steps=3, groups_per_step=2)
        assert check.problems == []
        assert check.groups_trained == 6


def test_a_group_finalized_before_the_checkpoint_returns_to_the_replay_buffer_and_trains_once(
    vllm_session: VllmSession, log: EventLog, tmp_path: Path
) -> None:
    settings = LoopSettings(steps=2, groups_per_step=1, siblings=2, max_tokens=MAX_TOKENS)
    # Step 1's sibling 1 fails three times, so step 2 (generated ahead) is finalized first.
    late = {f"step1-g0_g1{suffix}": 7 for suffix in ("", "-a1", "-a2")}
    run_controller(vllm_session, log, tmp_path, settings, faults=FaultPlan(fail_after_tokens=late))
    records = list(log.read())
    checkpoint_1 = next(
        r.seq for r in records if isinstance(r.event, CheckpointCommitted) and r.event.step == 1
    )
    finalized_at = {r.event.group_id: r.seq for r in records if isinstance(r.event, GroupFinalized)}
    assert finalized_at["step2-g0"] < checkpoint_1

    # A restart that goes back to step 1's checkpoint: step 2's training is rolled back.
    report = run_controller(vllm_session, log, tmp_path, settings, restore_step=1)
    assert report.restore is not None
    assert report.restore.replay_group_ids == ["step2-g0"]
    assert report.restore.counts["groups_restored"] == 0
    assert [(s.step, s.groups) for s in report.steps] == [(2, 1)]
    check = check_run(log, steps=2, groups_per_step=1)
    assert check.problems == []
    assert check.finalized_records == 2 and check.finalized_rolled_back == 0


def test_a_restored_controller_resumes_admitted_groups_before_admitting_reserved_ones(
    vllm_session: VllmSession, tmp_path: Path
) -> None:
    """Admitted groups may be the only work that can advance the trainer: they go first."""
    import msgspec

    from eventlog.recovery.barrier import MutationBarrier
    from eventlog.recovery.ledger import RecoveryLedger
    from eventlog.recovery.vocabulary import GroupAdmitted, PromptRef, RestoreCompleted

    settings = LoopSettings(steps=2, groups_per_step=1, siblings=2, max_tokens=MAX_TOKENS)
    source, path = DemoDataset(), tmp_path / "run.db"
    with EventLog.open(path) as log:  # a controller that died between reserve and admit
        plane = InMemoryDataPlane()
        ledger = RecoveryLedger.open(log, plane, config=demo_config())

        async def before_the_crash() -> None:
            barrier = MutationBarrier("controller")
            async with barrier.mutation("reserve") as cut:
                for step, admitted in ((1, True), (2, False)):
                    (sample,) = source.sample_ids(step, 1)
                    prompt = source.get(sample)
                    ledger.reserve(
                        cut,
                        group_id=f"step{step}-g0",
                        prompt=prompt,
                        prompt_ref=PromptRef(sample_id=sample, task_name=prompt["task_name"]),
                        expected_generations=2,
                        start_weight_version=0,
                        admitted=admitted,
                        target_step=step if admitted else None,
                        admission_id=f"step{step}",
                    )
                ledger.dispatch(cut, "step1-g0")
            async with barrier.checkpoint() as cut:
                ledger.checkpoint(cut, step=0, directory=str(tmp_path / "ckpt0"))

        vllm_session.run(before_the_crash())
        start = log.head()

    with EventLog.open(path) as log:
        report = run_controller(vllm_session, log, tmp_path, settings=settings)
        assert report.restore is not None
        assert [p.group_id for p in report.restore.admitted] == ["step1-g0"]
        after = [r for r in log.read(from_seq=start + 1)]
        done = next(i for i, r in enumerate(after) if isinstance(r.event, RestoreCompleted))
        order = [
            (type(r.event).__name__, msgspec.structs.asdict(r.event).get("group_id"))
            for r in after[done + 1 :]
            if isinstance(r.event, SiblingsDispatched | GroupAdmitted)
        ]
        assert order[:2] == [
            ("SiblingsDispatched", "step1-g0"),
            ("GroupAdmitted", "step2-g0"),
        ], order
        assert [s.step for s in report.steps] == [1, 2]
