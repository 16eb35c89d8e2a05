"""Crash safety, proven by killing (the short version of `python -m bench.soak`): appenders of
every kind SIGKILLed at random moments lose no acknowledged event, double none, leave no gap,
and leave a log that verifies and takes the next append."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest

from bench.soak import MODES, SoakReport, _check, postgres_targets, run_soak, sqlite_targets
from bench.soak_events import SoakNote
from eventlog import EventLog, Proposed
from tests.reliability import drop_append_only


def _assert_clean(report: SoakReport, kills: int) -> None:
    assert report.failures == []
    assert report.kills == kills
    assert all(report.kills_by_mode[mode] >= 1 for mode in MODES)
    assert report.acked_events > 0
    assert (report.lost, report.duplicated, report.gaps, report.version_breaks) == (0, 0, 0, 0)
    assert report.verify_failures == report.probe_failures == 0


def test_killed_sqlite_appenders_lose_nothing_acknowledged(tmp_path: Path) -> None:
    report = run_soak(
        sqlite_targets(tmp_path), backend="sqlite", kills=8, rotate=4, seed=1, workdir=tmp_path
    )
    _assert_clean(report, 8)


@pytest.mark.postgres
def test_killed_postgresql_appenders_lose_nothing_acknowledged(
    fresh_postgres_url: str, tmp_path: Path
) -> None:
    report = run_soak(
        postgres_targets(fresh_postgres_url),
        backend="postgresql",
        kills=4,
        rotate=4,
        seed=2,
        workdir=tmp_path,
    )
    _assert_clean(report, 4)


def test_the_check_reports_a_lost_acknowledgement_a_gap_and_a_broken_chain(
    tmp_path: Path,
) -> None:
    """The harness's own check must see what it is there to see."""
    target = str(tmp_path / "log.db")
    kept, removed = uuid.uuid4(), uuid.uuid4()
    with EventLog.open(target) as log:
        log.append("s", [Proposed(SoakNote(writer="t", n=0), kept)])
        log.append("s", [Proposed(SoakNote(writer="t", n=1), removed)])
    with sqlite3.connect(target) as conn:
        drop_append_only(conn)
        conn.execute("DELETE FROM events WHERE seq = 1")
    conn.close()
    report = SoakReport(backend="sqlite")
    _check(target, {kept, removed}, report, "here")
    assert (report.lost, report.gaps, report.verify_failures) == (1, 1, 1)
    assert report.version_breaks == 1  # stream s starts at version 1
    assert "here: lost x1" in report.failures
