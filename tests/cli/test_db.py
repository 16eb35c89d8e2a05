"""`eventlog db`: see, upgrade and downgrade a log's schema revision."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.util.exc import CommandError

from eventlog.store import migrate
from tests.cli.helpers import HEAD_REVISION, cli, query, sql


def test_db_upgrade_creates_a_log_at_head_and_current_reports_it(tmp_path: Path) -> None:
    path = str(tmp_path / "new.db")
    upgraded = cli("db", "upgrade", path)
    assert upgraded.exit_code == 0
    assert upgraded.stdout == f"{path}: upgraded (empty) -> {HEAD_REVISION}\n"
    current = cli("db", "current", path, "--check")
    assert current.exit_code == 0
    assert current.stdout.splitlines() == [
        f"current: {HEAD_REVISION}",
        f"head:    {HEAD_REVISION}",
        "status:  up to date",
    ]
    assert cli("db", "upgrade", path).stdout == f"{path}: already at revision {HEAD_REVISION}\n"


def test_log_at_an_older_revision_is_refused_with_the_upgrade_hint(tmp_path: Path) -> None:
    path = str(tmp_path / "old.db")
    assert cli("db", "upgrade", path, "--revision", "0001").exit_code == 0

    refused = cli("replay", path)
    assert refused.exit_code == 3
    assert refused.stderr.splitlines() == [
        f"error: {path}: log is at schema revision 0001, this eventlog needs {HEAD_REVISION}",
        f"hint: run `eventlog db upgrade {path}`",
    ]
    assert refused.stdout == ""
    current = cli("db", "current", path)
    assert "current: 0001" in current.stdout
    assert f"needs upgrade; run `eventlog db upgrade {path}`" in current.stdout
    assert cli("db", "current", path, "--check").exit_code == 3

    upgraded = cli("db", "upgrade", path)
    assert upgraded.stdout == f"{path}: upgraded 0001 -> {HEAD_REVISION}\n"
    assert cli("replay", path).exit_code == 0


def test_log_at_a_newer_revision_is_refused_and_not_migrated(log_file: str) -> None:
    sql(log_file, "UPDATE alembic_version SET version_num = 'ffff_from_the_future'")

    for args in (
        ["info", log_file],
        ["db", "upgrade", log_file],
        ["db", "downgrade", log_file, "0001"],
    ):
        refused = cli(*args)
        assert refused.exit_code == 3, args
        assert refused.stderr.splitlines() == [
            f"error: {log_file}: log is at schema revision ffff_from_the_future, newer than "
            f"this eventlog knows ({HEAD_REVISION})",
            "hint: upgrade the eventlog package to open it",
        ]
    assert query(log_file, "SELECT version_num FROM alembic_version") == [("ffff_from_the_future",)]
    current = cli("db", "current", log_file)
    assert current.exit_code == 0
    assert "status:  newer than this eventlog; upgrade the eventlog package" in current.stdout


def test_db_upgrade_refuses_a_database_eventlog_did_not_make(tmp_path: Path) -> None:
    path = str(tmp_path / "foreign.db")
    sql(path, "CREATE TABLE events (id INTEGER PRIMARY KEY)")
    refused = cli("db", "upgrade", path)
    assert refused.exit_code == 3
    assert "has an events table but no alembic revision" in refused.stderr
    assert query(path, "SELECT name FROM sqlite_master WHERE name = 'alembic_version'") == []


def test_db_upgrade_adds_no_table_to_another_programs_database(tmp_path: Path) -> None:
    path = str(tmp_path / "app.db")
    sql(path, "CREATE TABLE users (id INTEGER PRIMARY KEY)")
    refused = cli("db", "upgrade", path)
    assert refused.exit_code == 3
    assert "another program's database (it holds users)" in refused.stderr
    assert query(path, "SELECT name FROM sqlite_master") == [("users",)]


def test_db_downgrade_moves_the_revision_down(log_file: str) -> None:
    result = cli("db", "downgrade", log_file, "0001")
    assert result.exit_code == 0
    assert result.stdout == f"{log_file}: downgraded {HEAD_REVISION} -> 0001\n"
    assert query(log_file, "SELECT version_num FROM alembic_version") == [("0001",)]


def test_db_downgrade_takes_a_relative_step_without_a_double_dash(log_file: str) -> None:
    """`-1` was read as an unknown option: only `db downgrade LOG -- -1` worked."""
    result = cli("db", "downgrade", log_file, "-1")
    assert result.exit_code == 0, result.output
    below = f"{int(str(HEAD_REVISION)) - 1:04d}"
    assert result.stdout == f"{log_file}: downgraded {HEAD_REVISION} -> {below}\n"


@pytest.mark.parametrize(
    ("revision", "names"),
    [("0001", "0001"), ("head-1", "0003"), ("base+1", "0001"), ("-1", "0003")],
)
def test_an_upgrade_to_an_earlier_revision_is_refused_not_called_done(
    log_file: str, revision: str, names: str
) -> None:
    """alembic upgrades to an earlier revision by doing nothing: it said 'already at 0004'
    (exit 0) to someone who asked for 0001, or for head-1."""
    refused = cli("db", "upgrade", log_file, "--revision", revision)
    assert refused.exit_code == 3
    named = "" if names == revision else f"that is revision {names}, and "
    assert refused.stderr.splitlines() == [
        f"error: {log_file}: cannot upgrade to {revision!r}: {named}the log is at "
        f"{HEAD_REVISION}, past it; an upgrade only moves forward",
        f"hint: to move back, `eventlog db downgrade {log_file} {names}`",
    ]
    assert query(log_file, "SELECT version_num FROM alembic_version") == [(HEAD_REVISION,)]
    again = cli("db", "upgrade", log_file, "--revision", str(HEAD_REVISION))
    assert again.stdout == f"{log_file}: already at revision {HEAD_REVISION}\n"


def test_an_upgrade_to_base_hints_at_no_command_that_drops_the_log(log_file: str) -> None:
    refused = cli("db", "upgrade", log_file, "--revision", "base")
    assert refused.exit_code == 3
    assert refused.stderr.splitlines()[1] == (
        "hint: base is no schema at all: a downgrade to it drops the log, every record"
    )


def test_a_step_of_more_digits_than_int_takes_is_no_such_revision(log_file: str) -> None:
    """It was exit 70 (int() refuses 4,300 digits and more), in alembic or in ours."""
    steps = "9" * 5000
    for args in (
        ["upgrade", log_file, f"--revision=+{steps}"],
        ["downgrade", log_file, f"-{steps}"],
    ):
        refused = cli("db", *args)
        assert refused.exit_code == 3, refused.output
        assert refused.stderr.endswith(": no such revision\n")


def test_a_log_whose_name_starts_with_a_dash_downgrades_after_a_double_dash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli("init", "./-x.db").exit_code == 0
    result = cli("db", "downgrade", "--", "-x.db", "0003")
    assert result.exit_code == 0, result.output
    assert query(str(tmp_path / "-x.db"), "SELECT version_num FROM alembic_version") == [("0003",)]


@pytest.mark.parametrize("args", [["{log}", "--bogus"], ["--bogus", "{log}"]])
def test_db_downgrade_takes_no_unknown_option_for_an_argument(
    log_file: str, args: list[str]
) -> None:
    """Taking -1 as REVISION must not take every unknown option as an argument."""
    refused = cli("db", "downgrade", *(a.format(log=log_file) for a in args))
    assert refused.exit_code == 2 and "No such option '--bogus'" in refused.output
    assert query(log_file, "SELECT version_num FROM alembic_version") == [(HEAD_REVISION,)]


def test_an_empty_revision_is_a_usage_error_naming_it(log_file: str) -> None:
    for args, named in (
        (["db", "upgrade", log_file, "--revision", ""], "--revision ''"),
        (["db", "downgrade", log_file, ""], "REVISION ''"),
        (["db", "downgrade", log_file, "0001@"], "REVISION '0001@'"),
    ):
        refused = cli(*args)
        assert refused.exit_code == 2, args
        assert refused.stderr.splitlines() == [
            f"error: {named}: empty revision; expected a revision id such as 0001, head, "
            "base, or a relative step such as +1 or -1"
        ]
    assert query(log_file, "SELECT version_num FROM alembic_version") == [(HEAD_REVISION,)]


def test_a_step_past_the_last_revision_is_a_revision_error_not_a_crash(log_file: str) -> None:
    refused = cli("db", "upgrade", log_file, "--revision", "head+1")
    assert refused.exit_code == 3
    assert refused.stderr == f"error: {log_file}: cannot upgrade to 'head+1': no such revision\n"
    assert query(log_file, "SELECT version_num FROM alembic_version") == [(HEAD_REVISION,)]


@pytest.mark.parametrize("revision", ["base-1", " -1", "zz-1", "x@0002"])
@pytest.mark.parametrize("direction", ["upgrade", "downgrade"])
@pytest.mark.parametrize("at", [HEAD_REVISION, "0002"])
def test_a_revision_that_names_none_is_no_such_revision_either_way(
    log_file: str, direction: str, revision: str, at: str
) -> None:
    """alembic did nothing for some of these at head (and we said "already at 0004") and
    migrated for others below it (' -1' went to head-1, base-1 to head)."""
    if at != HEAD_REVISION:
        assert cli("db", "downgrade", log_file, at).exit_code == 0
    args = ["--revision", revision] if direction == "upgrade" else ["--", revision]
    refused = cli("db", direction, log_file, *args)
    assert refused.exit_code == 3, refused.output
    assert refused.stderr == (
        f"error: {log_file}: cannot {direction} to {revision!r}: no such revision\n"
    )
    assert query(log_file, "SELECT version_num FROM alembic_version") == [(at,)]


@pytest.mark.parametrize("revision", ["base-1", " -1", "@-1"])
def test_a_new_log_is_not_made_at_a_revision_that_names_none(tmp_path: Path, revision: str) -> None:
    """From no schema, base-1 made the log at head, ' -1' at head-1, and @-1 said "already
    at revision None"."""
    path = str(tmp_path / "new.db")
    refused = cli("db", "upgrade", path, "--revision", revision)
    assert refused.exit_code == 3, refused.output
    assert refused.stderr.endswith(": no such revision\n")
    assert list(tmp_path.iterdir()) == []  # not even an empty file, taken for a log later


