"""Fixtures of the command-line tests: a fresh SQLite log, and one with seven records."""

from __future__ import annotations

from pathlib import Path

import pytest

import tests.cli_vocabulary  # noqa: F401  (registers the Cli* event types the logs hold)
from tests.cli.helpers import cli, line


@pytest.fixture
def log_file(tmp_path: Path) -> str:
    path = str(tmp_path / "run.db")
    assert cli("init", path).exit_code == 0
    return path


@pytest.fixture
def audit_log(log_file: str) -> str:
    """Seven records, one append each (so each has its own recorded_at)."""
    dispatched = {
        "group_id": "g1",
        "attempts": [{"rollout_id": "g1_g0"}, {"rollout_id": "g1_g1"}],
    }
    records = [
        line("group/g1", "CliDispatched", dispatched),
        line("attempt/g1_g0", "CliNote", {"text": "a0"}),
        line("attempt/g1_g1", "CliNote", {"text": "a1"}),
        line("group/g2", "CliNote", {"text": "other group"}),
        line("attempt/g2_g0", "CliNote", {"text": "not g1"}),
        line("controller", "CliMeasured", {"name": "m", "value": 1.0, "ok": False, "tags": []}),
        line("attempt/g1_g1", "CliNote", {"text": "a1 again"}),
    ]
    for record in records:
        assert cli("append", log_file, input=record + "\n").exit_code == 0
    return log_file


from tests.cli.audited_run import run_fixture  # noqa: E402,F401  (the `run` fixture)
