"""Restore against each data plane: the real TransferQueue and its in-memory twin.

The harness's own tests use the twin; these run the reconciliation rules that matter most
(orphans cleared and recorded, a missing referenced row fails closed) on both.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from eventlog import EventLog
from eventlog.dataplane.protocol import DataPlaneCheckpoint
from eventlog.recovery.barrier import MutationBarrier
from eventlog.recovery.errors import ReconciliationError
from eventlog.recovery.ledger import RecoveryLedger
from eventlog.recovery.vocabulary import CONTROLLER_STREAM, StagingCleared
from tests.fixtures.ledger import STAGING, Harness
from tests.fixtures.tq import ClearableDataPlane


class LosesARowOnLoad:
    """Any data plane that comes back from its checkpoint without one row (a lost shard)."""

    def __init__(self, inner: ClearableDataPlane, lose: str) -> None:
        self.inner = inner
        self.lose = lose

    def load_checkpoint(self, checkpoint: DataPlaneCheckpoint) -> None:
        self.inner.load_checkpoint(checkpoint)
        self.inner.delete_rows(STAGING, [self.lose])

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


@pytest.fixture
def plane_harness(tmp_path: Path, data_plane: ClearableDataPlane) -> Iterator[Harness]:
    path = tmp_path / "run.db"
    log = EventLog.open(path)
    h = Harness(
        path=path,
        log=log,
        data_plane=data_plane,  # type: ignore[arg-type]
        ledger=RecoveryLedger.open(log, data_plane),
    )
    try:
        yield h
    finally:
        h.log.close()


def _restart(h: Harness, data_plane: object) -> None:
    """A new controller process: the data plane's rows died with the old one."""
    h.data_plane.clear()
    h.log.close()
    h.log = EventLog.open(h.path)
    h.barrier = MutationBarrier()
    h.ledger = RecoveryLedger(h.log, data_plane)  # type: ignore[arg-type]


def test_restore_on_each_data_plane_keeps_sealed_rows_and_clears_orphans(
    plane_harness: Harness,
) -> None:
    h = plane_harness
    h.reserve("g1", n=3)
    h.dispatch("g1")
    h.seal("g1", 0)
    h.start_generation("g1", 1)
    killed = h.stage("g1_g1", calls=1)  # staged, then the worker died
    # Workers tag rows with their rollout id: restore reads only the attempt streams the
    # unreferenced rows name (a stray row's tag names a stream with no TokensStaged).
    h.data_plane.put_rows(
        STAGING,
        {killed.staging_keys[0]: {"token_ids": torch.arange(3)}},
        tags={killed.staging_keys[0]: {"rollout_id": "g1_g1"}},
    )
    h.data_plane.put_rows(
        STAGING, {"stray/0": {"token_ids": torch.zeros(2)}}, tags={"stray/0": {"rollout_id": "x"}}
    )
    h.checkpoint(1)
    _restart(h, h.data_plane)

    plan = h.run(lambda cut: h.ledger.restore(cut, h.dataset))

    assert sorted(h.data_plane.list_keys(STAGING)) == ["g1_g0/call-0", "g1_g0/call-1"]
    assert plan.admitted[0].redispatch_indices == [1, 2]
    assert plan.counts["rows_cleared"] == 2
    (cleared,) = [
        r.event for r in h.log.read_stream(CONTROLLER_STREAM) if isinstance(r.event, StagingCleared)
    ]
    assert [k.key for k in cleared.of_attempts] == killed.staging_keys
    assert cleared.never_staged == ["stray/0"]
    rows = h.data_plane.read_rows(STAGING, ["g1_g0/call-0"])
    token_ids = rows["g1_g0/call-0"]["token_ids"]
    assert isinstance(token_ids, torch.Tensor) and torch.equal(token_ids, torch.arange(3))


def test_restore_on_each_data_plane_fails_closed_on_a_missing_referenced_row(
    plane_harness: Harness,
) -> None:
    h = plane_harness
    h.reserve("g1", n=2)
    h.dispatch("g1")
    h.seal("g1", 1)
    h.checkpoint(1)
    _restart(h, LosesARowOnLoad(h.data_plane, "g1_g1/call-0"))
    head = h.log.head()
    with pytest.raises(ReconciliationError, match=r"group 'g1', sibling 1.*'g1_g1/call-0'"):
        h.run(lambda cut: h.ledger.restore(cut, h.dataset))
    assert h.log.head() == head