def test_a_downgrade_one_step_back_from_the_current_revision_moves_there(
    log_file: str,
) -> None:
    """`@-1` named the revision for our check, but alembic was handed the text and could
    not read it (Can't locate revision identified by '-1')."""
    below = f"{int(str(HEAD_REVISION)) - 1:04d}"
    moved = cli("db", "downgrade", log_file, "@-1")
    assert moved.exit_code == 0, moved.output
    assert moved.stdout == f"{log_file}: downgraded {HEAD_REVISION} -> {below}\n"


def test_a_migration_to_no_schema_from_none_says_empty(tmp_path: Path) -> None:
    """It said "already at revision None"."""
    path = str(tmp_path / "new.db")
    stayed = cli("db", "upgrade", path, "--revision", "base")
    assert stayed.exit_code == 0, stayed.output
    assert stayed.stdout == f"{path}: already at revision (empty)\n"
    assert list(tmp_path.iterdir()) == []  # alembic's version table made a file of it


def test_a_refused_upgrade_keeps_a_log_another_process_made_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file was new when the upgrade began; a log there now is someone else's."""
    path = str(tmp_path / "new.db")

    def made_elsewhere_then_refused(*args: object, **kwargs: object) -> None:
        assert cli("init", path).exit_code == 0
        raise CommandError("refused")

    monkeypatch.setattr(migrate, "move", made_elsewhere_then_refused)
    assert cli("db", "upgrade", path).exit_code == 3
    assert query(path, "SELECT count(*) FROM events") == [(0,)]


