"""Every cleanup is an event (docs/design.md §7): which rows, why, which step, logged first.

Also the rest of the finalization contract: per-sibling weight versions in seals and
GroupFinalized, resolving a finalization_unknown group by the canonical partition, and the
low-valid-row-fraction drop.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import torch

from eventlog.records import ANY
from eventlog.recovery import checkpoint
from eventlog.recovery.config import config_from_dict
from eventlog.recovery.errors import LedgerRuleError, ReconciliationError
from eventlog.recovery.vocabulary import (
    CONTROLLER_STREAM,
    REPLAY_STREAM,
    FinalizationRetryable,
    GroupDiscarded,
    GroupFinalized,
    RowsCleared,
    SiblingSealed,
    StagingCleared,
    TokensStaged,
    attempt_stream,
    group_stream,
)
from tests.fixtures.ledger import STAGING, Harness, backend_harness_fixture  # noqa: F401


@pytest.fixture(name="harness")
def _harness_on_each_backend(backend_harness: Harness) -> Harness:
    """Every test here runs on SQLite and on the real PostgreSQL server (the in-memory data
    plane), and on SQLite with the real TransferQueue."""
    return backend_harness


TRAINING = "training"


def _restore(h: Harness) -> Any:
    return h.run(lambda cut: h.ledger.restore(cut, h.dataset), kind="recovery_restore")


def _events(h: Harness, stream: str, kind: type[Any]) -> list[Any]:
    return [r.event for r in h.records(stream) if isinstance(r.event, kind)]


def test_finalize_records_the_staging_rows_it_frees_in_its_own_append_then_deletes_them(
    harness: Harness,
) -> None:
    h = harness
    h.reserve("g1", n=2, target_step=3)
    h.dispatch("g1")
    h.seal("g1", 0)
    h.seal("g1", 1)
    owned = h.ledger.group("g1").staging_keys()
    staged_by = {
        k: s.current.rollout_id
        for s in h.ledger.group("g1").siblings
        for k in s.current.staging_keys
    }
    h.finalize("g1")
    finalized = h.records(group_stream("g1"))[-1]
    assert isinstance(finalized.event, GroupFinalized)
    assert finalized.seq == h.log.head()  # the fact and its clean-up are one record
    event = finalized.event
    assert [c.key for c in event.staging_cleared] == owned
    assert {c.key: c.rollout_id for c in event.staging_cleared} == staged_by
    assert event.staging_partition == STAGING and event.target_step == 3
    assert not [r for r in h.records() if isinstance(r.event, StagingCleared)]
    assert h.data_plane.list_keys(STAGING) == {}


def test_consume_and_evict_record_the_canonical_rows_they_free_in_the_same_append(
    harness: Harness,
) -> None:
    h = harness
    for gid in ("g1", "g2"):
        h.reserve(gid, n=2)
        h.dispatch(gid)
        h.seal(gid, 0)
        h.seal(gid, 1)
        h.finalize(gid)
    assert sorted(h.data_plane.list_keys(TRAINING)) == ["g1_g0", "g1_g1", "g2_g0", "g2_g1"]
    h.run(lambda cut: h.ledger.replay.select(cut, ["g1"], step=1))
    h.run(lambda cut: h.ledger.replay.consume(cut, ["g1"], step=1))
    h.run(lambda cut: h.ledger.replay.evict(cut, ["g2"], reason="too stale"))
    consumed, trained, evicted, dropped = h.records(REPLAY_STREAM)[-4:]
    assert (trained.seq, dropped.seq) == (consumed.seq + 1, evicted.seq + 1)
    assert isinstance(trained.event, RowsCleared) and isinstance(dropped.event, RowsCleared)
    assert (trained.event.keys, trained.event.step, trained.event.group_ids) == (
        ["g1_g0", "g1_g1"],
        1,
        ["g1"],
    )
    assert (dropped.event.keys, dropped.event.partition) == (["g2_g0", "g2_g1"], TRAINING)
    assert "too stale" in dropped.event.reason
    assert h.data_plane.list_keys(TRAINING) == {}


def test_rows_of_failed_attempts_are_cleared_after_their_group_left_the_ledger(
    harness: Harness,
) -> None:
    """clear_superseded_rows used to see held groups only: a finalized group's rows leaked."""
    h = harness
    h.reserve("g1", n=1)
    h.dispatch("g1")
    failed = h.stage("g1_g0", calls=2)
    h.run(lambda cut: h.ledger.fail_attempt(cut, "g1", 0, rollout_id="g1_g0", error="oom"))
    h.run(lambda cut: h.ledger.prepare_retry(cut, "g1"))
    h.dispatch("g1")
    h.seal("g1", 0)
    h.finalize("g1")
    assert sorted(h.data_plane.list_keys(STAGING)) == failed.staging_keys  # still there
    cleared = h.run(lambda cut: h.ledger.clear_superseded_rows(cut, step=1))
    assert [(c.key, c.rollout_id) for c in cleared] == [(k, "g1_g0") for k in failed.staging_keys]
    (event,) = _events(h, CONTROLLER_STREAM, StagingCleared)
    assert event.step == 1 and event.of_attempts == cleared
    assert h.data_plane.list_keys(STAGING) == {}


