"""The ledger's rules (docs/design.md §4): each rejected command raises and appends nothing."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest
import torch

from eventlog import EventLog
from eventlog.errors import ConcurrencyError
from eventlog.recovery.errors import (
    BarrierError,
    ControllerFencedError,
    LedgerRuleError,
    StaleAttemptError,
)
from eventlog.recovery.ledger import RecoveryLedger, SiblingResult
from eventlog.recovery.vocabulary import (
    PromptRef,
    Receipt,
    StaleResultRejected,
    group_stream,
    parse_rollout_id,
    rollout_id_for,
)
from tests.fixtures.ledger import (  # noqa: F401
    STAGING,
    Harness,
    backend_harness_fixture,
    make_prompt,
)


@pytest.fixture(name="harness")
def _harness_on_each_backend(backend_harness: Harness) -> Harness:
    """Every test here runs on SQLite and on the real PostgreSQL server (the in-memory data
    plane), and on SQLite with the real TransferQueue."""
    return backend_harness


def _sealed(h: Harness, gid: str) -> list[int]:
    return h.ledger.group(gid).indices("sealed")


def test_identity_follows_logical_ids_and_attempt_suffixes(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=2)
    assert [s.current.rollout_id for s in h.ledger.group("g1").siblings] == ["g1_g0", "g1_g1"]
    h.dispatch("g1")
    h.run(lambda cut: h.ledger.abandon_unsealed(cut, "g1", reason="worker lost"))
    h.run(lambda cut: h.ledger.prepare_retry(cut, "g1"))
    assert [s.current.rollout_id for s in h.ledger.group("g1").siblings] == ["g1_g0-a1", "g1_g1-a1"]


def test_seal_makes_group_ready_when_every_sibling_is_sealed(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=2)
    h.dispatch("g1")
    h.seal("g1", 0)
    assert h.ledger.group("g1").status == "generating"
    h.seal("g1", 1)
    assert h.ledger.group("g1").status == "ready_to_finalize"


def test_identical_repeated_seal_is_a_noop_and_a_different_one_conflicts(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=2)
    h.dispatch("g1")
    receipt = h.stage("g1_g0")

    def seal(reward: float) -> bool:
        return h.run(
            lambda cut: h.ledger.seal_sibling(
                cut, "g1", 0, rollout_id="g1_g0", receipt=receipt, reward=reward, mask_sample=False
            )
        )

    assert seal(1.0) is True
    head = h.log.head()
    assert seal(1.0) is False
    assert h.log.head() == head
    with pytest.raises(LedgerRuleError, match="conflicting duplicate seal"):
        seal(0.5)
    assert h.log.head() == head


@pytest.mark.parametrize("changed", ["receipt", "mask_sample"])
def test_a_repeated_seal_that_differs_only_in_receipt_or_mask_sample_conflicts(
    harness: Harness, changed: str
) -> None:
    h = harness
    h.reserve("g1", n=1)
    h.reserve("g2", n=1, granularity="prompt_group")
    h.dispatch("g1")
    h.dispatch("g2")
    receipts = {gid: h.stage(f"{gid}_g0", calls=2) for gid in ("g1", "g2")}

    def result(gid: str, repeat: bool) -> SiblingResult:
        receipt = receipts[gid]
        if repeat and changed == "receipt":
            receipt = Receipt(rollout_id=receipt.rollout_id, staging_keys=receipt.staging_keys[:1])
        return SiblingResult(
            generation_index=0,
            rollout_id=f"{gid}_g0",
            receipt=receipt,
            reward=1.0,
            mask_sample=repeat and changed == "mask_sample",
        )

    def seal(gid: str, r: SiblingResult) -> bool:
        if gid == "g2":
            return h.run(lambda cut: h.ledger.seal_group(cut, gid, [r]))
        return h.run(
            lambda cut: h.ledger.seal_sibling(
                cut,
                gid,
                0,
                rollout_id=r.rollout_id,
                receipt=r.receipt,
                reward=r.reward,
                mask_sample=r.mask_sample,
            )
        )

    for gid in ("g1", "g2"):
        assert seal(gid, result(gid, repeat=False)) is True
        head = h.log.head()
        with pytest.raises(LedgerRuleError, match="conflicting duplicate seal"):
            seal(gid, result(gid, repeat=True))
        assert h.log.head() == head


def test_stale_attempt_seal_is_rejected_and_appends_nothing(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=1)
    h.dispatch("g1")
    late = h.stage("g1_g0")
    h.run(lambda cut: h.ledger.abandon_unsealed(cut, "g1", reason="timeout"))
    h.run(lambda cut: h.ledger.prepare_retry(cut, "g1"))
    h.dispatch("g1")
    head = h.log.head()
    with pytest.raises(StaleAttemptError, match="superseded by attempt 1") as caught:
        h.run(
            lambda cut: h.ledger.seal_sibling(
                cut, "g1", 0, rollout_id="g1_g0", receipt=late, reward=1.0, mask_sample=False
            )
        )
    assert h.log.head() == head
    assert h.ledger.group("g1").siblings[0].current.status == "dispatched"
    # The rejection becomes visible in the audit only through the explicit call.
    h.run(lambda cut: h.ledger.record_rejected_result(cut, caught.value))
    last = h.records(group_stream("g1"))[-1].event
    assert isinstance(last, StaleResultRejected)
    assert (last.rollout_id, last.current_rollout_id) == ("g1_g0", "g1_g0-a1")


def test_result_of_an_abandoned_current_attempt_is_stale(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=1)
    h.dispatch("g1")
    h.run(lambda cut: h.ledger.abandon_unsealed(cut, "g1", reason="timeout"))
    with pytest.raises(StaleAttemptError, match="was abandoned"):
        h.seal("g1", 0)


def test_receipt_must_name_the_sealed_rollout(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=1)
    h.dispatch("g1")
    head = h.log.head()
    with pytest.raises(LedgerRuleError, match="receipt names rollout 'other'"):
        h.run(
            lambda cut: h.ledger.seal_sibling(
                cut,
                "g1",
                0,
                rollout_id="g1_g0",
                receipt=Receipt(rollout_id="other", staging_keys=[]),
                reward=1.0,
                mask_sample=False,
            )
        )
    assert h.log.head() == head


def test_undispatched_attempt_cannot_be_sealed(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=1)
    with pytest.raises(LedgerRuleError, match="is reserved, expected dispatched"):
        h.seal("g1", 0, receipt=False)


def test_mask_sample_is_required_with_no_default(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=1)
    h.dispatch("g1")
    head = h.log.head()
    with pytest.raises(TypeError, match="mask_sample"):
        h.run(
            lambda cut: h.ledger.seal_sibling(  # type: ignore[call-arg]
                cut, "g1", 0, rollout_id="g1_g0", receipt=None, reward=1.0
            )
        )
    with pytest.raises(LedgerRuleError, match="mask_sample"):
        h.run(
            lambda cut: h.ledger.seal_sibling(
                cut,
                "g1",
                0,
                rollout_id="g1_g0",
                receipt=None,
                reward=1.0,
                mask_sample=None,  # type: ignore[arg-type]
            )
        )
    with pytest.raises(TypeError, match="mask_sample"):
        SiblingResult(generation_index=0, rollout_id="g1_g0", receipt=None, reward=1.0)  # type: ignore[call-arg]
    assert h.log.head() == head


def test_non_finite_reward_is_refused(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=1)
    h.dispatch("g1")
    with pytest.raises(LedgerRuleError, match="finite"):
        h.run(
            lambda cut: h.ledger.seal_sibling(
                cut,
                "g1",
                0,
                rollout_id="g1_g0",
                receipt=None,
                reward=float("nan"),
                mask_sample=True,
            )
        )


@pytest.mark.parametrize("granularity", ["sibling", "prompt_group"])
def test_missing_receipt_is_a_sealed_placeholder_that_owns_no_rows(
    harness: Harness, granularity: str
) -> None:
    h = harness
    h.reserve("g1", n=2, granularity=granularity)
    h.dispatch("g1")
    if granularity == "sibling":
        h.seal("g1", 0, receipt=False)
        h.seal("g1", 1)
    else:
        receipt = h.stage("g1_g1")
        h.run(
            lambda cut: h.ledger.seal_group(
                cut,
                "g1",
                [
                    SiblingResult(
                        generation_index=0,
                        rollout_id="g1_g0",
                        receipt=None,
                        reward=0.0,
                        mask_sample=True,
                    ),
                    SiblingResult(
                        generation_index=1,
                        rollout_id="g1_g1",
                        receipt=receipt,
                        reward=1.0,
                        mask_sample=False,
                    ),
                ],
            )
        )
    group = h.ledger.group("g1")
    assert group.status == "ready_to_finalize"
    assert group.siblings[0].current.receipt is None
    assert group.staging_keys() == ["g1_g1/call-0", "g1_g1/call-1"]
    inputs = h.ledger.finalization_inputs("g1")
    assert inputs.receipts[0] is None
    assert inputs.canonical_row_ids == ["g1_g0", "g1_g1"]
    # The placeholder survives a checkpoint and a restore in a fresh process.
    h.checkpoint(1)
    h.fresh_process()
    plan = h.run(lambda cut: h.ledger.restore(cut, h.dataset))
    (restored,) = plan.admitted
    assert [s.receipt.staging_keys if s.receipt else [] for s in restored.sealed] == [
        [],
        ["g1_g1/call-0", "g1_g1/call-1"],
    ]
    assert restored.redispatch == []


def test_prompt_group_refuses_single_sibling_seals(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=2, granularity="prompt_group")
    h.dispatch("g1")
    with pytest.raises(LedgerRuleError, match="seal every sibling at once"):
        h.seal("g1", 0)


def test_a_repeated_seal_by_the_wrong_method_is_refused_not_a_noop(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=1)
    h.dispatch("g1")
    receipt = h.stage("g1_g0")
    h.run(
        lambda cut: h.ledger.seal_sibling(
            cut, "g1", 0, rollout_id="g1_g0", receipt=receipt, reward=1.0, mask_sample=False
        )
    )
    head = h.log.head()
    same = SiblingResult(
        generation_index=0, rollout_id="g1_g0", receipt=receipt, reward=1.0, mask_sample=False
    )
    with pytest.raises(LedgerRuleError, match="seal siblings one by one"):
        h.run(lambda cut: h.ledger.seal_group(cut, "g1", [same]))
    assert h.log.head() == head


def test_a_sibling_outside_the_group_is_refused_by_every_command(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=2)
    head = h.log.head()
    with pytest.raises(LedgerRuleError, match=r"sibling 2: no such sibling \(the group has 2\)"):
        h.run(lambda cut: h.ledger.dispatch(cut, "g1", [2]))
    with pytest.raises(LedgerRuleError, match="sibling -1: no such sibling"):
        h.ledger.check_result("g1", -1, "g1_g0")
    assert h.log.head() == head


def test_check_result_names_both_rollout_ids_of_a_stale_result(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=1)
    h.dispatch("g1")
    h.run(lambda cut: h.ledger.abandon_unsealed(cut, "g1", reason="timeout"))
    h.run(lambda cut: h.ledger.prepare_retry(cut, "g1"))
    with pytest.raises(StaleAttemptError) as caught:
        h.ledger.check_result("g1", 0, "g1_g0")
    stale = caught.value
    assert (stale.group_id, stale.generation_index) == ("g1", 0)
    assert (stale.rollout_id, stale.current_rollout_id) == ("g1_g0", "g1_g0-a1")
    with pytest.raises(LedgerRuleError, match="unknown rollout id 'g1_g0-a7'") as unknown:
        h.ledger.check_result("g1", 0, "g1_g0-a7")
    assert not isinstance(unknown.value, StaleAttemptError)


@pytest.mark.parametrize(
    ("group_id", "index", "attempt"),
    [("g1", 0, 0), ("step3-g2", 1, 4), ("a_g1", 12, 1), ("x-a1", 0, 2), ("g\nnl", 0, 0)],
)
def test_a_rollout_id_parses_back_to_what_built_it(group_id: str, index: int, attempt: int) -> None:
    """Whatever the group id holds: a line break is a stream name's character too."""
    rollout_id = rollout_id_for(group_id, index, attempt)
    assert parse_rollout_id(rollout_id) == (group_id, index, attempt)