def test_an_upgrade_one_step_back_from_the_current_revision_is_refused(log_file: str) -> None:
    """`@-1` is the current revision less one: alembic did nothing for it."""
    refused = cli("db", "upgrade", log_file, "--revision", "@-1")
    assert refused.exit_code == 3
    below = f"{int(str(HEAD_REVISION)) - 1:04d}"
    assert f"that is revision {below}, and the log is at {HEAD_REVISION}, past it" in (
        refused.stderr
    )


@pytest.mark.parametrize(("revision", "names"), [("head", HEAD_REVISION), ("+1", "0003")])
def test_a_downgrade_to_a_later_revision_is_refused_with_the_upgrade_hint(
    log_file: str, revision: str, names: str
) -> None:
    """alembic downgrades to a later revision by doing nothing."""
    assert cli("db", "downgrade", log_file, "0002").exit_code == 0
    refused = cli("db", "downgrade", log_file, revision)
    assert refused.exit_code == 3
    assert refused.stderr.splitlines() == [
        f"error: {log_file}: cannot downgrade to {revision!r}: that is revision {names}, and "
        "the log is at 0002, before it; a downgrade only moves back",
        f"hint: to move forward, `eventlog db upgrade {log_file} --revision {names}`",
    ]
    assert query(log_file, "SELECT version_num FROM alembic_version") == [("0002",)]


