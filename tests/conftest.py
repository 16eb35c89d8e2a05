"""Shared fixtures: every real engine is started once per test session by its own plugin."""

from __future__ import annotations

from pathlib import Path

import pytest

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