@pytest.mark.parametrize("text", ["g1", "g1_g", "g1_gx", "g1_g01", "g1_g0-a0", "g1_g0-a", "_g0"])
def test_text_no_rollout_id_was_built_from_does_not_parse(text: str) -> None:
    assert parse_rollout_id(text) is None


def test_prompt_group_seal_is_atomic_and_a_partial_set_seals_nothing(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=3, granularity="prompt_group")
    h.dispatch("g1")
    receipts = [h.stage(f"g1_g{i}") for i in range(3)]
    results = [
        SiblingResult(
            generation_index=i,
            rollout_id=f"g1_g{i}",
            receipt=receipts[i],
            reward=1.0,
            mask_sample=False,
        )
        for i in range(3)
    ]
    head = h.log.head()
    with pytest.raises(LedgerRuleError, match="must name every sibling"):
        h.run(lambda cut: h.ledger.seal_group(cut, "g1", results[:2]))
    bad_last = [
        *results[:2],
        SiblingResult(
            generation_index=2,
            rollout_id="g1_g2",
            receipt=receipts[0],
            reward=1.0,
            mask_sample=False,
        ),
    ]
    with pytest.raises(LedgerRuleError, match="receipt names rollout"):
        h.run(lambda cut: h.ledger.seal_group(cut, "g1", bad_last))
    assert h.log.head() == head
    assert h.ledger.group("g1").indices("dispatched") == [0, 1, 2]
    assert h.ledger.group("g1").staging_keys() == []
    assert h.run(lambda cut: h.ledger.seal_group(cut, "g1", results)) is True
    assert _sealed(h, "g1") == [0, 1, 2]
    assert h.run(lambda cut: h.ledger.seal_group(cut, "g1", results)) is False