def test_a_live_attempts_rows_stay_and_a_tag_naming_no_attempt_is_never_staged(
    harness: Harness,
) -> None:
    h = harness
    h.reserve("g1", n=1)
    h.dispatch("g1")
    running = h.stage("g1_g0", calls=1)  # dispatched: it may still stage and seal
    h.data_plane.put_rows(
        STAGING, {"stray": {"token_ids": torch.zeros(1)}}, tags={"stray": {"rollout_id": "x"}}
    )
    assert h.run(lambda cut: h.ledger.clear_superseded_rows(cut)) == []
    (event,) = _events(h, CONTROLLER_STREAM, StagingCleared)
    assert (event.of_attempts, event.never_staged) == ([], ["stray"])
    assert sorted(h.data_plane.list_keys(STAGING)) == running.staging_keys


def test_log_first_delete_after_a_crash_in_between_leaves_rows_the_next_clean_up_clears(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    h.reserve("g1", n=1)
    h.dispatch("g1")
    h.seal("g1", 0)
    keys = h.ledger.group("g1").staging_keys()

    def crash(partition: str, rows: object) -> None:
        raise SystemExit("killed between the append and the delete")

    with monkeypatch.context() as patched:
        patched.setattr(h.data_plane, "delete_rows", crash)
        with pytest.raises(SystemExit):
            h.finalize("g1")
    # The log calls the rows cleared; they are still there. Deleting again is idempotent.
    (logged,) = _events(h, group_stream("g1"), GroupFinalized)
    assert [c.key for c in logged.staging_cleared] == keys
    assert sorted(h.data_plane.list_keys(STAGING)) == keys
    h.reopen()
    cleared = h.run(lambda cut: h.ledger.clear_superseded_rows(cut))
    assert [c.key for c in cleared] == keys
    assert h.data_plane.list_keys(STAGING) == {}


def test_restore_fails_closed_on_a_missing_canonical_row_and_clears_an_orphan(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    h.reserve("g1", n=2)
    h.dispatch("g1")
    h.seal("g1", 0)
    h.seal("g1", 1)
    h.finalize("g1")
    h.data_plane.put_rows(TRAINING, {"orphan_g0": {"reward": torch.tensor(0.0)}})
    h.checkpoint(1)
    h.data_plane.delete_rows(TRAINING, ["g1_g1"])  # lost after the checkpoint: not in it
    h.fresh_process()
    plan = _restore(h)
    assert plan.replay_group_ids == ["g1"]
    (rows,) = _events(h, CONTROLLER_STREAM, RowsCleared)
    assert (rows.keys, rows.partition, rows.step) == (["orphan_g0"], TRAINING, 1)
    assert sorted(h.data_plane.list_keys(TRAINING)) == ["g1_g0", "g1_g1"]

    # A finalized group's canonical row lost: the checkpoint refuses, appending nothing (it
    # would commit and never restore, and with `keep` retire the last one that does).
    h.data_plane.delete_rows(TRAINING, ["g1_g1"])
    head = h.log.head()
    with pytest.raises(ReconciliationError, match=r"'g1_g1' is missing .* checkpoint step 2"):
        h.checkpoint(2)
    assert h.log.head() == head
    # A checkpoint that lacks it all the same (taken by code before that check): the restore
    # fails closed.
    with monkeypatch.context() as patch:
        patch.setattr(checkpoint, "check_canonical_rows", lambda *_, **__: {})
        h.checkpoint(2)
    h.fresh_process()
    head = h.log.head()
    with pytest.raises(
        ReconciliationError, match=r"group 'g1': canonical row 'g1_g1' is missing from partition"
    ):
        _restore(h)
    assert h.log.head() == head


def test_a_killed_workers_tagged_row_is_attributed_to_its_attempt(harness: Harness) -> None:
    """Put, then killed before its TokensStaged: the rollout_id tag still names the attempt."""
    h = harness
    h.reserve("g1", n=1)
    h.dispatch("g1")
    rid = h.start_generation("g1", 0)
    h.data_plane.put_rows(
        STAGING,
        {f"{rid}/call-0": {"token_ids": torch.arange(2)}},
        tags={f"{rid}/call-0": {"rollout_id": rid}},
    )
    h.checkpoint(1)
    h.fresh_process()
    _restore(h)
    (cleared,) = _events(h, CONTROLLER_STREAM, StagingCleared)
    assert [(c.key, c.rollout_id) for c in cleared.of_attempts] == [(f"{rid}/call-0", rid)]
    assert cleared.never_staged == []


def test_seals_and_finalization_record_each_siblings_weight_versions(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=2)
    h.dispatch("g1")
    h.seal("g1", 0)
    rid = h.rollout_id("g1", 1)
    receipt = h.stage(rid, calls=1)
    h.log.append(
        attempt_stream(rid),
        [
            TokensStaged(
                rollout_id=rid,
                partition=STAGING,
                staging_key=f"{rid}/late",
                token_count=1,
                weight_version=2,
            )
        ],
        ANY,
    )
    h.data_plane.put_rows(STAGING, {f"{rid}/late": {"token_ids": torch.arange(1)}})
    receipt = type(receipt)(rollout_id=rid, staging_keys=[*receipt.staging_keys, f"{rid}/late"])
    h.run(
        lambda cut: h.ledger.seal_sibling(
            cut, "g1", 1, rollout_id=rid, receipt=receipt, reward=1.0, mask_sample=False
        )
    )
    seals = _events(h, group_stream("g1"), SiblingSealed)
    assert [s.weight_versions for s in seals] == [[0], [0, 2]]
    h.finalize("g1")
    (finalized,) = _events(h, group_stream("g1"), GroupFinalized)
    assert finalized.weight_versions == [[0], [0, 2]]


def test_resolving_finalization_unknown_by_the_canonical_partition(harness: Harness) -> None:
    h = harness
    for gid in ("done", "lost"):
        h.reserve(gid, n=2)
        h.dispatch(gid)
        h.seal(gid, 0)
        h.seal(gid, 1)
        h.run(partial(h.ledger.start_finalization, group_id=gid, owner="f"))
        h.run(partial(h.ledger.mark_finalization_unknown, group_id=gid, owner="f", error="timeout"))
    h.put_canonical_rows("done")
    h.data_plane.put_rows(TRAINING, {"lost_g0": {"reward": torch.tensor(1.0)}})  # half written

    resolve = h.ledger.resolve_finalization_unknown
    assert h.run(lambda cut: resolve(cut, "done")) == "finalized"
    assert h.ledger.replay.entries()[0].group_id == "done"
    assert h.run(lambda cut: resolve(cut, "lost")) == "retryable"
    (retry,) = _events(h, group_stream("lost"), FinalizationRetryable)
    assert retry.canonical_rows_cleared == ["lost_g0"] and "lost_g1" in retry.reason
    assert h.ledger.group("lost").status == "ready_to_finalize"
    assert sorted(h.data_plane.list_keys(TRAINING)) == ["done_g0", "done_g1"]
    head = h.log.head()
    with pytest.raises(LedgerRuleError, match="is ready_to_finalize, not finalization_unknown"):
        h.run(lambda cut: resolve(cut, "lost"))
    assert h.log.head() == head
    h.finalize("lost", owner="f2")  # retryable: a new finalization goes through
    assert h.reopen().digest() == h.ledger.digest()


def test_a_group_with_too_few_valid_rows_is_discarded_and_recorded(harness: Harness) -> None:
    h = harness
    h.ledger.config = config_from_dict(
        {
            "rollout_recovery": {"min_valid_row_fraction": 0.5},
            "token_capture": {"enabled": True},
            "checkpointing": {"enabled": True, "save_data_plane": True},
        }
    )
    for gid, masked in (("keep", [False, True]), ("drop", [True, True])):
        h.reserve(gid, n=2)
        h.dispatch(gid)
        for i, mask in enumerate(masked):
            rid = h.rollout_id(gid, i)
            receipt = h.stage(rid, calls=1)
            h.run(
                partial(
                    h.ledger.seal_sibling,
                    group_id=gid,
                    generation_index=i,
                    rollout_id=rid,
                    receipt=receipt,
                    reward=0.0,
                    mask_sample=mask,
                )
            )
    owned = h.ledger.group("drop").staging_keys()
    assert h.run(lambda cut: h.ledger.discard_if_few_valid_rows(cut, "keep")) is None
    reason = h.run(lambda cut: h.ledger.discard_if_few_valid_rows(cut, "drop"))
    assert reason is not None and "0/2 = 0.000 is below" in reason
    (discarded,) = _events(h, group_stream("drop"), GroupDiscarded)
    assert discarded.reason == reason and discarded.staging_keys == owned
    assert "drop" not in h.ledger.state.groups and "keep" in h.ledger.state.groups
    assert not set(owned) & set(h.data_plane.list_keys(STAGING))
