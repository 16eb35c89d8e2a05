"""The session's PostgreSQL server answers, and each test gets a database of its own."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy.engine import make_url

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def _connect(url: str) -> psycopg.Connection[tuple[object, ...]]:
    parsed = make_url(url)
    return psycopg.connect(
        host=parsed.host,
        port=parsed.port,
        user=parsed.username,
        dbname=parsed.database,
        autocommit=True,
    )


def test_postgres_url_points_at_a_server_that_answers_select_1(postgres_url: str) -> None:
    assert make_url(postgres_url).drivername == "postgresql+psycopg"
    with _connect(postgres_url) as conn:
        row = conn.execute("select 1").fetchone()
        version = conn.execute("show server_version_num").fetchone()
    assert row == (1,)
    assert version is not None and int(str(version[0])) >= 150000


def test_fresh_postgres_url_is_an_empty_database_of_its_own(
    postgres_url: str, fresh_postgres_url: str
) -> None:
    assert make_url(fresh_postgres_url).database != make_url(postgres_url).database
    with _connect(fresh_postgres_url) as conn:
        tables = conn.execute(
            "select count(*) from information_schema.tables where table_schema = 'public'"
        ).fetchone()
        conn.execute("create table leak_probe (x int)")
    assert tables == (0,)


def test_fresh_postgres_url_does_not_see_tables_of_an_earlier_test(
    fresh_postgres_url: str,
) -> None:
    with _connect(fresh_postgres_url) as conn:
        found = conn.execute("select to_regclass('public.leak_probe') is not null").fetchone()
    assert found == (False,)