def test_sibling_live_failure_abandons_and_retries_only_unsealed(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=3)
    h.dispatch("g1")
    h.seal("g1", 1)
    abandoned = h.run(lambda cut: h.ledger.abandon_unsealed(cut, "g1", reason="env crashed"))
    assert [r.generation_index for r in abandoned] == [0, 2]
    retried = h.run(lambda cut: h.ledger.prepare_retry(cut, "g1"))
    assert [(r.generation_index, r.rollout_id) for r in retried] == [
        (0, "g1_g0-a1"),
        (2, "g1_g2-a1"),
    ]
    group = h.ledger.group("g1")
    assert group.siblings[1].current.rollout_id == "g1_g1"
    assert group.siblings[1].current.status == "sealed"


def test_prompt_group_live_failure_abandons_and_retries_every_sibling(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=3, granularity="prompt_group")
    h.dispatch("g1")
    h.run(lambda cut: h.ledger.fail_attempt(cut, "g1", 1, rollout_id="g1_g1", error="OOM"))
    with pytest.raises(LedgerRuleError, match="abandon_unsealed first"):
        h.run(lambda cut: h.ledger.prepare_retry(cut, "g1"))
    abandoned = h.run(lambda cut: h.ledger.abandon_unsealed(cut, "g1", reason="sibling 1 failed"))
    assert [r.generation_index for r in abandoned] == [0, 1, 2]
    retried = h.run(lambda cut: h.ledger.prepare_retry(cut, "g1"))
    assert [r.rollout_id for r in retried] == ["g1_g0-a1", "g1_g1-a1", "g1_g2-a1"]


