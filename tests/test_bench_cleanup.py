"""The cleanup benchmark's smoke run: keep and clean blocks in ABAB rounds, the noise floor,
the ledger command beside them, and a verdict that follows from them."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from bench import cleanup, fencing


def test_quick_cleanup_benchmark_compares_finalize_appends_with_and_without_cleanup(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    output = io.StringIO()
    results = cleanup.run(
        quick=True,
        repeats=2,
        scale=0.2,
        backends=["sqlite"],
        out_dir=out,
        workdir=tmp_path / "work",
        console=Console(file=output, width=200),
    )
    rows = json.loads((out / "cleanup.json").read_text())
    assert rows == results.rows
    assert [(r["backend"], r["durability"]) for r in rows] == [
        ("sqlite", "full"),
        ("sqlite", "normal"),
    ]
    for row in rows:
        assert [list(b) for b in row["blocks_us"]] == [
            ["keep", "clean", "keep2", "clean2"],
            ["clean", "keep", "clean2", "keep2"],
        ]
        assert all(v > 0 for b in row["blocks_us"] for v in b.values())
        assert row["noise_floor_us"] >= 0 and row["ledger_us_per_command"] > 0
    for row, target in zip(rows, results.targets, strict=True):
        allowed = max(row["noise_floor_us"], fencing.THRESHOLD * row["ledger_us_per_command"])
        assert target["status"] == ("PASS" if row["delta_us"] <= allowed else "MISS")
        assert "with vs without cleanup" in target["target"]
    assert "cleanup: cost per finalize command" in output.getvalue()


def test_a_clean_command_appends_the_staging_cleared_event_and_deletes_the_rows(
    tmp_path: Path,
) -> None:
    """What the clean kind does is what finalize adds: the event in the same append, the delete."""
    from eventlog import EventLog
    from eventlog.dataplane.memory import InMemoryDataPlane

    plane = InMemoryDataPlane()
    with EventLog.open(tmp_path / "log.db") as log:
        step = cleanup.cleanup_step(log, plane)
        step(0, False)
        step(1, True)
        types = [r.type for r in log.read()]
    assert types == ["StaleResultRejected", "StaleResultRejected", "StagingCleared"]
    assert plane.list_keys(cleanup.STAGING) == {}
