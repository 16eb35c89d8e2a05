"""Checkpoint and restore (docs/design.md §6): what comes back, what reruns, what is rolled back."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.recovery.config import config_from_dict
from eventlog.recovery.errors import LedgerRuleError, PromptIdentityError
from eventlog.recovery.ledger import RecoveryLedger
from eventlog.recovery.vocabulary import (
    CONTROLLER_STREAM,
    CheckpointCommitted,
    GroupFinalized,
    RestoreCompleted,
    RestoreStarted,
    group_stream,
)
from projections.history import effective, rolled_back
from projections.siblings import state_digest
from tests.fixtures.ledger import (  # noqa: F401
    Harness,
    backend_harness_fixture,
    last_json_of_child,
)


@pytest.fixture(name="harness")
def _harness_on_each_backend(backend_harness: Harness) -> Harness:
    """Every test here runs on SQLite and on the real PostgreSQL server (the in-memory data
    plane), and on SQLite with the real TransferQueue."""
    return backend_harness


def _restore(h: Harness, step: int | None = None):  # type: ignore[no-untyped-def]
    return h.run(lambda cut: h.ledger.restore(cut, h.dataset, step=step), kind="recovery_restore")


def _finalize(h: Harness, gid: str) -> None:
    h.finalize(gid)


def _rebuilt_digest(h: Harness) -> str:
    """The digest of a ledger rebuilt from the file, as a crash-and-reopen would see it."""
    return RecoveryLedger.open(h.log, h.data_plane, read_only=True).digest()


_CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    from eventlog import EventLog
    from eventlog.recovery.barrier import MutationBarrier
    from eventlog.dataplane.memory import InMemoryDataPlane
    from eventlog.recovery.ledger import RecoveryLedger

    class Dataset:
        def __init__(self, prompts): self.prompts = prompts
        def get(self, sample_id): return self.prompts[sample_id]

    def new_data_plane():
        if len(sys.argv) == 3:
            return InMemoryDataPlane()            # the old process's rows died with it
        # The real TransferQueue: join the test session's Ray cluster (its GCS address), and
        # find TQ emptied, as a fresh TQ would be.
        import ray
        from eventlog.dataplane.transferqueue import join_transferqueue
        ray.init(address=sys.argv[3], _node_ip_address="127.0.0.1", log_to_driver=False)
        plane = join_transferqueue()
        plane.clear()
        return plane

    async def main():
        path, prompts = sys.argv[1], json.loads(sys.argv[2])
        log = EventLog.open(path)
        data_plane = new_data_plane()
        ledger = RecoveryLedger(log, data_plane)
        async with MutationBarrier().mutation("recovery_restore") as cut:
            plan = ledger.restore(cut, Dataset(prompts))
        out = {
            "groups": {
                p.group_id: {
                    "sealed": [[s.generation_index, s.attempt, s.rollout_id,
                                s.receipt.staging_keys if s.receipt else [],
                                s.reward, p.target_step] for s in p.sealed],
                    "redispatch": [[r.generation_index, r.rollout_id] for r in p.redispatch],
                }
                for p in plan.admitted
            },
            "rows": sorted(data_plane.list_keys("rollout_staging")),
            "counts": plan.counts,
        }
        log.close()
        print(json.dumps(out))

    asyncio.run(main())
    """
)


def _tq_address(h: Harness) -> list[str]:
    """Where a child process finds the harness's TransferQueue: its Ray cluster's GCS address
    (none for the in-memory data plane, whose rows live only in this process)."""
    if isinstance(h.data_plane, InMemoryDataPlane):
        return []
    import ray

    return [ray.get_runtime_context().gcs_address]


def test_sealed_siblings_are_reused_across_a_process_restart(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=3, target_step=5)
    h.dispatch("g1")
    h.seal("g1", 0, reward=0.25)
    h.seal("g1", 2, reward=0.75)
    rows_before = sorted(h.data_plane.list_keys("rollout_staging"))
    h.checkpoint(5)
    h.log.close()
    out = last_json_of_child(_CHILD, h.location, json.dumps(h.dataset.prompts), *_tq_address(h))
    group = out["groups"]["g1"]
    assert group["sealed"] == [
        [0, 0, "g1_g0", ["g1_g0/call-0", "g1_g0/call-1"], 0.25, 5],
        [2, 0, "g1_g2", ["g1_g2/call-0", "g1_g2/call-1"], 0.75, 5],
    ]
    assert group["redispatch"] == [[1, "g1_g1-a1"]]
    assert out["rows"] == rows_before
    assert out["counts"] == {
        "groups_restored": 1,
        "siblings_reused": 2,
        "siblings_redispatched": 1,
        "rows_cleared": 0,
    }