def test_dispatch_requires_admission_and_prompt_group_dispatches_whole(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=2, admitted=False, target_step=None)
    with pytest.raises(LedgerRuleError, match="before admission"):
        h.dispatch("g1")
    h.reserve("g2", n=2, granularity="prompt_group")
    with pytest.raises(LedgerRuleError, match="must name every sibling"):
        h.dispatch("g2", [0])


def test_admission_happens_once_for_the_whole_admission(harness: Harness) -> None:
    h = harness
    h.reserve("g1", admitted=False, target_step=None, admission_id="batch-1")
    h.reserve("g2", admitted=False, target_step=None, admission_id="batch-1")
    admitted = h.run(
        lambda cut: h.ledger.admit(cut, "batch-1", target_step=4, start_weight_version=3)
    )
    assert admitted == ["g1", "g2"]
    assert {(g.phase, g.target_step) for g in h.ledger.state.groups.values()} == {("admitted", 4)}
    head = h.log.head()
    with pytest.raises(LedgerRuleError, match="already admitted"):
        h.run(lambda cut: h.ledger.admit(cut, "batch-1", target_step=5, start_weight_version=3))
    assert h.log.head() == head


def test_groups_of_one_admission_must_agree_on_phase_and_target_step(harness: Harness) -> None:
    h = harness
    h.reserve("g1", admitted=True, target_step=7, admission_id="batch-1")
    with pytest.raises(LedgerRuleError, match="must agree"):
        h.reserve("g2", admitted=False, target_step=None, admission_id="batch-1")
    with pytest.raises(LedgerRuleError, match="must agree"):
        h.reserve("g3", admitted=True, target_step=8, admission_id="batch-1")
    h.reserve("g4", admitted=True, target_step=7, admission_id="batch-1")


