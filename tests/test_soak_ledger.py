"""The ledger soak, short: controllers SIGKILLed between and inside commands restore
consistently (the long run is `python -m bench.soak --ledger`, RELIABILITY.md)."""

from __future__ import annotations

from pathlib import Path

from bench.soak_ledger import LedgerSoakReport, _check, run_ledger_soak


def test_killed_controllers_restore_consistently(tmp_path: Path) -> None:
    report = run_ledger_soak(kills=8, rotate=4, seed=3, workdir=tmp_path)
    assert report.failures == []
    assert report.ok
    assert report.kills == report.restores == report.checkpoint_kept == 8
    assert report.commands_acked > 0 and report.checkpoints_acked > 0


def test_the_check_reports_a_restore_older_than_an_acknowledged_checkpoint(
    tmp_path: Path,
) -> None:
    """The harness's own check must see what it is there to see."""
    run_ledger_soak(kills=1, rotate=1, min_delay=0.4, max_delay=0.5, seed=4, workdir=tmp_path)
    report = LedgerSoakReport()
    _check(str(tmp_path / "ledger0.db"), 10**9, report, "here")
    assert report.checkpoint_kept == 0
    assert any("older than the acknowledged one" in f for f in report.failures)