def test_prompt_group_restart_retries_every_sibling_when_one_is_unfinished(
    harness: Harness,
) -> None:
    h = harness
    h.reserve("open", n=3, granularity="prompt_group")
    h.reserve("done", n=2, granularity="prompt_group")
    h.dispatch("open")
    h.dispatch("done")
    stray = h.stage("open_g0")  # a sibling finished, but the group never sealed
    from eventlog.recovery.ledger import SiblingResult

    receipts = [h.stage(f"done_g{i}") for i in range(2)]
    h.run(
        lambda cut: h.ledger.seal_group(
            cut,
            "done",
            [
                SiblingResult(
                    generation_index=i,
                    rollout_id=f"done_g{i}",
                    receipt=receipts[i],
                    reward=float(i),
                    mask_sample=False,
                )
                for i in range(2)
            ],
        )
    )
    h.checkpoint(1)
    h.fresh_process()
    plan = _restore(h)
    by_id = {p.group_id: p for p in plan.admitted}
    assert by_id["open"].sealed == []
    assert [r.rollout_id for r in by_id["open"].redispatch] == [
        "open_g0-a1",
        "open_g1-a1",
        "open_g2-a1",
    ]
    assert [s.rollout_id for s in by_id["done"].sealed] == ["done_g0", "done_g1"]
    assert by_id["done"].redispatch == []
    # The unfinished group's staged row is unreferenced now, so the restore cleared it.
    assert not set(stray.staging_keys) & set(h.data_plane.list_keys("rollout_staging"))
    assert _rebuilt_digest(h) == h.ledger.digest()


def test_saved_granularity_wins_over_a_changed_config(harness: Harness) -> None:
    h = harness
    base = {
        "token_capture": {"enabled": True},
        "checkpointing": {"enabled": True, "save_data_plane": True},
    }
    sibling = config_from_dict({**base, "rollout_recovery": {"default_granularity": "sibling"}})
    whole = config_from_dict({**base, "rollout_recovery": {"default_granularity": "prompt_group"}})
    h.ledger.config = sibling
    h.reserve("g1", n=3, granularity=None)
    h.dispatch("g1")
    h.seal("g1", 0)  # only `sibling` keeps this; `prompt_group` would rerun all three
    h.checkpoint(1)
    h.fresh_process()
    h.ledger.config = whole
    plan = _restore(h)
    (group,) = plan.admitted
    assert group.granularity == "sibling"
    assert [s.generation_index for s in group.sealed] == [0]
    assert group.redispatch_indices == [1, 2]
    # The changed config is live for new groups only.
    h.reserve("g2", n=3, granularity=None)
    assert h.ledger.group("g2").granularity == "prompt_group"


def test_partial_group_several_steps_behind_keeps_its_sealed_subset_and_target_step(
    harness: Harness,
) -> None:
    h = harness
    # A ready-first sampler leaves an old, partly generated group behind newer steps.
    h.reserve("old", n=4, target_step=2, weight=2, admission_id="a2")
    h.dispatch("old")
    h.seal("old", 0, reward=0.5)
    h.seal("old", 2, reward=-0.5)
    for step in range(3, 9):
        gid = f"s{step}"
        h.reserve(gid, n=1, target_step=step, weight=step, admission_id=f"a{step}")
        h.dispatch(gid)
        h.seal(gid, 0)
        _finalize(h, gid)
    h.checkpoint(8)
    h.fresh_process()
    plan = _restore(h)
    (old,) = plan.admitted
    assert [(s.generation_index, s.rollout_id, s.reward) for s in old.sealed] == [
        (0, "old_g0", 0.5),
        (2, "old_g2", -0.5),
    ]
    assert old.target_step == 2 and old.start_weight_version == 2
    assert old.redispatch_indices == [1, 3]
    assert plan.replay_group_ids == [f"s{s}" for s in range(3, 9)]