def test_target_step_none_does_not_mean_unadmitted(harness: Harness) -> None:
    h = harness
    h.reserve("g1", admitted=True, target_step=None)
    assert h.ledger.group("g1").phase == "admitted"
    h.dispatch("g1")


def test_a_group_id_is_used_once(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=1)
    with pytest.raises(LedgerRuleError, match="already reserved"):
        h.reserve("g1", n=1)
    h.run(lambda cut: h.ledger.discard(cut, "g1", reason="test"))
    with pytest.raises(LedgerRuleError, match="already used"):
        h.reserve("g1", n=1)


def test_granularity_is_resolved_once_from_config_at_reservation(harness: Harness) -> None:
    from eventlog.recovery.config import config_from_dict

    h = harness
    config = config_from_dict(
        {
            "rollout_recovery": {
                "default_granularity": "sibling",
                "task_granularity_overrides": {"code": "prompt_group"},
                "agent_granularity_overrides": {"solver": "sibling"},
            },
            "token_capture": {"enabled": True},
            "checkpointing": {"enabled": True, "save_data_plane": True},
        }
    )
    h.ledger.config = config
    h.reserve("task-only", granularity=None, task="code")
    h.reserve("agent-wins", granularity=None, task="code", agent="solver")
    assert h.ledger.group("task-only").granularity == "prompt_group"
    assert h.ledger.group("agent-wins").granularity == "sibling"
    assert h.ledger.group("agent-wins").agent_name == "solver"


def test_unknown_granularity_is_refused(harness: Harness) -> None:
    h = harness
    head = h.log.head()
    with pytest.raises(LedgerRuleError, match="granularity"):
        h.reserve("g1", granularity="per_token")
    assert h.log.head() == head


def test_every_command_needs_a_live_cut_and_a_stale_one_appends_nothing(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=1)
    head = h.log.head()
    stale = h.run(lambda cut: cut)
    with pytest.raises(BarrierError, match="stale"):
        h.ledger.dispatch(stale, "g1")
    with pytest.raises(BarrierError, match="stale"):
        h.ledger.reserve(
            stale,
            group_id="g2",
            prompt=make_prompt("g2"),
            prompt_ref=PromptRef(sample_id="g2", task_name="math"),
            expected_generations=1,
            start_weight_version=0,
            admitted=True,
            granularity="sibling",
        )
    assert h.log.head() == head


def test_checkpoint_needs_the_exclusive_cut(harness: Harness) -> None:
    h = harness
    with pytest.raises(LedgerRuleError, match="exclusive checkpoint cut"):
        h.run(lambda cut: h.ledger.checkpoint(cut, step=1, directory=str(h.path.parent / "x")))


def test_a_checkpoint_directory_that_is_a_file_is_refused_and_appends_nothing(
    harness: Harness,
) -> None:
    h = harness
    h.reserve("g1", n=1)
    not_a_folder = h.path.parent / "step_1"
    not_a_folder.write_text("weights")
    head = h.log.head()
    with pytest.raises(LedgerRuleError, match="is a file, not a folder"):
        h.run_checkpoint(lambda cut: h.ledger.checkpoint(cut, step=1, directory=str(not_a_folder)))
    assert h.log.head() == head
    assert not_a_folder.read_text() == "weights"


