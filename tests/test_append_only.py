"""Append-only enforced by the database: triggers refuse UPDATE and DELETE of records for
everyone (migration 0003, also applied to existing logs), and on PostgreSQL a writer role may
only INSERT/SELECT and an auditor only SELECT (`eventlog db grant`)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result
from psycopg import errors as pg_errors

from eventlog import EventLog
from eventlog.cli.main import main
from eventlog.errors import StorageError, StorageIntegrityError
from eventlog.log import resolve_url
from eventlog.store.errors import translate
from tests.cli.helpers import HEAD_REVISION
from tests.reliability import libpq_url
from tests.vocabulary import LogNote

CHANGES = [
    "UPDATE events SET payload = payload WHERE seq = 2",
    "UPDATE events SET stream = 'other'",
    "DELETE FROM events WHERE seq = 3",
    "DELETE FROM events",
]


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _filled(target: str) -> list[bytes]:
    with EventLog.open(target) as log:
        log.append("s", [LogNote(text=f"n{i}", n=i) for i in range(4)])
    return _chains(target)


def _chains(target: str) -> list[bytes]:
    engine = sa.create_engine(resolve_url(target))
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT chain FROM events ORDER BY seq").all()
    engine.dispose()
    return [bytes(row[0]) for row in rows]


def _try(target: str, statement: str) -> BaseException | None:
    """Run one statement as the log's owner; the error it raised, if any (rolled back)."""
    engine = sa.create_engine(resolve_url(target))
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(statement)
    except sa.exc.DBAPIError as exc:
        return exc
    finally:
        engine.dispose()
    return None


@pytest.mark.parametrize("statement", CHANGES)
def test_update_and_delete_of_records_are_refused_by_the_database(
    log_target: str, statement: str
) -> None:
    before = _filled(log_target)
    error = _try(log_target, statement)
    assert error is not None, f"{statement!r} was allowed"
    typed = translate(error, "log")
    assert isinstance(typed, StorageIntegrityError)
    assert "records are append-only" in str(typed)
    assert _chains(log_target) == before
    assert cli("verify", log_target).exit_code == 0


@pytest.mark.postgres
def test_truncate_is_refused_on_postgresql(fresh_postgres_url: str) -> None:
    before = _filled(fresh_postgres_url)
    error = _try(fresh_postgres_url, "TRUNCATE events")
    assert isinstance(translate(error or Exception(), "log"), StorageIntegrityError)
    assert _chains(fresh_postgres_url) == before


def test_appending_still_works_under_the_triggers(log_target: str) -> None:
    _filled(log_target)
    with EventLog.open(log_target) as log:
        assert log.append("s", [LogNote(text="more")]).seqs == [5]
        assert log.verify().ok


def test_an_existing_0002_log_is_upgraded_to_append_only(log_target: str) -> None:
    before = _filled(log_target)
    downgraded = cli("db", "downgrade", log_target, "0002")
    assert downgraded.exit_code == 0, downgraded.output
    # At 0002 nothing stopped a rewrite: that is what the upgrade changes.
    assert _try(log_target, "UPDATE events SET payload = payload WHERE seq = 2") is None
    upgraded = cli("db", "upgrade", log_target)
    assert upgraded.exit_code == 0, upgraded.output
    assert upgraded.stdout.strip().endswith(f"upgraded 0002 -> {HEAD_REVISION}")
    assert _try(log_target, "DELETE FROM events WHERE seq = 4") is not None
    assert _chains(log_target) == before
    assert cli("verify", log_target).exit_code == 0


# -- PostgreSQL roles --------------------------------------------------------------------


def _as(url: str, role: str) -> str:
    return resolve_url(url).set(username=role).render_as_string(hide_password=False)


def _refused_privilege(url: str, statement: str) -> bool:
    """True when `statement` fails for lack of privilege (not merely by a trigger)."""
    with psycopg.connect(libpq_url(url)) as conn:
        try:
            conn.execute(statement)
        except pg_errors.InsufficientPrivilege:
            return True
        except psycopg.Error:
            return False
        return False


@pytest.fixture
def granted(fresh_postgres_url: str) -> str:
    _filled(fresh_postgres_url)
    result = cli("db", "grant", fresh_postgres_url, "--writer", "el_writer", "--auditor", "el_aud")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].startswith("el_writer: SELECT, INSERT on events;")
    return fresh_postgres_url


WRITES = {
    "update": "UPDATE events SET payload = payload WHERE seq = 1",
    "delete": "DELETE FROM events WHERE seq = 1",
    "truncate": "TRUNCATE events",
    "drop the trigger": "ALTER TABLE events DISABLE TRIGGER USER",
    "meta": "UPDATE log_meta SET value = 'x'",
}


@pytest.mark.postgres
@pytest.mark.parametrize("what", list(WRITES))
def test_the_writer_role_cannot_change_or_remove_records(granted: str, what: str) -> None:
    assert _refused_privilege(_as(granted, "el_writer"), WRITES[what])


@pytest.mark.postgres
@pytest.mark.parametrize("what", [*WRITES, "insert"])
def test_the_auditor_role_cannot_write_at_all(granted: str, what: str) -> None:
    statement = WRITES.get(what) or (
        "INSERT INTO events SELECT seq + 100, stream, version, event_id, type, schema, "
        "recorded_at, payload, chain FROM events WHERE seq = 1"
    )
    assert _refused_privilege(_as(granted, "el_aud"), statement)


@pytest.mark.postgres
def test_the_writer_appends_and_the_auditor_verifies(granted: str) -> None:
    with EventLog.open(_as(granted, "el_writer")) as log:
        assert log.append("w", [LogNote(text="by the writer")]).seqs == [5]
        log.save_snapshot("p", 5, b"state")
    assert cli("verify", _as(granted, "el_aud")).exit_code == 0
    with EventLog.open(_as(granted, "el_aud")) as log, pytest.raises(StorageError):
        log.append("a", [LogNote(text="by the auditor")])
    assert cli("verify", granted).stdout.startswith("ok: 5 records")


@pytest.mark.postgres
def test_granting_again_is_the_same_as_granting_once(granted: str) -> None:
    assert cli("db", "grant", granted, "--writer", "el_writer").exit_code == 0
    assert _refused_privilege(_as(granted, "el_writer"), WRITES["delete"])
    with EventLog.open(_as(granted, "el_writer")) as log:
        log.append("w", [LogNote(text="still")])


@pytest.mark.postgres
def test_grant_refuses_the_owner_and_one_role_for_both(granted: str) -> None:
    owner = cli("db", "grant", granted, "--writer", "postgres")
    assert owner.exit_code == 2
    assert "owns the log or is a superuser" in owner.stderr
    same = cli("db", "grant", granted, "--writer", "r", "--auditor", "r")
    assert same.exit_code == 2


@pytest.mark.parametrize("name", ["public", "none", "pg_monitor"])
def test_grant_refuses_a_name_postgresql_keeps_for_itself(name: str) -> None:
    """Named before connecting (`public` was exit 6: a database error creating the role)."""
    result = cli("db", "grant", "postgresql://u@127.0.0.1:1/db", "--writer", name)
    assert result.exit_code == 2
    assert f"--writer {name!r}: PostgreSQL reserves this role name" in result.stderr


def test_grant_on_sqlite_is_a_usage_error(tmp_path: Path) -> None:
    target = str(tmp_path / "log.db")
    EventLog.open(target).close()
    result = cli("db", "grant", target, "--writer", "w")
    assert result.exit_code == 2
    assert "roles exist on PostgreSQL only" in result.stderr