def test_records_after_the_checkpoint_are_rolled_back_not_deleted(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=2)
    h.dispatch("g1")
    h.seal("g1", 0)
    h.checkpoint(1)
    at_checkpoint = h.ledger.digest()
    ckpt_head = h.log.head()
    h.seal("g1", 1)
    h.run(lambda cut: h.ledger.start_finalization(cut, "g1", owner="f"))
    h.reserve("late", n=1)
    head_before = h.log.head()
    h.fresh_process()
    plan = _restore(h)
    assert plan.rolled_back == (ckpt_head + 1, head_before)
    controller = h.records(CONTROLLER_STREAM)
    started = next(r for r in controller if isinstance(r.event, RestoreStarted))
    assert started.event.rolled_back_from_seq == ckpt_head + 1
    assert started.seq == head_before + 1
    completed = next(r for r in controller if isinstance(r.event, RestoreCompleted))
    assert completed.event.rolled_back_until_seq == head_before
    # Nothing was deleted; the rebuild skips the range.
    assert len(h.records()) > head_before
    assert "late" not in h.ledger.state.groups
    assert h.ledger.group("g1").indices("sealed") == [0]
    assert _rebuilt_digest(h) == h.ledger.digest() != at_checkpoint  # sibling 1 was retried
    # A group id is used once, even when only rolled-back records used it: its attempt
    # streams outlive the restore, and a second "late" would reuse their rollout ids.
    head = h.log.head()
    with pytest.raises(LedgerRuleError, match=r"'late'.*rolled back by a restore.*used once"):
        h.reserve("late", n=1)
    assert h.log.head() == head
    h.reserve("late-r1", n=1, sample_id="late")


def test_restore_never_finalizes_a_group_twice_in_effective_history(harness: Harness) -> None:
    h = harness
    h.reserve("early", n=1)
    h.reserve("late", n=1)
    for gid in ("early", "late"):
        h.dispatch(gid)
        h.seal(gid, 0)
    h.run(lambda cut: h.ledger.start_finalization(cut, "early", owner="f"))
    h.put_canonical_rows("early")
    h.run(lambda cut: h.ledger.finalize(cut, "early", owner="f", min_weight_version=0))
    h.checkpoint(1)
    h.run(lambda cut: h.ledger.start_finalization(cut, "late", owner="f"))
    h.put_canonical_rows("late")
    h.run(lambda cut: h.ledger.finalize(cut, "late", owner="f", min_weight_version=0))
    h.fresh_process()
    plan = _restore(h)
    # `early` was finalized before the checkpoint: the replay buffer owns it, not the ledger.
    assert plan.replay_group_ids == ["early"]
    with pytest.raises(LedgerRuleError, match="replay buffer owns it"):
        h.run(lambda cut: h.ledger.start_finalization(cut, "early", owner="f2"))
    # `late` was finalized after it, with a trainer that was rolled back too: it finalizes again.
    assert [p.group_id for p in plan.admitted] == ["late"]
    h.run(lambda cut: h.ledger.start_finalization(cut, "late", owner="f2"))
    h.put_canonical_rows("late")
    h.run(lambda cut: h.ledger.finalize(cut, "late", owner="f2", min_weight_version=0))
    controller = list(h.log.read_stream(CONTROLLER_STREAM))
    live = list(effective(h.records(), rolled_back(controller)))
    finalized = [r.event.group_id for r in live if isinstance(r.event, GroupFinalized)]
    assert sorted(finalized) == ["early", "late"]
    assert len([r for r in h.records() if isinstance(r.event, GroupFinalized)]) == 3


def test_plan_lists_admitted_groups_first_and_reserved_groups_once_per_admission(
    harness: Harness,
) -> None:
    h = harness
    h.reserve("r1", n=1, admitted=False, target_step=None, admission_id="batch-9")
    h.reserve("a1", n=1, admitted=True, target_step=3, admission_id="batch-3")
    h.reserve("r2", n=1, admitted=False, target_step=None, admission_id="batch-9")
    h.dispatch("a1")
    h.checkpoint(3)
    h.fresh_process()
    plan = _restore(h)
    assert [p.group_id for p in plan.admitted] == ["a1"]
    assert [(a.admission_id, [g.group_id for g in a.groups]) for a in plan.reserved] == [
        ("batch-9", ["r1", "r2"])
    ]
    (admission,) = plan.reserved
    h.run(
        lambda cut: h.ledger.admit(
            cut, admission.admission_id, target_step=4, start_weight_version=3
        )
    )
    for group in admission.groups:
        h.dispatch(group.group_id, group.redispatch_indices)
    assert {h.ledger.group(g).phase for g in ("r1", "r2")} == {"admitted"}


