"""Versioned projections: a code change that reshapes the ledger state strands no checkpoint.

The code change is real: a child process restores with a copy of `projections/` whose
GroupState has one more field, the way the next release would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from eventlog import EventLog
from eventlog.cli.main import main
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.recovery import checkpoint
from eventlog.recovery.errors import ProjectionVersionError, ReconciliationError
from eventlog.recovery.ledger import RecoveryLedger
from eventlog.recovery.vocabulary import CONTROLLER_STREAM, CheckpointCommitted, RestoreCompleted
from projections.siblings import LedgerState
from projections.version import PROJECTION_VERSION, projection_version
from tests.fixtures.ledger import (  # noqa: F401
    Harness,
    ListDataset,
    backend_harness_fixture,
    log_backend_harness_fixture,
)

REPO = Path(__file__).resolve().parents[1]
OLD = Path(__file__).parent / "data" / "ledger-before-projection-version"
"""A log and in-memory data-plane checkpoint written before projection versions existed
(commit fcba566): its CheckpointCommitted and snapshot carry no version."""

_CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    from eventlog import EventLog
    from eventlog.recovery.barrier import MutationBarrier
    from eventlog.dataplane.memory import InMemoryDataPlane
    from eventlog.recovery.ledger import RecoveryLedger
    from projections.siblings import GroupState
    from projections.version import PROJECTION_VERSION

    class Dataset:
        def __init__(self, prompts): self.prompts = prompts
        def get(self, sample_id): return self.prompts[sample_id]

    async def main():
        path, prompts, checkpoint_dir = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
        barrier = MutationBarrier()
        with EventLog.open(path) as log:
            ledger = RecoveryLedger(log, InMemoryDataPlane(), barrier=barrier)
            async with barrier.mutation("recovery_restore") as cut:
                plan = ledger.restore(cut, Dataset(prompts))
            async with barrier.checkpoint() as cut:
                ledger.checkpoint(cut, step=2, directory=checkpoint_dir)
        print(json.dumps({
            "version": PROJECTION_VERSION,
            "has_note": "note" in GroupState.__struct_fields__,
            "redispatch": {p.group_id: p.redispatch_indices for p in plan.admitted},
        }))

    asyncio.run(main())
    """
)


@pytest.fixture(name="harness")
def _harness_on_each_backend(backend_harness: Harness) -> Harness:
    """SQLite and the real PostgreSQL server with the in-memory data plane, and SQLite with
    the real TransferQueue."""
    return backend_harness


def _next_release(tmp_path: Path) -> Path:
    """A copy of `projections/` whose GroupState gained an optional field."""
    root = tmp_path / "next_release"
    shutil.copytree(REPO / "projections", root / "projections")
    siblings = root / "projections" / "siblings.py"
    text = siblings.read_text()
    anchor = "    finalization_owner: str | None = None\n"
    assert text.count(anchor) == 1
    siblings.write_text(text.replace(anchor, anchor + "    note: str | None = None\n"))
    return root


def _restores(location: str) -> list[RestoreCompleted]:
    with EventLog.open(location) as log:
        return [
            r.event
            for r in log.read_stream(CONTROLLER_STREAM)
            if isinstance(r.event, RestoreCompleted)
        ]


def test_the_version_follows_the_state_shape_not_its_prose() -> None:
    assert projection_version(LedgerState) == PROJECTION_VERSION
    assert PROJECTION_VERSION.startswith("1.")

    class Other(LedgerState, kw_only=True):
        """Same fields plus one."""

        extra: int = 0

    assert projection_version(Other) != PROJECTION_VERSION


def test_a_checkpoint_of_the_previous_code_restores_after_the_state_gained_a_field(
    log_backend_harness: Harness, tmp_path: Path
) -> None:
    h = log_backend_harness  # the next release's process restores an in-memory data plane
    h.reserve("g1", n=2)
    h.dispatch("g1")
    h.seal("g1", 0)
    h.checkpoint(1)
    h.seal("g1", 1)  # rolled back by the restore below
    h.log.close()
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            h.location,
            json.dumps(h.dataset.prompts),
            str(tmp_path / "step_2"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,  # not REPO: `python -c` puts the cwd first on sys.path
        env={**os.environ, "PYTHONPATH": f"{_next_release(tmp_path)}{os.pathsep}{REPO}"},
    )
    assert child.returncode == 0, child.stderr
    out: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    assert out["has_note"] and out["version"] != PROJECTION_VERSION
    assert out["redispatch"] == {"g1": [1]}
    # It said so: in its log output, and in the RestoreCompleted it appended.
    assert "not trusted" in child.stderr
    assert "a code change, not a divergence" in child.stderr
    (restored,) = _restores(h.location)
    assert restored.snapshots_untrusted == 1
    assert restored.records_folded > 0
    assert restored.digest_compared is False
    assert restored.projection_version == out["version"]

    # Back on this code: the newest snapshot is the other version's, so the fold starts at
    # the older snapshot of this version (step 1) and folds only the records after it.
    h.fresh_process()
    plan = h.run(lambda cut: h.ledger.restore(cut, h.dataset, step=2), kind="recovery_restore")
    assert plan.admitted[0].redispatch_indices == [1]
    again = _restores(h.location)[-1]
    assert (again.snapshots_untrusted, again.digest_compared) == (1, False)
    with EventLog.open(h.location) as log:
        total = log.head()
    assert 0 < again.records_folded < total - restored.records_folded


