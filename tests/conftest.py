"""Shared fixtures: every real engine is started once per test session by its own plugin."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlog import EventLog

pytest_plugins = [
    "tests.fixtures.postgres",
    "tests.fixtures.tq",
    "tests.fixtures.ledger",
    "tests.fixtures.vllm",
]


@pytest.fixture(
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)],
)
def log_target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty log location on each backend: an SQLite file or a new PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "log.db")
    url: str = request.getfixturevalue("fresh_postgres_url")
    return url


@pytest.fixture
def log(log_target: str) -> Iterator[EventLog]:
    """An open log at `log_target` (a module may define its own, e.g. pre-filled)."""
    with EventLog.open(log_target) as opened:
        yield opened
