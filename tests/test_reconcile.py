"""Reconciling the ledger with the data plane: keep, clear (by cause), or fail closed."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pytest
import torch

from eventlog.dataplane.protocol import DataPlane, DataPlaneCheckpoint, Row
from eventlog.recovery.errors import ReconciliationError
from eventlog.recovery.vocabulary import (
    CONTROLLER_STREAM,
    ClearedKey,
    Granularity,
    PromptRef,
    Receipt,
    StagingCleared,
    TokensStaged,
)
from projections.reconcile import reconcile, referenced_keys, staged_by
from projections.siblings import (
    AttemptState,
    GroupState,
    LedgerState,
    RuleViolation,
    SiblingState,
)
from tests.fixtures.ledger import STAGING, Harness, backend_harness_fixture  # noqa: F401


@pytest.fixture(name="harness")
def _harness_on_each_backend(backend_harness: Harness) -> Harness:
    """Every test here runs on SQLite and on the real PostgreSQL server (the in-memory data
    plane), and on SQLite with the real TransferQueue."""
    return backend_harness


def _group(gid: str, keys_by_sibling: list[list[str] | None]) -> GroupState:
    siblings = []
    for i, keys in enumerate(keys_by_sibling):
        rid = f"{gid}_g{i}"
        attempt = (
            AttemptState(attempt=0, rollout_id=rid, status="dispatched")
            if keys is None
            else AttemptState(
                attempt=0,
                rollout_id=rid,
                status="sealed",
                receipt=Receipt(rollout_id=rid, staging_keys=keys),
                reward=1.0,
                mask_sample=False,
            )
        )
        siblings.append(SiblingState(generation_index=i, attempts=(attempt,)))
    return GroupState(
        group_id=gid,
        admission_id=gid,
        prompt_ref=PromptRef(sample_id=gid, task_name=None),
        prompt_id=gid,
        prompt_hash=None,
        agent_name=None,
        granularity=Granularity.SIBLING,
        expected_generations=len(siblings),
        target_step=0,
        start_weight_version=0,
        phase="admitted",
        status="generating",
        siblings=tuple(siblings),
    )


def test_reconcile_keeps_owned_rows_and_splits_unreferenced_rows_by_cause() -> None:
    state = LedgerState(groups={"g": _group("g", [["k0", "k1"], None])})
    verdict = reconcile(
        state,
        present=["k0", "k1", "old-attempt", "stray"],
        staged={"old-attempt": "g_g1", "k0": "g_g0"},
        partition=STAGING,
    )
    assert verdict.keep == ["k0", "k1"]
    assert verdict.missing == []
    assert verdict.clear_of_attempts == [ClearedKey(key="old-attempt", rollout_id="g_g1")]
    assert verdict.clear_never_staged == ["stray"]
    assert verdict.clear == ["old-attempt", "stray"]


def test_reconcile_reports_a_missing_owned_row_with_its_owner() -> None:
    state = LedgerState(groups={"g": _group("g", [None, ["k0"]])})
    verdict = reconcile(state, present=[], staged={}, partition=STAGING)
    (missing,) = verdict.missing
    assert (missing.key, missing.owner.group_id, missing.owner.generation_index) == ("k0", "g", 1)


def test_a_row_owned_by_two_attempts_is_a_rule_violation() -> None:
    state = LedgerState(groups={"a": _group("a", [["k"]]), "b": _group("b", [["k"]])})
    with pytest.raises(RuleViolation, match="owned by both 'a_g0' and 'b_g0'"):
        referenced_keys(state)


def test_staged_by_reads_only_the_partition_asked_for() -> None:
    events = [
        TokensStaged(
            rollout_id="r1", partition=STAGING, staging_key="k1", token_count=1, weight_version=0
        ),
        TokensStaged(
            rollout_id="r2", partition="other", staging_key="k2", token_count=1, weight_version=0
        ),
    ]
    assert staged_by(events, STAGING) == {"k1": "r1"}


def test_restore_clears_orphaned_rows_and_records_each_cause(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=2)
    h.dispatch("g1")
    h.seal("g1", 0)
    # A worker killed mid-attempt: started, staged one row, never finished.
    h.start_generation("g1", 1)
    killed = h.stage("g1_g1", calls=1)
    # A row that no event ever staged (written outside the protocol).
    h.data_plane.put_rows(STAGING, {"stray/0": {"token_ids": torch.zeros(1)}})
    h.checkpoint(1)
    h.fresh_process()
    plan = h.run(lambda cut: h.ledger.restore(cut, h.dataset))
    assert plan.staging.clear_of_attempts == [
        ClearedKey(key=killed.staging_keys[0], rollout_id="g1_g1")
    ]
    assert plan.staging.clear_never_staged == ["stray/0"]
    assert plan.counts["rows_cleared"] == 2
    assert sorted(h.data_plane.list_keys(STAGING)) == ["g1_g0/call-0", "g1_g0/call-1"]
    (cleared,) = [
        r.event for r in h.log.read_stream(CONTROLLER_STREAM) if isinstance(r.event, StagingCleared)
    ]
    assert cleared.of_attempts == [ClearedKey(key="g1_g1/call-0", rollout_id="g1_g1")]
    assert cleared.never_staged == ["stray/0"]
    assert plan.admitted[0].redispatch_indices == [1]


class _LossyDataPlane:
    """A data plane (the harness's own, in memory or TQ) that loses a row while loading its
    checkpoint, as a lost TQ shard would."""

    def __init__(self, plane: DataPlane, lose: str) -> None:
        self.plane = plane
        self.lose = lose

    def list_partitions(self) -> list[str]:
        return self.plane.list_partitions()

    def list_keys(self, partition: str) -> dict[str, dict[str, str]]:
        return self.plane.list_keys(partition)

    def put_rows(
        self,
        partition: str,
        rows: Mapping[str, Row],
        tags: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.plane.put_rows(partition, rows, tags)

    def read_rows(self, partition: str, keys: Sequence[str]) -> dict[str, Row]:
        return self.plane.read_rows(partition, keys)

    def delete_rows(self, partition: str, keys: Iterable[str]) -> None:
        self.plane.delete_rows(partition, keys)

    def save_checkpoint(self, directory: str) -> DataPlaneCheckpoint:
        return self.plane.save_checkpoint(directory)

    def load_checkpoint(self, checkpoint: DataPlaneCheckpoint) -> None:
        self.plane.load_checkpoint(checkpoint)
        self.plane.delete_rows(STAGING, [self.lose])


def test_restore_fails_closed_when_a_referenced_row_is_missing(harness: Harness) -> None:
    from eventlog.recovery.ledger import RecoveryLedger

    h = harness
    h.reserve("g1", n=2)
    h.dispatch("g1")
    h.seal("g1", 1)
    h.checkpoint(1)
    h.fresh_process()
    h.ledger = RecoveryLedger(h.log, _LossyDataPlane(h.data_plane, lose="g1_g1/call-1"))
    head = h.log.head()
    with pytest.raises(
        ReconciliationError,
        match=r"group 'g1', sibling 1, attempt 0: staging key 'g1_g1/call-1' is missing",
    ):
        h.run(lambda cut: h.ledger.restore(cut, h.dataset))
    assert h.log.head() == head


def test_rows_of_failed_and_abandoned_attempts_are_cleared_during_a_run(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=3)
    h.dispatch("g1")
    h.seal("g1", 0)
    failed = h.stage(h.rollout_id("g1", 1), calls=2)  # staged two calls, then failed
    h.run(lambda cut: h.ledger.fail_attempt(cut, "g1", 1, rollout_id="g1_g1", error="boom"))
    running = h.stage(h.rollout_id("g1", 2), calls=1)  # still dispatched: may stage more
    cleared = h.run(lambda cut: h.ledger.clear_superseded_rows(cut))
    assert cleared == [ClearedKey(key=k, rollout_id="g1_g1") for k in failed.staging_keys]
    assert sorted(h.data_plane.list_keys(STAGING)) == sorted(
        ["g1_g0/call-0", "g1_g0/call-1", *running.staging_keys]
    )
    (event,) = [
        r.event for r in h.log.read_stream(CONTROLLER_STREAM) if isinstance(r.event, StagingCleared)
    ]
    assert event.of_attempts == cleared and event.never_staged == []
    head = h.log.head()
    assert h.run(lambda cut: h.ledger.clear_superseded_rows(cut)) == []  # nothing left to clear
    assert h.log.head() == head