def test_a_digest_mismatch_of_the_same_version_is_a_divergence(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    h.reserve("g1", n=2)
    with monkeypatch.context() as patch:
        patch.setattr(checkpoint, "state_digest", lambda state: "0" * 64)
        h.checkpoint(1)
    h.fresh_process()
    head = h.log.head()
    with pytest.raises(ReconciliationError, match="diverged") as caught:
        h.run(lambda cut: h.ledger.restore(cut, h.dataset))
    assert not isinstance(caught.value, ProjectionVersionError)
    assert PROJECTION_VERSION in str(caught.value)
    assert h.log.head() == head


def test_a_digest_of_another_version_is_told_apart_from_a_divergence(harness: Harness) -> None:
    h = harness
    h.reserve("g1", n=2)
    h.checkpoint(1)
    with EventLog.open(h.location) as log:
        (rec,) = [r for r in log.read(types=["CheckpointCommitted"])]
    assert isinstance(rec.event, CheckpointCommitted)
    assert rec.event.projection_version == PROJECTION_VERSION
    older = CheckpointCommitted(
        **{
            **{f: getattr(rec.event, f) for f in rec.event.__struct_fields__},
            "ledger_digest": "0" * 64,
            "projection_version": "0.000000000000",
        }
    )
    state = RecoveryLedger.open(h.log, h.data_plane, read_only=True).state
    with pytest.raises(ProjectionVersionError, match=r"version 0\.000000000000, this code is"):
        checkpoint.check_ledger_digest(older, rec.seq, state)
    assert checkpoint.check_ledger_digest(rec.event, rec.seq, state) is True


def test_a_checkpoint_written_before_projection_versions_still_restores(tmp_path: Path) -> None:
    copy = tmp_path / "old"
    shutil.copytree(OLD, copy, ignore=shutil.ignore_patterns("data_plane"))
    upgraded = CliRunner().invoke(main, ["db", "upgrade", str(copy / "run.sqlite")])
    assert upgraded.exit_code == 0, upgraded.output
    with EventLog.open(copy / "run.sqlite") as log:
        (rec,) = [r for r in log.read(types=["CheckpointCommitted"])]
        assert isinstance(rec.event, CheckpointCommitted)
        assert rec.event.projection_version is None
        # Its data-plane checkpoint sits where the old run saved it (an absolute path).
        ref = Path(rec.event.data_plane_ref)
        if not ref.exists():
            shutil.copytree(OLD / "data_plane", ref)
        prompts = json.loads((copy / "prompts.json").read_text())
        dataset = ListDataset(prompts)
        h = Harness(
            path=copy / "run.sqlite",
            log=log,
            data_plane=InMemoryDataPlane(),
            ledger=RecoveryLedger(log, InMemoryDataPlane()),
            dataset=dataset,
        )
        h.ledger = RecoveryLedger(log, h.data_plane)
        plan = h.run(lambda cut: h.ledger.restore(cut, dataset), kind="recovery_restore")
        groups = {p.group_id: p.redispatch_indices for p in plan.admitted}
        assert groups == {"g1": [1], "g2": [0, 1]}
        (restored,) = [
            r.event
            for r in log.read_stream(CONTROLLER_STREAM)
            if isinstance(r.event, RestoreCompleted) and r.event.projection_version
        ]
        assert restored.snapshots_untrusted == 1  # its snapshot carries no version
        assert restored.projection_version == PROJECTION_VERSION


def test_the_fold_starts_from_an_older_snapshot_of_this_version_or_gives_up_after_a_few(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    h.reserve("g1", n=2)
    h.checkpoint(1)  # a snapshot of this version
    h.dispatch("g1")
    with monkeypatch.context() as patch:
        patch.setattr(checkpoint, "PROJECTION_VERSION", "0.000000000000")
        h.checkpoint(2)  # a snapshot "of another version"
    with EventLog.open(h.location) as log:
        second = [r.seq for r in log.read(types=["CheckpointCommitted"])][-1]
    h.fresh_process()
    h.run(lambda cut: h.ledger.restore(cut, h.dataset, step=2))
    older = _restores(h.location)[-1]
    assert older.snapshots_untrusted == 1 and 0 < older.records_folded < second
    with monkeypatch.context() as patch:
        patch.setattr(checkpoint, "MAX_UNTRUSTED", 1)
        h.fresh_process()
        h.run(lambda cut: h.ledger.restore(cut, h.dataset, step=2))
    gave_up = _restores(h.location)[-1]
    assert gave_up.snapshots_untrusted == 1 and gave_up.records_folded == second