def test_restore_rehydrates_prompts_and_refuses_a_different_prompt(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=1, sample_id="17")
    h.dispatch("g1")
    h.checkpoint(1)
    original = dict(h.dataset.prompts["17"])
    h.fresh_process()
    h.dataset.prompts["17"] = {**original, "prompt_id": "p-18"}
    head = h.log.head()
    with pytest.raises(PromptIdentityError, match="expected prompt_id 'p-17', found 'p-18'"):
        _restore(h)
    h.dataset.prompts["17"] = {**original, "text": "edited"}
    with pytest.raises(PromptIdentityError, match="same id, different prompt"):
        _restore(h)
    del h.dataset.prompts["17"]
    with pytest.raises(PromptIdentityError, match="no sample '17'"):
        _restore(h)
    assert h.log.head() == head
    h.dataset.prompts["17"] = original
    plan = _restore(h)
    assert plan.admitted[0].prompt == original
    assert h.ledger.prompt("g1") == original


def test_restore_picks_a_step_or_the_newest_and_refuses_none(harness: Harness) -> None:
    h = harness
    h.fresh_process()
    with pytest.raises(LedgerRuleError, match="no checkpoint"):
        _restore(h)
    h.ledger = RecoveryLedger.open(h.log, h.data_plane)
    h.reserve("g1", n=2)
    h.checkpoint(1)
    h.dispatch("g1")
    h.seal("g1", 0)
    h.checkpoint(2)
    h.fresh_process()
    assert _restore(h, step=1).admitted[0].sealed == []
    # Restoring step 1 rolled back checkpoint 2: "newest" now means step 1 again.
    with pytest.raises(
        LedgerRuleError, match=r"no checkpoint at step 2 to restore \(checkpoints at steps \[1\]\)"
    ):
        _restore(h, step=2)
    assert _restore(h).checkpoint_step == 1
    assert _rebuilt_digest(h) == h.ledger.digest()


def test_repeated_restores_keep_live_and_rebuilt_state_equal(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=3)
    h.dispatch("g1")
    h.seal("g1", 0)
    h.checkpoint(1)
    for _ in range(3):
        h.fresh_process()
        plan = _restore(h)
        (group,) = plan.admitted
        h.dispatch("g1", group.redispatch_indices)
        h.seal("g1", group.redispatch_indices[0])
        assert _rebuilt_digest(h) == h.ledger.digest()
    # Each restore went back to the same checkpoint: sibling 0 kept its first attempt.
    assert h.ledger.group("g1").siblings[0].current.rollout_id == "g1_g0"
    assert h.ledger.group("g1").siblings[1].current.rollout_id == "g1_g1-a3"


def test_restore_after_a_snapshot_loss_folds_the_log_instead(sqlite_harness: Harness) -> None:
    import sqlite3

    h = sqlite_harness
    h.reserve("g1", n=2)
    h.dispatch("g1")
    h.seal("g1", 1)
    h.checkpoint(1)
    digest = h.ledger.digest()
    h.log.close()
    with sqlite3.connect(h.path) as db:
        db.execute("DELETE FROM snapshots")
    h.fresh_process()
    plan = _restore(h)
    assert [s.generation_index for s in plan.admitted[0].sealed] == [1]
    rebuilt = RecoveryLedger.open(h.log, h.data_plane, read_only=True)
    assert state_digest(rebuilt.state) == h.ledger.digest()
    assert digest != h.ledger.digest()  # sibling 0 was in flight and got a new attempt


def test_restore_records_group_facts_in_the_group_streams(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=2)
    h.dispatch("g1")
    h.seal("g1", 0)
    h.checkpoint(1)
    h.fresh_process()
    _restore(h)
    types = [r.type for r in h.log.read_stream(group_stream("g1"))]
    assert types[-2:] == ["UnsealedAbandoned", "RetryPrepared"]


def test_a_rollout_id_never_names_two_physical_runs_across_restores(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=2)
    h.checkpoint(1)  # both siblings reserved, never dispatched
    h.dispatch("g1", [0])  # rolled back below, but a worker may have run g1_g0
    h.fresh_process()
    plan = _restore(h)
    (group,) = plan.admitted
    assert [(r.generation_index, r.rollout_id) for r in group.redispatch] == [
        (0, "g1_g0-a1"),
        (1, "g1_g1"),
    ]