def test_a_downgrade_to_the_current_revision_says_so(log_file: str) -> None:
    """It printed "downgraded 0004 -> 0004"."""
    stayed = cli("db", "downgrade", log_file, "head")
    assert stayed.exit_code == 0
    assert stayed.stdout == f"{log_file}: already at revision {HEAD_REVISION}\n"


def test_a_revision_table_of_two_rows_is_a_revision_error(log_file: str) -> None:
    """alembic's "more than one head" was exit 70, in verify too."""
    sql(log_file, "INSERT INTO alembic_version VALUES ('0001')")
    for argv in (["db", "current", log_file], ["verify", log_file]):
        result = cli(*argv)
        assert result.exit_code == 3, result.output
        assert f"error: {log_file}: the schema revision cannot be read" in result.stderr


def test_a_migration_of_a_revision_table_of_two_rows_is_a_revision_error(log_file: str) -> None:
    """alembic's refusal of a revision table it cannot read (its CommandError, raised as
    `move` reads the current revision) is ours, naming the log and the revision."""
    sql(log_file, "INSERT INTO alembic_version VALUES ('0001')")
    for argv, revision in (([], "head"), (["0002"], "0002")):
        direction = "downgrade" if argv else "upgrade"
        result = cli("db", direction, log_file, *argv)
        assert result.exit_code == 3, result.output
        assert result.stderr.startswith(
            f"error: {log_file}: cannot {direction} to {revision!r}: Version table"
        )


def test_a_step_from_a_revision_s_branch_is_a_step_from_the_current_one(log_file: str) -> None:
    """`REV@+1` (alembic's steps within REV's branch: here the only one) went to the next
    revision before we resolved revisions ourselves, and must still."""
    assert cli("db", "downgrade", log_file, "0002").exit_code == 0
    moved = cli("db", "upgrade", log_file, "--revision", "0002@+1")
    assert moved.exit_code == 0, moved.output
    assert moved.stdout == f"{log_file}: upgraded 0002 -> 0003\n"
    refused = cli("db", "upgrade", log_file, "--revision", "x@+1")  # no branch x
    assert refused.stderr.endswith(": no such revision\n")
