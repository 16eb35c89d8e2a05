"""`eventlog runs`: the runs of one PostgreSQL database with head, last checkpoint and state;
`--run` / EVENTLOG_RUN / `?run=` select one, and its commands see that run's records only."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from eventlog import EventLog
from eventlog.cli.main import main
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.recovery.ledger import RecoveryLedger
from tests.cli.helpers import cli, json_lines
from tests.fixtures.ledger import Harness
from tests.test_readonly_commands import TARGETS
from tests.vocabulary import LogNote


def _ledger_run(url: str, tmp_path: Path) -> None:
    """Run `a`: a group trained, checkpoint 1, a crash and a restore to it."""
    log = EventLog.open(url, run="a")
    plane = InMemoryDataPlane()
    ledger = RecoveryLedger.open(log, plane)
    h = Harness(path=tmp_path / "a", log=log, data_plane=plane, ledger=ledger)
    try:
        h.reserve("g1", n=1)
        h.dispatch("g1")
        h.seal("g1", 0)
        h.checkpoint(1)
        h.reserve("g2", n=1)  # rolled back by the restore
        h.ledger = RecoveryLedger(h.log, InMemoryDataPlane())  # a new controller process
        h.run(lambda cut: h.ledger.restore(cut, h.dataset), kind="recovery_restore")
    finally:
        log.close()


@pytest.mark.postgres
def test_runs_lists_each_run_with_head_last_checkpoint_and_state(
    fresh_postgres_url: str, tmp_path: Path
) -> None:
    _ledger_run(fresh_postgres_url, tmp_path)
    with EventLog.open(fresh_postgres_url, run="b") as b:
        b.append("notes", [LogNote(text="b1"), LogNote(text="b2")])
    EventLog.open(fresh_postgres_url).close()
    rows = {row["run"]: row for row in json_lines(cli("runs", fresh_postgres_url, "--json").stdout)}
    assert list(rows) == ["default", "a", "b"]
    assert rows["default"]["head"] == 0 and rows["default"]["state"] == "empty"
    assert rows["b"]["head"] == 2 and rows["b"]["state"] == "no controller records"
    assert rows["a"]["last_checkpoint"].startswith("step 1 (seq ")
    assert rows["a"]["state"] == "restored to step 1"
    assert rows["a"]["log"] == "ok" and rows["a"]["head"] > 5
    table = cli("runs", fresh_postgres_url).stdout
    assert "restored to step 1" in table and "last checkpoint" in table


@pytest.mark.postgres
def test_a_selected_runs_commands_see_its_records_only(fresh_postgres_url: str) -> None:
    with (
        EventLog.open(fresh_postgres_url, run="a") as a,
        EventLog.open(fresh_postgres_url, run="b") as b,
    ):
        a.append("notes", [LogNote(text="in a")])
        b.append("notes", [LogNote(text="in b"), LogNote(text="in b too")])
    env = {"EVENTLOG_RUN": "b"}
    runner = CliRunner()
    by_env = runner.invoke(main, ["replay", fresh_postgres_url, "--json"], env=env)
    by_option = cli("--run", "a", "replay", fresh_postgres_url, "--json")
    by_url = cli("replay", fresh_postgres_url + "?run=a", "--json")
    assert [r["data"]["text"] for r in json_lines(by_env.stdout)] == ["in b", "in b too"]
    assert [r["data"]["text"] for r in json_lines(by_option.stdout)] == ["in a"]
    assert by_url.stdout == by_option.stdout
    appended = runner.invoke(
        main,
        ["--run", "a", "append", fresh_postgres_url],
        input=json.dumps({"stream": "notes", "type": "LogNote", "data": {"text": "cli"}}) + "\n",
    )
    assert appended.exit_code == 0, appended.output
    with EventLog.open(fresh_postgres_url, run="b") as b:
        assert b.head() == 2  # run a's append never reached run b
    info = json.loads(cli("--run", "a", "info", fresh_postgres_url, "--json").stdout)
    assert info["head"] == 2 and info["target"].endswith("?run=a")


@pytest.mark.postgres
def test_a_run_is_created_and_upgraded_by_name(fresh_postgres_url: str) -> None:
    done = cli("--run", "fresh", "db", "upgrade", fresh_postgres_url)
    assert done.exit_code == 0 and "upgraded (empty) ->" in done.stdout
    assert [r["run"] for r in json_lines(cli("runs", fresh_postgres_url, "--json").stdout)] == [
        "fresh"
    ]
    missing = CliRunner().invoke(main, ["--run", "nope", "info", fresh_postgres_url])
    assert missing.exit_code == 3 and "no eventlog log here" in missing.output


def test_runs_of_an_sqlite_file_is_the_file_and_a_run_name_is_refused(log_file: str) -> None:
    with EventLog.open(log_file) as log:
        log.append("notes", [LogNote(text="x")])
    rows = json_lines(cli("runs", log_file, "--json").stdout)
    assert [(r["run"], r["head"], r["state"]) for r in rows] == [
        ("default", 1, "no controller records")
    ]
    for command, target in itertools.product(("info", "runs"), (log_file, f"sqlite:///{log_file}")):
        refused = CliRunner().invoke(main, ["--run", "a", command, target])  # `runs` ignored it
        assert refused.exit_code == 2 and "each run is a file of its own" in refused.output
        assert "Traceback" not in refused.output


@pytest.mark.postgres
def test_runs_names_a_run_that_needs_an_upgrade_and_upgrading_it_by_name_fixes_it(
    fresh_postgres_url: str,
) -> None:
    assert cli("runs", fresh_postgres_url).stdout.startswith(f"{fresh_postgres_url}: no runs")
    old = cli("--run", "old", "db", "upgrade", fresh_postgres_url, "--revision", "0003")
    assert old.exit_code == 0, old.output
    (row,) = json_lines(cli("runs", fresh_postgres_url, "--json").stdout)
    assert row == {"run": "old", "log": "needs `eventlog db upgrade` (revision 0003)"}
    assert cli("--run", "old", "db", "upgrade", fresh_postgres_url).exit_code == 0
    (row,) = json_lines(cli("runs", fresh_postgres_url, "--json").stdout)
    assert (row["log"], row["head"], row["state"]) == ("ok", 0, "empty")


@pytest.mark.postgres
def test_a_run_no_eventlog_here_can_read_is_a_row_not_an_error_hiding_the_others(
    fresh_postgres_url: str,
) -> None:
    """A run at a newer revision made `runs` exit 3 and list nothing."""
    import sqlalchemy as sa

    from eventlog.log import resolve_url
    from eventlog.store.runs import schema_for

    for name in ("good", "newer"):
        EventLog.open(fresh_postgres_url, run=name).close()
    engine = sa.create_engine(resolve_url(fresh_postgres_url))
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"UPDATE \"{schema_for('newer')}\".alembic_version SET version_num = '0099'"
        )
    engine.dispose()
    result = cli("runs", fresh_postgres_url, "--json")
    assert result.exit_code == 0, result.output
    rows = {row["run"]: row for row in json_lines(result.stdout)}
    assert rows["good"]["log"] == "ok"
    assert "0099" in str(rows["newer"]["log"])


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        ("log", 0),
        ("empty file", 3),
        ("foreign database", 3),
        ("older revision", 0),
        ("text file", 6),
    ],
)
def test_runs_leaves_any_file_byte_for_byte_unchanged(tmp_path: Path, kind: str, code: int) -> None:
    path = tmp_path / "target.db"
    make, _ = TARGETS[kind]
    make(path)
    before = path.read_bytes()
    result = CliRunner().invoke(main, ["runs", str(path)])
    assert result.exit_code == code, result.output
    assert path.read_bytes() == before
    if kind == "older revision":
        assert "needs `eventlog db upgrade` (revision 0001)" in result.output