def test_a_fenced_ledger_restores_from_the_log_and_commands_again(harness: Harness) -> None:
    """A restore commits through the ledger's one write path yet starts over from the log."""
    from eventlog.errors import ConcurrencyError

    h = harness
    h.reserve("g1", n=2)
    h.dispatch("g1")
    h.checkpoint(1)
    first = h.ledger
    h.ledger = RecoveryLedger.open(h.log, h.data_plane)  # a newer controller fences `first`
    h.seal("g1", 1)
    with pytest.raises(ConcurrencyError):
        h.run(lambda cut: first.fail_attempt(cut, "g1", 0, rollout_id="g1_g0", error="x"))
    with pytest.raises(ConcurrencyError, match="superseded"):
        h.run(lambda cut: first.fail_attempt(cut, "g1", 0, rollout_id="g1_g0", error="x"))
    plan = h.run(lambda cut: first.restore(cut, h.dataset), kind="recovery_restore")
    assert plan.admitted[0].redispatch_indices == [0, 1]
    refs = h.run(lambda cut: first.dispatch(cut, "g1"))
    assert [r.rollout_id for r in refs] == ["g1_g0-a1", "g1_g1-a1"]
    rebuilt = RecoveryLedger.open(h.log, h.data_plane, read_only=True)
    assert state_digest(first.state) == state_digest(rebuilt.state)


def test_restore_and_checkpoint_compute_their_events_without_appending(harness: Harness) -> None:
    """Narrow functions: they return what to append; only the ledger's commit path writes."""
    from eventlog.recovery.checkpoint import checkpoint_event
    from eventlog.recovery.restore import prepare_restore

    h = harness
    h.reserve("g1", n=2)
    h.dispatch("g1")
    h.checkpoint(1)
    h.seal("g1", 0)
    head = h.log.head()
    prepared = prepare_restore(h.log, h.data_plane, h.ledger.staging_partition, h.dataset, None)
    assert h.log.head() == head
    stream, _, (start,) = prepared.start
    assert (stream, type(start).__name__) == ("controller", "RestoreStarted")
    assert [(s, type(e).__name__) for s, _, evs in prepared.group_events for e in evs] == [
        ("group/g1", "UnsealedAbandoned"),
        ("group/g1", "RetryPrepared"),
    ]
    directory = str(h.path.parent / "unappended")
    event = checkpoint_event(
        prepared.state,
        h.data_plane,
        h.ledger.staging_partition,
        h.log,
        step=1,
        directory=directory,
        epoch=1,
        training_partition=h.ledger.training_partition,
    )
    assert h.log.head() == head
    assert event.ledger_digest == state_digest(prepared.state)


def _one_checkpoint_at_step_1(h: Harness) -> CheckpointCommitted:
    """A group with one sibling sealed, checkpointed at step 1; its CheckpointCommitted."""
    h.reserve("g1", n=2)
    h.dispatch("g1")
    h.seal("g1", 0)
    h.checkpoint(1)
    (good,) = [
        r.event for r in h.records(CONTROLLER_STREAM) if isinstance(r.event, CheckpointCommitted)
    ]
    return good


def test_restore_refuses_a_checkpoint_whose_ledger_digest_the_log_does_not_fold_to(
    harness: Harness,
) -> None:
    """The cross-check between the log and the checkpoint: a mismatch is real divergence."""
    import msgspec

    from eventlog.records import ANY
    from eventlog.recovery.errors import ReconciliationError

    h = harness
    good = _one_checkpoint_at_step_1(h)
    # A checkpoint that claims a state the log never folded to (written around the ledger).
    forged = msgspec.structs.replace(good, step=2, ledger_digest="0" * 64)
    h.log.append(CONTROLLER_STREAM, [forged], ANY)
    h.fresh_process()
    head = h.log.head()
    with pytest.raises(ReconciliationError, match="ledger digest"):
        _restore(h, step=2)
    assert h.log.head() == head
    assert _restore(h, step=1).checkpoint_step == 1


def test_restore_refuses_a_checkpoint_whose_chain_anchor_the_log_does_not_hold(
    harness: Harness,
) -> None:
    """The checkpoint names the chain value of the record it covered: a log that no longer
    holds that record as it was (truncated and grown again, another run's file) is refused
    before anything loads, naming the seq."""
    import msgspec

    from eventlog.records import ANY
    from eventlog.recovery.errors import ReconciliationError

    h = harness
    good = _one_checkpoint_at_step_1(h)
    other_chain = msgspec.structs.replace(good, step=2, chain="ab" * 32)
    beyond_the_log = msgspec.structs.replace(good, step=3, covers_seq=h.log.head() + 1000)
    h.log.append(CONTROLLER_STREAM, [other_chain, beyond_the_log], ANY)
    h.fresh_process()
    head = h.log.head()
    with pytest.raises(ReconciliationError, match=f"seq {good.covers_seq} has chain"):
        _restore(h, step=2)
    with pytest.raises(ReconciliationError, match=f"seq {beyond_the_log.covers_seq} is missing"):
        _restore(h, step=3)
    assert h.log.head() == head
    assert _restore(h, step=1).checkpoint_step == 1


