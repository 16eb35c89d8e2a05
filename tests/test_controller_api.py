"""The controller's API, one call each with one documented outcome: staging, a live failure,
no-op commands, re-reserving a rolled-back prompt and resuming a restore plan (a real SQLite
log, the in-memory data plane, a real barrier)."""

from __future__ import annotations

import pytest
import torch

from eventlog.recovery.errors import StaleAttemptError
from eventlog.recovery.vocabulary import TokensStaged, attempt_stream
from tests.fixtures.ledger import STAGING, Harness


def _rows(rollout_id: str, *lengths: int) -> dict[str, dict[str, torch.Tensor]]:
    return {f"{rollout_id}/c{i}": {"token_ids": torch.arange(n)} for i, n in enumerate(lengths)}


def test_stage_puts_tagged_rows_and_records_tokens_staged_in_one_call(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=1)
    h.dispatch("g1")
    rid = h.rollout_id("g1", 0)
    receipt = h.ledger.stage(rid, _rows(rid, 3, 5), weight_version=4)
    assert receipt.rollout_id == rid and receipt.staging_keys == [f"{rid}/c0", f"{rid}/c1"]
    assert h.data_plane.list_keys(STAGING) == {
        f"{rid}/c0": {"rollout_id": rid, "call": "0"},
        f"{rid}/c1": {"rollout_id": rid, "call": "1"},
    }
    events = [r.event for r in h.log.read_stream(attempt_stream(rid))]
    staged = [e for e in events if isinstance(e, TokensStaged) and e.partition == STAGING]
    assert len(staged) == len(events)
    assert [(e.staging_key, e.token_count, e.weight_version) for e in staged] == [
        (f"{rid}/c0", 3, 4),
        (f"{rid}/c1", 5, 4),
    ]
    sealed = h.run(
        lambda cut: h.ledger.seal_sibling(
            cut, "g1", 0, rollout_id=rid, receipt=receipt, reward=1.0, mask_sample=False
        )
    )
    held = h.ledger.group("g1").siblings[0].current
    assert sealed and list(held.staging_keys) == receipt.staging_keys


@pytest.mark.parametrize(
    ("granularity", "retried", "kept"),
    [("sibling", [1], {0: "dispatched", 2: "dispatched"}), ("prompt_group", [0, 1, 2], {})],
)
def test_fail_retries_what_the_granularity_says_and_dispatches_it(
    harness: Harness, granularity: str, retried: list[int], kept: dict[int, str]
) -> None:
    h = harness
    h.reserve("g1", n=3, granularity=granularity)
    h.dispatch("g1")
    before = {s.generation_index: s.current.rollout_id for s in h.ledger.group("g1").siblings}
    refs = h.run(lambda cut: h.ledger.fail(cut, "g1", 1, rollout_id=before[1], error="worker died"))
    assert [r.generation_index for r in refs] == retried
    assert len({r.attempt for r in refs}) == 1 and all(r.attempt == 1 for r in refs)
    siblings = h.ledger.group("g1").siblings
    for ref in refs:
        current = siblings[ref.generation_index].current
        assert (current.rollout_id, current.status) == (ref.rollout_id, "dispatched")
    for index, status in kept.items():  # untouched: same attempt, still running
        assert (siblings[index].current.rollout_id, siblings[index].current.status) == (
            before[index],
            status,
        )
    head = h.log.head()
    with pytest.raises(StaleAttemptError):  # the failed attempt is no longer current
        h.run(lambda cut: h.ledger.fail(cut, "g1", 1, rollout_id=before[1], error="again"))
    assert h.log.head() == head


def test_commands_with_nothing_to_do_return_quietly_and_append_nothing(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=2)
    h.dispatch("g1")
    h.reserve("g2", admitted=False, target_step=None, admission_id="a2")
    assert h.run(lambda cut: h.ledger.admit(cut, "a2", target_step=1, start_weight_version=0))
    head = h.log.head()
    again = h.run(lambda cut: h.ledger.admit(cut, "a2", target_step=1, start_weight_version=0))
    assert again == []  # an identical repeat
    assert h.run(lambda cut: h.ledger.dispatch(cut, "g1", [])) == []
    assert h.run(lambda cut: h.ledger.dispatch(cut, "g1")) == []  # none reserved any more
    assert h.run(lambda cut: h.ledger.prepare_retry(cut, "g1")) == []
    assert h.run(lambda cut: h.ledger.clear_superseded_rows(cut)) == []
    assert h.log.head() == head


def test_a_rolled_back_reservation_is_reserved_again_under_an_unused_id(harness: Harness) -> None:
    h = harness
    assert h.ledger.unused_group_id("g3") == "g3"
    h.checkpoint(0)
    h.reserve("g3", n=2, target_step=1)  # after the checkpoint: the restore rolls it back
    h.fresh_process()
    h.run(lambda cut: h.ledger.restore(cut, h.dataset), kind="recovery_restore")
    again = h.ledger.unused_group_id("g3")
    assert again == "g3-r1"
    h.reserve(again, n=2, target_step=1, sample_id="g3")
    assert h.ledger.group(again).prompt_ref.sample_id == "g3"
    assert h.ledger.unused_group_id("g3") == "g3-r2"


def test_admit_restored_returns_every_group_to_resume_with_the_reserved_ones_admitted(
    harness: Harness,
) -> None:
    h = harness
    h.reserve("g1", n=2, target_step=1)
    h.reserve("g2", n=2, admitted=False, admission_id="a2", target_step=None)
    h.checkpoint(1)
    h.fresh_process()
    plan = h.run(lambda cut: h.ledger.restore(cut, h.dataset), kind="recovery_restore")
    assert [a.admission_id for a in plan.reserved] == ["a2"]
    groups = h.run(
        lambda cut: h.ledger.admit_restored(cut, plan, target_step=2, start_weight_version=1)
    )
    assert [g.group_id for g in groups] == ["g1", "g2"]
    assert h.ledger.group("g2").target_step == 2
    assert h.run(lambda cut: h.ledger.dispatch(cut, "g2"))  # admitted: it can run
