"""The `eventlog` command line: what a person or a script sees (output and exit codes).

Most tests drive the click group in-process (CliRunner); the last ones run the installed
`eventlog` entry point as a real subprocess. Logs are SQLite files in tmp_path; tampering
and foreign revisions are made with raw sqlite3, the way an attacker or an old tool would.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
from alembic.script import ScriptDirectory
from click.testing import CliRunner, Result

from eventlog import EventLog
from eventlog.chain import link
from eventlog.cli.exits import exit_code_for
from eventlog.cli.main import SUBCOMMANDS, main
from eventlog.cli.times import format_ns, parse_time
from eventlog.errors import (
    ConcurrencyError,
    DuplicateEventError,
    EventLogError,
    FutureSchemaError,
    IntegrityError,
    InvalidEventError,
    LogRevisionError,
    UnknownEventTypeError,
)
from eventlog.recovery.errors import ConfigError, LedgerRuleError
from eventlog.store import migrate
from tests.cli_vocabulary import CliAttempt, CliDispatched, CliMeasured, CliNote, CliRef
from tests.reliability import drop_append_only

REPO = Path(__file__).resolve().parents[1]
EVENTLOG = Path(sys.executable).with_name("eventlog")
HEAD_REVISION = ScriptDirectory(str(migrate.migrations_dir())).get_current_head()
REPLAY_KEYS = ["seq", "stream", "version", "event_id", "type", "recorded_at", "data"]
ISO_NS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z$")


def cli(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def line(stream: str, type_name: str, data: dict[str, Any], **extra: Any) -> str:
    return json.dumps({"stream": stream, "type": type_name, "data": data, **extra})


def lines(*items: str) -> str:
    return "\n".join(items) + "\n"


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(item) for item in text.splitlines()]


def sql(path: str, *statements: str | tuple[str, tuple[Any, ...]]) -> None:
    with sqlite3.connect(path) as conn:
        drop_append_only(conn)  # as anyone tampering with the file would first
        for statement in statements:
            if isinstance(statement, tuple):
                conn.execute(*statement)
            else:
                conn.execute(statement)
    conn.close()


def query(path: str, text: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(text).fetchall()
    conn.close()
    return rows


def count(path: str) -> int:
    return int(query(path, "SELECT count(*) FROM events")[0][0])


def insert_raw(path: str, stream: str, type_name: str, schema: int, data: dict[str, Any]) -> int:
    """Append a record by hand with a correct chain value (as a newer program would)."""
    head, previous = query(path, "SELECT seq, chain FROM events ORDER BY seq DESC LIMIT 1")[0]
    seq, event_id, recorded_at = head + 1, uuid.uuid4().bytes, 1_800_000_000_123_456_789
    payload = msgspec.msgpack.encode({"type": type_name, **data})
    chain = link(previous, seq, stream, 0, event_id, type_name, schema, recorded_at, payload)
    sql(
        path,
        (
            "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (seq, stream, 0, event_id, type_name, schema, recorded_at, payload, chain),
        ),
    )
    return int(seq)


@pytest.fixture
def log_file(tmp_path: Path) -> str:
    path = str(tmp_path / "run.db")
    assert cli("init", path).exit_code == 0
    return path


def append_notes(path: str, count_: int, stream: str = "s") -> None:
    text = lines(*(line(stream, "CliNote", {"text": f"n{i}", "n": i}) for i in range(count_)))
    assert cli("append", path, input=text).exit_code == 0


# -- schema revisions -----------------------------------------------------------------------


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


def test_db_downgrade_moves_the_revision_down(log_file: str) -> None:
    result = cli("db", "downgrade", log_file, "0001")
    assert result.exit_code == 0
    assert result.stdout == f"{log_file}: downgraded {HEAD_REVISION} -> 0001\n"
    assert query(log_file, "SELECT version_num FROM alembic_version") == [("0001",)]


# -- init, info, missing targets ------------------------------------------------------------


def test_init_prints_the_log_id_and_a_second_init_keeps_it(tmp_path: Path) -> None:
    path = str(tmp_path / "run.db")
    first = cli("init", path)
    assert first.exit_code == 0
    log_id = first.stdout.strip()
    assert uuid.UUID(log_id)
    assert query(path, "SELECT value FROM log_meta WHERE key = 'log_id'") == [(log_id,)]
    append_notes(path, 2)
    again = cli("init", path)
    assert again.stdout.strip() == log_id
    assert "2 records" in again.stderr
    assert count(path) == 2


def test_init_refuses_a_folder_that_does_not_exist(tmp_path: Path) -> None:
    result = cli("init", str(tmp_path / "nope" / "run.db"))
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and "does not exist" in result.stderr


@pytest.mark.parametrize("command", ["replay", "verify", "info", "stats", "tail", "append"])
def test_commands_refuse_a_missing_file_without_creating_it(tmp_path: Path, command: str) -> None:
    path = tmp_path / "missing.db"
    result = cli(command, str(path), input="")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"error: {path}: no such file",
        f"hint: create a log with `eventlog init {path}`",
    ]
    assert not path.exists()


def test_info_reports_id_revision_head_and_chain(log_file: str) -> None:
    append_notes(log_file, 3)
    shown = json.loads(cli("info", log_file, "--json").stdout)
    seq, chain = query(log_file, "SELECT seq, chain FROM events ORDER BY seq DESC LIMIT 1")[0]
    (log_id,) = query(log_file, "SELECT value FROM log_meta WHERE key = 'log_id'")[0]
    assert shown["log_id"] == log_id
    assert shown["revision"] == HEAD_REVISION
    assert shown["backend"] == "sqlite"
    assert shown["hash_algorithm"] == "sha256"
    assert (shown["head"], shown["chain"]) == (seq, chain.hex()) == (3, chain.hex())
    assert ISO_NS.match(shown["created"])
    human = cli("info", log_file).stdout
    assert f"chain:          {chain.hex()}" in human.splitlines()


# -- append ---------------------------------------------------------------------------------


def test_append_then_replay_json_round_trips_every_field(log_file: str) -> None:
    trace, chosen = uuid.uuid4(), uuid.uuid4()
    measured = {
        "name": "loss",
        "value": 0.25,
        "ok": True,
        "tags": ["a", "b"],
        "ref": {"name": "r", "weight": 1.5},
        "trace_id": str(trace),
    }
    text = lines(
        line("group/g1", "CliNote", {"text": "héllo", "n": 3}, expected_version="no_stream"),
        line("group/g1", "CliMeasured", measured, expected_version=0, event_id=str(chosen)),
        line("controller", "CliNote", {"text": "x"}),
    )
    appended = cli("append", log_file, "--json", input=text)
    assert appended.exit_code == 0, appended.stderr
    positions = json_lines(appended.stdout)
    ids = [p.pop("event_id") for p in positions]
    assert positions == [
        {"seq": 1, "stream": "group/g1", "version": 0, "type": "CliNote"},
        {"seq": 2, "stream": "group/g1", "version": 1, "type": "CliMeasured"},
        {"seq": 3, "stream": "controller", "version": 0, "type": "CliNote"},
    ]
    assert ids[1] == str(chosen)

    replayed = json_lines(cli("replay", log_file, "--json").stdout)
    assert [list(obj) for obj in replayed] == [REPLAY_KEYS] * 3
    stored = [row[0] for row in query(log_file, "SELECT recorded_at FROM events ORDER BY seq")]
    for obj, ns in zip(replayed, stored, strict=True):
        assert ISO_NS.match(obj["recorded_at"])
        assert obj.pop("recorded_at") == format_ns(ns)
        assert format_ns(ns).startswith(
            datetime.fromtimestamp(ns // 10**9, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        )
    assert replayed == [
        {
            "seq": 1,
            "stream": "group/g1",
            "version": 0,
            "event_id": ids[0],
            "type": "CliNote",
            "data": {"text": "héllo", "n": 3},
        },
        {
            "seq": 2,
            "stream": "group/g1",
            "version": 1,
            "event_id": str(chosen),
            "type": "CliMeasured",
            "data": measured,
        },
        {
            "seq": 3,
            "stream": "controller",
            "version": 0,
            "event_id": ids[2],
            "type": "CliNote",
            "data": {"text": "x", "n": 0},
        },
    ]
    with EventLog.open(log_file) as log:
        assert [record.event for record in log.read()] == [
            CliNote(text="héllo", n=3),
            CliMeasured(
                name="loss",
                value=0.25,
                ok=True,
                tags=["a", "b"],
                ref=CliRef(name="r", weight=1.5),
                trace_id=trace,
            ),
            CliNote(text="x"),
        ]


def test_append_prints_one_line_per_event_with_seq_stream_and_version(log_file: str) -> None:
    result = cli("append", log_file, input=lines(line("s", "CliNote", {"text": "a"})) * 2)
    rows = [row.split("\t") for row in result.stdout.splitlines()]
    assert [row[:4] for row in rows] == [["1", "s", "v0", "CliNote"], ["2", "s", "v1", "CliNote"]]


GOOD = line("s", "CliNote", {"text": "fine"})


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ('{"stream": "s", "type": "CliNote",', "line 2: invalid JSON: Input data was truncated"),
        ('{"stream": "s", "type": "CliNote"} x', "line 2: invalid JSON: JSON is malformed"),
        (
            line("s", "CliNote", {"text": 5}),
            "line 2: CliNote: Expected `str`, got `int` - at `data.text`",
        ),
        (
            line("s", "CliNote", {}),
            "line 2: CliNote: Object missing required field `text` - at `data`",
        ),
        (line("s", "CliNote", {"text": "a", "nn": 1}), "line 2: CliNote has no field 'nn'"),
        (line("s", "CliNoet", {"text": "a"}), "line 2: unknown event type 'CliNoet'"),
        (line("", "CliNote", {"text": "a"}), "line 2: stream must not be empty"),
        (
            line("s", "CliNote", {"text": "a"}, expected_version="latest"),
            "line 2: Invalid enum value 'latest' - at `$.expected_version`",
        ),
        (
            line("s", "CliNote", {"text": "a"}, expected_version=-1),
            "line 2: expected_version must be >= 0, found -1",
        ),
        (
            line("s", "CliNote", {"text": "a"}, event_id="not-a-uuid"),
            "line 2: Invalid UUID - at `$.event_id`",
        ),
        ('{"stream": "s", "typ": "CliNote"}', "line 2: Object contains unknown field `typ`"),
    ],
)
def test_a_bad_line_appends_nothing_and_names_the_line_and_field(
    log_file: str, bad: str, message: str
) -> None:
    result = cli("append", log_file, input=lines(GOOD, bad, GOOD))
    assert result.exit_code == 2
    first = result.stderr.splitlines()[0]
    assert first == f"error: {message}" or first.startswith(f"error: {message}")
    assert len(result.stderr.splitlines()) <= 2  # the error, and a hint when there is one
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert count(log_file) == 0


def test_an_unknown_type_hint_suggests_close_names(log_file: str) -> None:
    result = cli("append", log_file, input=lines(line("s", "CliNoet", {"text": "a"})))
    assert result.stderr.splitlines()[1] == "hint: did you mean CliNote?"


def test_a_version_conflict_on_any_line_appends_no_line_and_exits_4(log_file: str) -> None:
    append_notes(log_file, 1, stream="s")
    text = lines(
        line("other", "CliNote", {"text": "a"}, expected_version="no_stream"),
        line("s", "CliNote", {"text": "b"}, expected_version=5),
    )
    result = cli("append", log_file, input=text)
    assert result.exit_code == 4
    assert result.stderr == "error: stream 's': expected version 5, found version 0\n"
    assert count(log_file) == 1


def test_append_retry_with_the_same_event_ids_is_a_no_op(log_file: str) -> None:
    event_id = str(uuid.uuid4())
    text = lines(line("s", "CliNote", {"text": "once"}, event_id=event_id))
    first = cli("append", log_file, "--json", input=text)
    again = cli("append", log_file, "--json", input=text)
    assert again.exit_code == 0
    assert json_lines(again.stdout) == json_lines(first.stdout)
    assert count(log_file) == 1

    changed = lines(line("s", "CliNote", {"text": "other"}, event_id=event_id))
    conflict = cli("append", log_file, input=changed)
    assert conflict.exit_code == 4
    assert f"event id {event_id} is already stored at seq 1" in conflict.stderr
    assert count(log_file) == 1


def test_append_with_no_lines_appends_nothing(log_file: str) -> None:
    result = cli("append", log_file, input="\n\n")
    assert result.exit_code == 0
    assert result.stderr == "nothing to append\n"
    assert count(log_file) == 0


# -- verify ---------------------------------------------------------------------------------


@pytest.fixture
def six_records(log_file: str) -> str:
    append_notes(log_file, 3, stream="a")
    append_notes(log_file, 3, stream="b")
    return log_file


def test_verify_of_an_intact_log_prints_the_head_chain_and_exits_0(six_records: str) -> None:
    result = cli("verify", six_records)
    (chain,) = query(six_records, "SELECT chain FROM events WHERE seq = 6")[0]
    assert result.exit_code == 0
    assert result.stdout == f"ok: 6 records, head seq 6, chain {chain.hex()}\n"


def _swap_seqs(path: str) -> None:
    sql(
        path,
        "UPDATE events SET seq = -1 WHERE seq = 2",
        "UPDATE events SET seq = 2 WHERE seq = 5",
        "UPDATE events SET seq = 5 WHERE seq = -1",
    )


@pytest.mark.parametrize(
    ("tamper", "first_bad", "problem"),
    [
        (
            lambda p: sql(p, "UPDATE events SET payload = X'80' WHERE seq = 3"),
            3,
            "seq 3: chain: chain mismatch (record edited, removed or reordered)",
        ),
        (lambda p: sql(p, "DELETE FROM events WHERE seq = 3"), 3, "seq 3: gap: seq 3 missing"),
        (_swap_seqs, 2, "seq 2: chain: chain mismatch (record edited, removed or reordered)"),
    ],
    ids=["edited-payload", "deleted-row", "swapped-seqs"],
)
def test_verify_of_a_tampered_log_names_the_first_bad_seq_and_exits_1(
    six_records: str, tamper: Any, first_bad: int, problem: str
) -> None:
    tamper(six_records)
    result = cli("verify", six_records)
    assert result.exit_code == 1
    out = result.stdout.splitlines()
    assert out[0].startswith(f"FAILED: first bad seq {first_bad} (")
    assert problem in out[1:]
    report = json.loads(cli("verify", six_records, "--json").stdout)
    assert report["ok"] is False
    assert report["first_bad_seq"] == first_bad


def test_verify_with_an_anchor_catches_truncation_that_the_chain_alone_cannot(
    six_records: str,
) -> None:
    (chain,) = query(six_records, "SELECT chain FROM events WHERE seq = 6")[0]
    anchor = f"6:{chain.hex()}"
    assert cli("verify", six_records, "--anchor", anchor).exit_code == 0

    sql(six_records, "DELETE FROM events WHERE seq = 6")
    assert cli("verify", six_records).exit_code == 0  # a clean cut leaves a valid chain
    result = cli("verify", six_records, "--anchor", anchor)
    assert result.exit_code == 1
    assert "seq 6: anchor: seq 6 is gone (the log was truncated to 5)" in result.stdout.splitlines()


def test_verify_rejects_a_malformed_anchor(six_records: str) -> None:
    result = cli("verify", six_records, "--anchor", "6:xyz")
    assert result.exit_code == 2
    assert "expected SEQ:CHAIN" in result.stderr


# -- replay ---------------------------------------------------------------------------------


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


def replayed_seqs(path: str, *args: str) -> list[int]:
    result = cli("replay", path, "--json", *args)
    assert result.exit_code == 0, result.stderr
    return [obj["seq"] for obj in json_lines(result.stdout)]


@pytest.mark.parametrize(
    ("args", "seqs"),
    [
        ([], [1, 2, 3, 4, 5, 6, 7]),
        (["--stream", "controller"], [6]),
        (["--stream", "group/g1", "--stream", "group/g2"], [1, 4]),
        (["--group", "g1"], [1, 2, 3, 7]),
        (["--group", "g2"], [4]),
        (["--group", "g1", "--stream", "controller"], [1, 2, 3, 6, 7]),
        (["--type", "CliMeasured"], [6]),
        (["--type", "CliDispatched", "--type", "CliMeasured"], [1, 6]),
        (["--from-seq", "3", "--until-seq", "5"], [3, 4, 5]),
        (["--group", "g1", "--type", "CliNote", "--from-seq", "3"], [3, 7]),
        (["--stream", "nobody"], []),
        (["--until", "2000-01-01"], []),
        (["--since", "2000-01-01T00:00:00+02:00"], [1, 2, 3, 4, 5, 6, 7]),
    ],
)
def test_replay_filters_select_exactly_the_matching_records(
    audit_log: str, args: list[str], seqs: list[int]
) -> None:
    assert replayed_seqs(audit_log, *args) == seqs


def test_replay_time_window_is_inclusive_to_the_nanosecond(audit_log: str) -> None:
    times = [obj["recorded_at"] for obj in json_lines(cli("replay", audit_log, "--json").stdout)]
    assert len(set(times)) == 7
    assert replayed_seqs(audit_log, "--since", times[2], "--until", times[4]) == [3, 4, 5]
    assert replayed_seqs(audit_log, "--until", times[0]) == [1]
    assert replayed_seqs(audit_log, "--since", times[6]) == [7]


def test_replay_table_shows_seq_stream_version_type_and_fields(audit_log: str) -> None:
    result = cli("replay", audit_log, "--group", "g1")
    assert result.exit_code == 0
    rows = [row.split() for row in result.stdout.splitlines()]
    assert rows[0] == ["seq", "time", "(UTC)", "stream", "ver", "type", "fields"]
    assert [(r[0], r[3], r[4], r[5]) for r in rows[1:]] == [
        ("1", "group/g1", "0", "CliDispatched"),
        ("2", "attempt/g1_g0", "0", "CliNote"),
        ("3", "attempt/g1_g1", "0", "CliNote"),
        ("7", "attempt/g1_g1", "1", "CliNote"),
    ]
    assert result.stdout.splitlines()[4].endswith("text=a1 again n=0")


def test_replay_with_no_match_says_so_on_stderr(audit_log: str) -> None:
    result = cli("replay", audit_log, "--type", "Nothing")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "no records match\n")


def test_replay_rejects_a_time_that_is_not_iso8601(audit_log: str) -> None:
    result = cli("replay", audit_log, "--since", "yesterday")
    assert result.exit_code == 2
    assert "'yesterday' is not an ISO-8601 time" in result.stderr


def test_unknown_type_fails_replay_naming_seq_and_type_unless_allowed(log_file: str) -> None:
    append_notes(log_file, 1)
    seq = insert_raw(log_file, "future", "CliVanished", 1, {"color": "red", "size": 3})
    assert cli("verify", log_file).exit_code == 0

    failed = cli("replay", log_file, "--json")
    assert failed.exit_code == 3
    assert failed.stderr == f"error: seq {seq}: unknown event type 'CliVanished'\n"
    assert [obj["seq"] for obj in json_lines(failed.stdout)] == [1]  # streamed up to the bad one

    shown = json_lines(cli("replay", log_file, "--json", "--allow-unknown").stdout)
    raw = shown[1]
    assert list(raw) == [*REPLAY_KEYS, "unknown", "schema"]
    assert raw["data"] == {"color": "red", "size": 3}
    assert (raw["seq"], raw["stream"], raw["type"], raw["unknown"], raw["schema"]) == (
        seq,
        "future",
        "CliVanished",
        True,
        1,
    )
    assert raw["recorded_at"] == "2027-01-15T08:00:00.123456789Z"
    assert "unknown" not in shown[0]
    table = cli("replay", log_file, "--allow-unknown").stdout
    assert "CliVanished v1?" in table and "color=red size=3" in table


def test_a_future_schema_fails_replay_naming_seq_and_type_unless_allowed(log_file: str) -> None:
    append_notes(log_file, 1)
    seq = insert_raw(log_file, "s2", "CliNote", 7, {"text": "new", "mood": "good"})
    failed = cli("replay", log_file)
    assert failed.exit_code == 3
    assert failed.stderr == (
        f"error: seq {seq}: CliNote has schema v7, this program reads up to v1; "
        "upgrade eventlog to read it\n"
    )
    shown = json_lines(cli("replay", log_file, "--json", "--allow-unknown").stdout)
    assert shown[1]["data"] == {"text": "new", "mood": "good"}
    assert shown[1]["schema"] == 7


# -- stats and tail -------------------------------------------------------------------------


def test_stats_counts_records_per_type_and_stream_prefix(audit_log: str) -> None:
    stats = json.loads(cli("stats", audit_log, "--json").stdout)
    assert stats["records"] == stats["head"] == 7
    assert stats["types"] == {"CliNote": 5, "CliDispatched": 1, "CliMeasured": 1}
    assert stats["stream_prefixes"] == {"attempt": 4, "group": 2, "controller": 1}
    human = cli("stats", audit_log).stdout
    assert "records: 7, head seq 7" in human


def test_tail_prints_the_newest_records(audit_log: str) -> None:
    result = cli("tail", audit_log, "-n", "2", "--json")
    assert [obj["seq"] for obj in json_lines(result.stdout)] == [6, 7]
    plain = cli("tail", audit_log, "-n", "1").stdout
    assert plain.split()[0] == "7" and plain.rstrip().endswith("text=a1 again n=0")


# -- errors ---------------------------------------------------------------------------------


def test_errors_are_one_line_with_a_hint_and_no_traceback_unless_debug(tmp_path: Path) -> None:
    path = str(tmp_path / "missing.db")
    quiet = cli("verify", path)
    assert quiet.stderr.splitlines() == [
        f"error: {path}: no such file",
        f"hint: create a log with `eventlog init {path}`",
    ]
    loud = cli("--debug", "verify", path)
    assert loud.exit_code == quiet.exit_code == 2
    assert "Traceback (most recent call last)" in loud.stderr
    assert "CliUsageError" in loud.stderr
    assert loud.stderr.splitlines()[-2:] == quiet.stderr.splitlines()


def test_an_unexpected_exception_is_one_line_and_exit_70(
    log_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(_ns: int) -> str:
        raise RuntimeError("disk\nexploded")

    monkeypatch.setattr("eventlog.cli.info.format_ns", broken)
    quiet = cli("info", log_file)
    assert quiet.exit_code == 70
    assert quiet.stderr.splitlines() == [
        "error: unexpected RuntimeError: disk exploded",
        "hint: rerun with --debug for the traceback, and report it",
    ]
    loud = cli("--debug", "info", log_file)
    assert loud.exit_code == 70
    assert "Traceback (most recent call last)" in loud.stderr
    assert loud.stderr.splitlines()[-1] == "error: unexpected RuntimeError: disk exploded"


def test_a_file_that_is_not_a_database_is_a_database_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a database, just words " * 100)
    result = cli("replay", str(path))
    assert result.exit_code == 6
    first, hint = result.stderr.splitlines()
    assert first == (
        f"error: {path}: the database file is damaged or not a database (file is not a database)"
    )
    assert hint.startswith("hint: restore it from a backup")


def test_an_events_module_that_does_not_import_is_a_usage_error(log_file: str) -> None:
    result = cli("--events-module", "tests.no_such_vocabulary", "info", log_file)
    assert result.exit_code == 2
    assert result.stderr.startswith(
        "error: --events-module tests.no_such_vocabulary: cannot import"
    )


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (IntegrityError("x", seq=1), 1),
        (InvalidEventError("x"), 2),
        (ConfigError("x"), 2),
        (LogRevisionError("x"), 3),
        (UnknownEventTypeError("x"), 3),
        (FutureSchemaError("x"), 3),
        (ConcurrencyError("s", "version 1", 2), 4),
        (DuplicateEventError("id", "s", 1), 4),
        (LedgerRuleError("x"), 5),
        (EventLogError("x"), 5),
        (RuntimeError("x"), 70),
    ],
)
def test_each_error_kind_has_its_documented_exit_code(error: Exception, code: int) -> None:
    assert exit_code_for(error) == code


def test_every_registered_subcommand_loads() -> None:
    for name in SUBCOMMANDS:
        assert cli(name, "--help").exit_code == 0, name
    assert cli("--help").exit_code == 0


@pytest.mark.parametrize(
    "ns", [0, 1, 1_795_960_227_388_609_508, 1_795_960_227_000_000_000, 4_102_444_800_999_999_999]
)
def test_iso_times_round_trip_to_the_nanosecond(ns: int) -> None:
    assert parse_time(format_ns(ns)) == ns


def test_iso_times_without_a_zone_are_utc_and_offsets_are_honoured() -> None:
    assert parse_time("1970-01-02") == 86_400 * 10**9
    assert parse_time("1970-01-01T01:00:00+01:00") == 0
    assert parse_time("1970-01-01T00:00:00.5") == 500_000_000


# -- the installed entry point, as a real process -------------------------------------------


def run_installed(
    *args: str, input: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run(
        [str(EVENTLOG), *args],
        input=input,
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
        check=False,
    )


def test_installed_entry_point_appends_replays_and_fails_in_one_line(tmp_path: Path) -> None:
    path = str(tmp_path / "run.db")
    assert run_installed("init", path).returncode == 0
    text = lines(
        line("group/g1", "CliNote", {"text": "from a script", "n": 7}, expected_version="no_stream")
    )
    appended = run_installed("--events-module", "tests.cli_vocabulary", "append", path, input=text)
    assert appended.returncode == 0, appended.stderr
    replayed = run_installed(
        "replay", path, "--json", EVENTLOG_EVENTS_MODULES="tests.cli_vocabulary"
    )
    assert replayed.returncode == 0, replayed.stderr
    (obj,) = json_lines(replayed.stdout)
    assert (obj["seq"], obj["stream"], obj["type"], obj["data"]) == (
        1,
        "group/g1",
        "CliNote",
        {"text": "from a script", "n": 7},
    )

    unregistered = run_installed("replay", path)  # the vocabulary module not imported
    assert unregistered.returncode == 3
    assert unregistered.stderr == "error: seq 1: unknown event type 'CliNote'\n"

    bad = run_installed(
        "--events-module", "tests.cli_vocabulary", "append", path, input='{"stream": 1}\n'
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("error: line 1: ")
    assert len(bad.stderr.splitlines()) == 1 and "Traceback" not in bad.stderr

    verified = run_installed("verify", path)
    assert verified.returncode == 0
    assert verified.stdout.startswith("ok: 1 records, head seq 1, chain ")


def _reader(stream: Any) -> queue.Queue[str]:
    lines_read: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for text in stream:
            lines_read.put(text)

    threading.Thread(target=pump, daemon=True).start()
    return lines_read


@pytest.fixture
def follower(log_file: str) -> Iterator[tuple[subprocess.Popen[str], queue.Queue[str]]]:
    append_notes(log_file, 1)
    proc = subprocess.Popen(
        [
            str(EVENTLOG),
            "--events-module",
            "tests.cli_vocabulary",
            "tail",
            log_file,
            "-f",
            "--json",
            "-n",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        yield proc, _reader(proc.stdout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_tail_follow_prints_appends_as_they_happen_and_exits_0_on_interrupt(
    log_file: str, follower: tuple[subprocess.Popen[str], queue.Queue[str]]
) -> None:
    proc, output = follower
    assert json.loads(output.get(timeout=60))["seq"] == 1  # caught up: now following
    with EventLog.open(log_file) as log:
        log.append("late", [CliNote(text="after start")])
        log.append("late", [CliDispatched(group_id="g", attempts=[CliAttempt(rollout_id="r")])])
    assert json.loads(output.get(timeout=30))["data"] == {"text": "after start", "n": 0}
    assert json.loads(output.get(timeout=30))["type"] == "CliDispatched"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    assert proc.stderr is not None and "Traceback" not in proc.stderr.read()


def test_the_commands_work_the_same_on_every_backend(log_target: str) -> None:
    init = cli("init", log_target)
    assert init.exit_code == 0, init.stderr
    text = lines(
        line("group/g1", "CliNote", {"text": "a"}, expected_version="no_stream"),
        line("group/g1", "CliNote", {"text": "b"}, expected_version=0),
    )
    assert cli("append", log_target, input=text).exit_code == 0
    replayed = json_lines(cli("replay", log_target, "--json").stdout)
    assert [(o["seq"], o["version"], o["data"]["text"]) for o in replayed] == [
        (1, 0, "a"),
        (2, 1, "b"),
    ]
    info = json.loads(cli("info", log_target, "--json").stdout)
    assert (info["head"], info["revision"]) == (2, HEAD_REVISION)
    assert info["log_id"] == init.stdout.strip()
    verified = cli("verify", log_target)
    assert verified.stdout == f"ok: 2 records, head seq 2, chain {info['chain']}\n"
    assert cli("db", "current", log_target, "--check").exit_code == 0
    conflict = cli(
        "append",
        log_target,
        input=lines(line("group/g1", "CliNote", {"text": "c"}, expected_version="no_stream")),
    )
    assert conflict.exit_code == 4
    assert conflict.stderr == "error: stream 'group/g1': expected no stream, found version 1\n"