def test_an_id_read_absent_then_reserved_and_rolled_back_is_not_offered_again(
    harness: Harness,
) -> None:
    """The ledger keeps a stream it read as absent until its own append lands there: the same
    ledger (no new process) that read `g3` absent, reserved it and restored past it must not
    offer `g3` again (the stream exists, its reservation rolled back), or the reserve would
    fail on NO_STREAM and fence the ledger."""
    h = harness
    h.checkpoint(0)
    assert h.ledger.unused_group_id("g3") == "g3"  # read as absent, and kept so
    h.reserve("g3", n=2, target_step=1)  # after the checkpoint: the restore rolls it back
    _restore(h)
    again = h.ledger.unused_group_id("g3")
    assert again == "g3-r1"
    h.reserve(again, n=2, target_step=1, sample_id="g3")
    assert h.ledger.group(again).prompt_ref.sample_id == "g3"


def test_opening_after_a_restore_that_died_midway_is_refused_and_a_restore_finishes_it(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore's process died after its RestoreStarted was durable: the log folds to the
    checkpoint's state, so opening handed out g_g0 again, an id that already ran after the
    checkpoint, and left d_g0 dispatched with no worker. Opening is refused naming the
    restore; restoring again gives both up and numbers the attempts past every one used."""
    import eventlog.recovery.ledger as ledger_module
    from eventlog.recovery.errors import ReconciliationError

    h = harness
    h.reserve("g", n=1)
    h.reserve("d", n=1)
    h.dispatch("d")
    h.checkpoint(1)
    h.dispatch("g")
    h.start_generation("g", 0)  # after the checkpoint a worker runs g_g0
    h.fresh_process()

    class Died(BaseException):
        pass

    def dying(*args: object, **kwargs: object) -> None:
        raise Died

    with monkeypatch.context() as patch:
        patch.setattr(ledger_module, "finish_restore", dying)
        with pytest.raises(Died):
            _restore(h)
    started = h.records(CONTROLLER_STREAM)[-1]
    assert isinstance(started.event, RestoreStarted)
    head = h.log.head()
    with pytest.raises(ReconciliationError, match=rf"RestoreStarted at seq {started.seq}\) did"):
        h.reopen()
    assert h.log.head() == head  # not even a fencing epoch
    assert RecoveryLedger.open(h.log, h.data_plane, read_only=True).group("g")  # audits may
    h.fresh_process()
    _restore(h)
    assert [s.current.rollout_id for s in h.ledger.group("g").siblings] == ["g_g0-a1"]
    assert [s.current.rollout_id for s in h.ledger.group("d").siblings] == ["d_g0-a1"]
    h.reopen()  # a finished restore opens


def test_a_restore_whose_closing_append_failed_leaves_its_ledger_refusing_all_but_restore(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RestoreStarted landed, the closing append (restart events, RestoreCompleted) failed on
    the database: the ledger held the checkpoint's state unfenced and dispatched g1_g0 again,
    an id that had already run after the checkpoint. It refuses every command until a
    restore, which finishes the job."""
    from eventlog.errors import StorageUnavailableError
    from eventlog.recovery.vocabulary import RestoreCompleted

    h = harness
    h.reserve("g1", n=1)
    h.checkpoint(1)
    h.dispatch("g1")
    h.start_generation("g1", 0)  # ran after the checkpoint
    h.fresh_process()
    append_batch = h.log.append_batch

    def lost_at_the_close(requests: Any) -> Any:
        if any(isinstance(e, RestoreCompleted) for r in requests for e in r.events):
            raise StorageUnavailableError("connection lost")
        return append_batch(requests)

    with monkeypatch.context() as patch:
        patch.setattr(h.log, "append_batch", lost_at_the_close)
        with pytest.raises(StorageUnavailableError):
            _restore(h)
    head = h.log.head()
    with pytest.raises(LedgerRuleError, match=r"restore did not complete \(StorageUnavailable"):
        h.dispatch("g1")
    assert h.log.head() == head
    _restore(h)
    assert [s.current.rollout_id for s in h.ledger.group("g1").siblings] == ["g1_g0-a1"]