def test_second_controller_writing_concurrently_gets_concurrency_error(harness: Harness) -> None:
    """Opening a second controller fences the first: its next command is a typed
    ConcurrencyError (ControllerFencedError) naming both epochs, and appends nothing."""
    h = harness
    h.reserve("g1", n=2)
    h.dispatch("g1")
    receipt = h.stage("g1_g0")
    other_log = EventLog.open(h.location)
    try:
        other = RecoveryLedger.open(other_log, h.data_plane)
        assert (h.ledger.epoch, other.epoch) == (1, 2)
        h.run(lambda cut: other.fail_attempt(cut, "g1", 1, rollout_id="g1_g1", error="x"))
        head = h.log.head()

        async def stale_seal() -> None:
            async with h.barrier.mutation("other") as cut:
                h.ledger.seal_sibling(
                    cut, "g1", 0, rollout_id="g1_g0", receipt=receipt, reward=1.0, mask_sample=False
                )

        with pytest.raises(ConcurrencyError, match="epoch 1, but epoch 2 was taken") as caught:
            asyncio.run(stale_seal())
        assert isinstance(caught.value, ControllerFencedError)
        assert (caught.value.held_epoch, caught.value.current_epoch) == (1, 2)
        assert h.log.head() == head
        with pytest.raises(ControllerFencedError, match="superseded"):
            asyncio.run(stale_seal())
        assert h.log.head() == head
    finally:
        other_log.close()


def test_finalization_ownership_is_recorded_and_enforced(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=1)
    h.dispatch("g1")
    h.seal("g1", 0)
    h.run(lambda cut: h.ledger.start_finalization(cut, "g1", owner="finalizer-a"))
    with pytest.raises(LedgerRuleError, match="already being finalized by 'finalizer-a'"):
        h.run(lambda cut: h.ledger.start_finalization(cut, "g1", owner="finalizer-b"))
    with pytest.raises(LedgerRuleError, match="owned by 'finalizer-a', not 'finalizer-b'"):
        h.run(lambda cut: h.ledger.finalize(cut, "g1", owner="finalizer-b", min_weight_version=0))
    # A restart (rebuild from the file) still knows who owns it.
    h.reopen()
    with pytest.raises(LedgerRuleError, match="already being finalized"):
        h.run(lambda cut: h.ledger.start_finalization(cut, "g1", owner="finalizer-b"))
    entry = h.run(
        lambda cut: h.ledger.finalize(cut, "g1", owner="finalizer-a", min_weight_version=0)
    )
    assert entry.canonical_row_ids == ("g1_g0",)
    with pytest.raises(LedgerRuleError, match="finalized: the replay buffer owns it"):
        h.run(lambda cut: h.ledger.finalize(cut, "g1", owner="finalizer-a", min_weight_version=0))
    h.reopen()
    with pytest.raises(LedgerRuleError, match="finalized: the replay buffer owns it"):
        h.run(lambda cut: h.ledger.start_finalization(cut, "g1", owner="finalizer-a"))


@pytest.mark.parametrize("unknown", [False, True])
def test_no_checkpoint_while_a_group_is_finalizing_or_unknown(
    harness: Harness, unknown: bool
) -> None:
    h = harness
    h.reserve("g1", n=1)
    h.dispatch("g1")
    h.seal("g1", 0)
    h.run(lambda cut: h.ledger.start_finalization(cut, "g1", owner="f"))
    if unknown:
        h.run(
            lambda cut: h.ledger.mark_finalization_unknown(cut, "g1", owner="f", error="rpc lost")
        )
    head = h.log.head()
    status = "finalization_unknown" if unknown else "finalizing"
    with pytest.raises(LedgerRuleError, match=f"cannot checkpoint while it is {status}"):
        h.checkpoint(1)
    assert h.log.head() == head


def test_checkpoint_fails_closed_when_a_sealed_row_is_missing(harness: Harness) -> None:
    h = harness
    from eventlog.recovery.errors import ReconciliationError

    h.reserve("g1", n=2)
    h.dispatch("g1")
    h.seal("g1", 1)
    h.data_plane.delete_rows("rollout_staging", ["g1_g1/call-1"])
    head = h.log.head()
    with pytest.raises(
        ReconciliationError, match=r"group 'g1', sibling 1, attempt 0: staging key 'g1_g1/call-1'"
    ):
        h.checkpoint(1)
    assert h.log.head() == head


