"""The replay benchmark's machinery: its generated run log is one the ledger accepts, the cache
is reused, and a small run writes every row people read. No timing is asserted."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from bench import replay, runlog
from bench.runlog import copy_log, run_log
from eventlog import EventLog
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.recovery.checkpoint import SNAPSHOT_NAME
from eventlog.recovery.ledger import RecoveryLedger
from projections.siblings import LedgerState, fold, state_digest


def test_generated_run_log_verifies_folds_to_its_checkpoint_digests_and_is_cached(
    tmp_path: Path,
) -> None:
    run, cached = run_log(8000, cache_dir=tmp_path)
    assert not cached
    again, cached = run_log(8000, cache_dir=tmp_path)
    assert cached and again.manifest == run.manifest

    with EventLog.open(run.path) as log:
        report = log.verify()
        assert report.ok, report.problems
        assert report.records == run.records == sum(run.manifest["types"].values())
        # every checkpoint's ledger digest is what folding the log up to it gives
        state = LedgerState()
        digests = {}
        for rec in log.read():
            if rec.type == "CheckpointCommitted":
                digests[rec.seq] = (rec.event.ledger_digest, state_digest(state))  # type: ignore[attr-defined]
            fold(state, rec.event)
        assert len(digests) == len(run.manifest["checkpoints"]) >= 5
        assert all(recorded == folded for recorded, folded in digests.values())
        last = run.manifest["checkpoints"][-1]["seq"]
        assert log.load_snapshot(SNAPSHOT_NAME, None) is not None
        assert log.load_snapshot(SNAPSHOT_NAME, None)[0] == last  # type: ignore[index]
        reopened = RecoveryLedger.open(log, InMemoryDataPlane(), read_only=True).digest()
        assert reopened == state_digest(state)
    types = run.manifest["types"]
    for kind in ("GenerationFailed", "RetryPrepared", "GroupSealed", "StaleResultRejected"):
        assert types.get(kind, 0) > 0, kind

    bare = copy_log(run, tmp_path / "bare.db", keep_snapshots=False)
    with EventLog.open(bare) as log:
        assert log.load_snapshot(SNAPSHOT_NAME, None) is None
        assert log.head() == run.records


def test_small_replay_benchmark_writes_every_row_with_the_same_restore_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The newest checkpoint between two train steps: the replay buffer holds finalized groups
    # whose canonical rows the checkpoint's data plane must hold, or the restore fails closed.
    monkeypatch.setattr(runlog, "TAIL", 210)
    out = tmp_path / "out"
    output = io.StringIO()
    results = replay.run(
        records=8000,
        repeats=1,
        out_dir=out,
        workdir=tmp_path / "work",
        cache_dir=tmp_path / "cache",
        sizes=[4000],
        console=Console(file=output, width=200),
    )
    rows = json.loads((out / "replay.json").read_text())
    assert rows == results.rows
    assert results.header["checkpoint"]["replay"] > 0
    sized = [r for r in rows if not r.get("main") and r["benchmark"] == "restore"]
    assert [(r["snapshot"], r["folded_records"]) for r in sized] == [(True, 0)]
    assert sized[0]["records"] < results.header["run_log"]["head"]
    rows = [r for r in rows if r not in sized]
    cells = {(r["benchmark"], r["snapshot"]) for r in rows}
    assert cells == {
        ("raw_decode", False),
        ("read", False),
        ("decode", False),
        ("fold", False),
        ("fold_every_record", False),
        ("restore", True),
        ("restore", False),
        ("open", True),
        ("restore_other_version", True),
    }
    head = results.header["run_log"]["head"]
    for row in rows:
        assert row["records"] == head
        assert row["seconds"] > 0 and row["records_per_s"] > 0
    by = {(r["benchmark"], r["snapshot"]): r for r in rows}
    with_snapshot, without = by[("restore", True)], by[("restore", False)]
    assert with_snapshot["counts"] == without["counts"]
    assert with_snapshot["counts"]["groups_restored"] == with_snapshot["groups"] > 0
    assert (with_snapshot["folded_records"], without["folded_records"]) == (
        0,
        results.header["checkpoint"]["seq"],
    )
    assert with_snapshot["tail_records"] == head - results.header["checkpoint"]["seq"] > 0
    assert without["phases_s"]["fold_s"] > 0
    assert with_snapshot["maxrss_mb"] >= with_snapshot["baseline_maxrss_mb"] > 0
    assert with_snapshot["speedup_vs_no_snapshot"] > 0
    other = by[("restore_other_version", True)]
    assert with_snapshot["snapshots_untrusted"] == 0
    assert other["counts"] == with_snapshot["counts"]
    assert other["snapshots_untrusted"] >= 1 and other["phases_s"]["fold_s"] > 0
    assert other["vs_same_version"] > 0
    assert len(results.targets) == 5
    assert {t["status"] for t in results.targets} <= {"PASS", "MISS"}
    assert (out / "replay.machine.json").is_file()
    assert "replay and restore" in output.getvalue()