def test_discard_clears_the_rows_the_group_owned(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=2)
    h.dispatch("g1")
    h.seal("g1", 0)
    cleared = h.run(lambda cut: h.ledger.discard(cut, "g1", reason="too stale"))
    assert cleared == ["g1_g0/call-0", "g1_g0/call-1"]
    assert h.data_plane.list_keys("rollout_staging") == {}
    assert "g1" not in h.ledger.state.groups


def test_a_group_whose_finalization_is_unknown_is_not_discarded(harness: Harness) -> None:
    """Its canonical rows may be written, and a discard names only staging rows: they stayed
    in the training partition, named by no record, carried by every checkpoint. Refused,
    nothing appended; resolving it settles the group."""
    h = harness
    h.reserve("g1", n=1)
    h.dispatch("g1")
    h.seal("g1", 0)
    h.run(lambda cut: h.ledger.start_finalization(cut, "g1", owner="f"))
    h.put_canonical_rows("g1")  # the finalizer wrote them; its answer was lost
    h.run(lambda cut: h.ledger.mark_finalization_unknown(cut, "g1", owner="f", error="timeout"))
    head = h.log.head()
    with pytest.raises(LedgerRuleError, match=r"'g1': cannot discard it while its finalization"):
        h.run(lambda cut: h.ledger.discard(cut, "g1", reason="give up"))
    assert h.log.head() == head and h.ledger.group("g1").status == "finalization_unknown"
    h.run(lambda cut: h.ledger.resolve_finalization_unknown(cut, "g1", owner="f"))
    assert [e.group_id for e in h.ledger.replay.entries()] == ["g1"]


def test_a_prompt_that_is_not_json_needs_fingerprint_off(harness: Harness) -> None:
    import torch

    h = harness
    prompt = {**make_prompt("g1"), "token_ids": torch.arange(3)}

    def reserve(fingerprint: bool) -> None:
        h.run(
            lambda cut: h.ledger.reserve(
                cut,
                group_id="g1",
                prompt=prompt,
                prompt_ref=PromptRef(sample_id="g1", task_name="math"),
                expected_generations=1,
                start_weight_version=0,
                admitted=True,
                granularity="sibling",
                fingerprint=fingerprint,
            )
        )

    with pytest.raises(LedgerRuleError, match="cannot be fingerprinted") as caught:
        reserve(True)
    assert caught.value.hint is not None and "fingerprint=False" in caught.value.hint
    reserve(False)
    assert h.ledger.group("g1").prompt_hash is None


def test_a_receipt_naming_keys_its_attempt_never_staged_is_refused(harness: Harness) -> None:
    """Another sibling's key, a key of another attempt, or a key nobody staged: refused at seal."""
    h = harness
    h.reserve("g1", n=2)
    h.dispatch("g1")
    h.seal("g1", 0)
    own = h.stage("g1_g1", calls=1)
    head = h.log.head()

    def seal(keys: list[str]) -> bool:
        receipt = Receipt(rollout_id="g1_g1", staging_keys=keys)
        return h.run(
            lambda cut: h.ledger.seal_sibling(
                cut, "g1", 1, rollout_id="g1_g1", receipt=receipt, reward=1.0, mask_sample=False
            )
        )

    with pytest.raises(LedgerRuleError, match=r"sibling 1: .*never staged.*'g1_g1/call-9'"):
        seal([*own.staging_keys, "g1_g1/call-9"])
    with pytest.raises(LedgerRuleError, match=r"sibling 1: .*\['g1_g0/call-0'\] are not named"):
        seal([*own.staging_keys, "g1_g0/call-0"])
    with pytest.raises(LedgerRuleError, match=r"\['made-up'\] are not named under .*'g1_g1'"):
        seal(["made-up"])
    assert h.log.head() == head
    assert h.ledger.group("g1").siblings[1].current.status == "dispatched"
    assert seal(own.staging_keys) is True


def test_an_attempt_stages_only_under_its_own_name_so_no_row_of_another_is_replaced(
    harness: Harness,
) -> None:
    """Two groups' attempts staging one key: the second put replaced the first's row, which
    its seal owned (the data plane upserts); then a checkpoint failed on the key owned twice
    and finalizing the first group deleted the second's only row. A key not named under the
    staging attempt is refused before anything is put or appended."""
    h = harness
    for group in ("g1", "g2"):
        h.reserve(group, n=1)
        h.dispatch(group)
    rows = {"g1_g0/c0": {"token_ids": torch.arange(3)}}
    receipt = h.ledger.stage("g1_g0", rows, weight_version=0)
    head = h.log.head()
    with pytest.raises(LedgerRuleError, match=r"\['g1_g0/c0'\] are not named under .*'g2_g0'"):
        h.ledger.stage("g2_g0", {"g1_g0/c0": {"token_ids": torch.arange(5)}}, weight_version=0)
    with pytest.raises(LedgerRuleError, match=r"\['K'\] are not named"):
        h.ledger.stage("g2_g0", {"K": {"token_ids": torch.arange(5)}}, weight_version=0)
    assert h.log.head() == head
    assert sorted(h.data_plane.list_keys(STAGING)) == ["g1_g0/c0"]
    kept = h.data_plane.read_rows(STAGING, ["g1_g0/c0"])["g1_g0/c0"]["token_ids"]
    assert isinstance(kept, torch.Tensor) and len(kept) == 3  # the first put, not replaced
    assert h.run(
        lambda cut: h.ledger.seal_sibling(
            cut, "g1", 0, rollout_id="g1_g0", receipt=receipt, reward=1.0, mask_sample=False
        )
    )


def test_a_late_result_of_a_rolled_back_attempt_or_group_is_stale_and_recordable(
    harness: Harness,
) -> None:
    h = harness
    h.reserve("g1", n=1)
    h.dispatch("g1")
    h.checkpoint(1)
    # After the checkpoint attempt 0 fails and attempt 1 runs: a restore rolls attempt 1 back.
    h.run(lambda cut: h.ledger.fail_attempt(cut, "g1", 0, rollout_id="g1_g0", error="oom"))
    h.run(lambda cut: h.ledger.prepare_retry(cut, "g1"))
    h.dispatch("g1")
    late = h.stage("g1_g0-a1", calls=1)
    h.reserve("g2", n=1)  # reserved after the checkpoint: the whole group is rolled back
    h.dispatch("g2")
    late_group = h.stage("g2_g0", calls=1)
    h.fresh_process()
    h.run(lambda cut: h.ledger.restore(cut, h.dataset), kind="recovery_restore")
    assert h.rollout_id("g1", 0) == "g1_g0-a2"
    head = h.log.head()
    for gid, rid, receipt in (("g1", "g1_g0-a1", late), ("g2", "g2_g0", late_group)):
        with pytest.raises(StaleAttemptError, match="rolled back") as caught:
            h.run(
                partial(
                    h.ledger.seal_sibling,
                    group_id=gid,
                    generation_index=0,
                    rollout_id=rid,
                    receipt=receipt,
                    reward=1.0,
                    mask_sample=False,
                )
            )
        assert h.log.head() == head
        assert (caught.value.group_id, caught.value.rollout_id) == (gid, rid)
        h.run(partial(h.ledger.record_rejected_result, error=caught.value))
        head = h.log.head()
        (rejected,) = [
            r.event
            for r in h.records(group_stream(gid))
            if isinstance(r.event, StaleResultRejected)
        ]
        assert rejected.rollout_id == rid
    with pytest.raises(StaleAttemptError, match="rolled back"):
        h.ledger.check_result("g1", 0, "g1_g0-a1")


def test_a_staging_key_that_is_no_text_is_refused_by_name(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=1)
    h.dispatch("g1")
    head = h.log.head()
    with pytest.raises(LedgerRuleError, match=r"staging keys \[5\] are not named under"):
        h.ledger.stage("g1_g0", {5: {"token_ids": torch.arange(3)}}, weight_version=0)  # type: ignore[dict-item]
    assert h.log.head() == head and h.data_plane.list_keys(STAGING) == {}
