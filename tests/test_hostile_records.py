"""Hostile stored input: a record whose column holds a value of the wrong storage type (the
casual `UPDATE events SET payload = payload || x'00'`, TEXT where BLOB belongs and the other
way round, in every column) is a typed error naming its seq in verify, replay and every read
command: exit 1, one line, never a traceback or exit 70. PostgreSQL refuses such edits itself."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result

from eventlog import AppendResult, EventLog, Proposed
from eventlog.cli.main import main
from eventlog.errors import DamagedRecordError, InvalidEventError
from eventlog.log import resolve_url
from tests.reliability import drop_append_only, write_lock_held
from tests.vocabulary import LogNote

BAD_SEQ = 3

# (column, the edit, what a message must name)
EDITS = [
    ("payload", "payload = payload || x'00'", "payload"),
    ("payload", "payload = 'hello'", "payload holds TEXT"),
    ("payload", "payload = 42", "payload holds INTEGER"),
    ("chain", "chain = 'x'", "chain holds TEXT"),
    ("event_id", "event_id = 'abc'", "event_id holds TEXT"),
    ("event_id", "event_id = x'00ff'", "event_id"),
    ("recorded_at", "recorded_at = 'yesterday'", "recorded_at holds TEXT"),
    ("recorded_at", "recorded_at = 1.5", "recorded_at holds REAL"),
    ("stream", "stream = x'ff00'", "stream holds BLOB"),
    ("stream", "stream = CAST(x'ff00' AS TEXT)", "stream"),
    ("type", "type = x'00'", "type holds BLOB"),
    ("type", "type = CAST(x'c3' AS TEXT)", "type"),
    ("version", "version = 'one'", "version holds TEXT"),
    ("schema", "schema = 'v1'", "schema holds TEXT"),
]

COMMANDS = [["verify"], ["replay"], ["replay", "--json"], ["stats"], ["tail", "-n", "10"]]


def cli(*args: str) -> Result:
    return CliRunner().invoke(
        main, ["--events-module", "tests.vocabulary", *args], catch_exceptions=False
    )


def _tampered(path: Path, edit: str) -> None:
    with EventLog.open(path) as log:
        log.append("s", [LogNote(text=f"n{i}", n=i) for i in range(5)])
    with sqlite3.connect(path) as conn:
        drop_append_only(conn)  # as anyone with the file would first
        conn.execute(f"UPDATE events SET {edit} WHERE seq = {BAD_SEQ}")
    conn.close()


def test_a_record_at_the_largest_seq_ends_a_full_page_and_the_read(tmp_path: Path) -> None:
    """A damaged log whose newest record sits at seq 2**63 - 1: the page after a full one
    ending there was asked for from seq 2**63 (OverflowError: exit 70 in verify, replay,
    stats, backup); the read ends with it, and verify names the gap."""
    path = tmp_path / "log.db"
    _tampered(path, f"seq = {2**63 - 1}")
    with EventLog.open(path, read_only=True) as log:
        assert [row[0] for row in log.read_rows(page_size=2)] == [1, 2, 4, 5, 2**63 - 1]
        assert [row[0] for row in log.read_payloads(page_size=5)][-1] == 2**63 - 1
        assert (log.next_seq(6), log.next_seq(1, 2), log.next_seq(2**63 - 1, 2**63 - 1)) == (
            2**63 - 1,
            1,
            2**63 - 1,
        )
        assert log.next_seq(6, 2**62) is None
    result = cli("verify", str(path))
    assert result.exit_code == 1 and "gap" in result.stdout, result.output


@pytest.mark.parametrize(("column", "edit", "named"), EDITS, ids=[e[1] for e in EDITS])
def test_a_wrong_storage_type_is_named_by_seq_in_every_read_command(
    tmp_path: Path, column: str, edit: str, named: str
) -> None:
    path = tmp_path / "log.db"
    _tampered(path, edit)
    for command in COMMANDS:
        result = cli(command[0], str(path), *command[1:])
        assert result.exit_code == 1, (command, result.output)
        last = result.stderr.splitlines()[-1]
        assert last.startswith(f"error: seq {BAD_SEQ}: column {column}"), (command, last)
        assert named in last
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("column", "edit", "named"), EDITS[:3], ids=[e[1] for e in EDITS[:3]])
def test_the_library_raises_damaged_record_error_with_the_seq(
    tmp_path: Path, column: str, edit: str, named: str
) -> None:
    path = tmp_path / "log.db"
    _tampered(path, edit)
    with EventLog.open(path) as log:
        with pytest.raises(DamagedRecordError) as caught:
            list(log.read())
        assert (caught.value.seq, caught.value.column) == (BAD_SEQ, column)
        assert [r.seq for r in log.read(until_seq=BAD_SEQ - 1)] == [1, 2]


def test_a_damaged_head_record_is_named_by_info(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    with EventLog.open(path) as log:
        log.append("s", [LogNote(text="a"), LogNote(text="b")])
    with sqlite3.connect(path) as conn:
        drop_append_only(conn)
        conn.execute("UPDATE events SET chain = 'x' WHERE seq = 2")
    conn.close()
    result = cli("info", str(path))
    assert result.exit_code == 1
    assert result.stderr.startswith("error: seq 2: column chain holds TEXT")


@pytest.mark.postgres
@pytest.mark.parametrize(
    "edit",
    [
        "payload = 'hello'::text",
        "chain = 'x'::text",
        "recorded_at = 'yesterday'",
        "stream = E'a\\x00'",
    ],
)
def test_postgresql_refuses_wrong_storage_types_itself(fresh_postgres_url: str, edit: str) -> None:
    with EventLog.open(fresh_postgres_url) as log:
        log.append("s", [LogNote(text=f"n{i}") for i in range(5)])
    engine = sa.create_engine(resolve_url(fresh_postgres_url))
    with pytest.raises(sa.exc.DBAPIError), engine.begin() as conn:
        drop_append_only(conn)
        conn.exec_driver_sql(f"UPDATE events SET {edit} WHERE seq = 3")
    engine.dispose()
    assert cli("verify", fresh_postgres_url).exit_code == 0


@pytest.mark.parametrize("flag", ["--from-seq", "--until-seq"])
def test_a_seq_beyond_any_log_is_a_usage_error(tmp_path: Path, flag: str) -> None:
    path = tmp_path / "log.db"
    EventLog.open(path).close()
    result = cli("replay", str(path), flag, "9" * 23)
    assert result.exit_code == 2, result.output
    assert "is beyond the largest seq a log can hold" in result.stderr
    anchored = cli("verify", str(path), "--anchor", f"{'9' * 23}:{'0' * 64}")
    assert anchored.exit_code == 2, anchored.output


@pytest.mark.parametrize("stream", ["a\x00b", "lone \udc80 surrogate"])
def test_a_stream_name_both_backends_cannot_store_is_refused_alike(
    log_target: str, stream: str
) -> None:
    with EventLog.open(log_target) as log:
        with pytest.raises(InvalidEventError, match="stream name is UTF-8 text without NUL"):
            log.append(stream, [LogNote(text="x")])
        assert log.head() == 0


def test_a_lone_surrogate_in_a_field_is_refused_naming_the_item(log_target: str) -> None:
    with EventLog.open(log_target) as log:
        with pytest.raises(InvalidEventError, match="item 0: LogNote"):
            log.append("s", [LogNote(text="\ud800")])
        assert log.head() == 0


# The wrong storage types of the columns `read_payloads` reads (a payload still stored as a
# BLOB is only found by decoding it).
PAYLOAD_EDITS = [
    e for e in EDITS if e[0] in ("payload", "recorded_at", "schema") and "||" not in e[1]
]


@pytest.mark.parametrize(
    ("column", "edit", "named"), PAYLOAD_EDITS, ids=[e[1] for e in PAYLOAD_EDITS]
)
def test_the_payload_read_of_audits_raises_damaged_record_error_with_the_seq(
    tmp_path: Path, column: str, edit: str, named: str
) -> None:
    path = tmp_path / "log.db"
    _tampered(path, edit)
    with EventLog.open(path) as log:
        with pytest.raises(DamagedRecordError) as caught:
            list(log.read_payloads(page_size=2))
        assert (caught.value.seq, caught.value.column) == (BAD_SEQ, column)
        assert [row[0] for row in log.read_payloads(until_seq=BAD_SEQ - 1)] == [1, 2]


def _five_notes_edited(tmp_path: Path, edit: str) -> Path:
    """A log of five notes on stream 's' whose newest record (seq 5) was edited by `edit`."""
    path = tmp_path / "log.db"
    with EventLog.open(path) as log:
        log.append("s", [LogNote(text=f"n{i}", n=i) for i in range(5)])
    with sqlite3.connect(path) as conn:
        drop_append_only(conn)
        conn.execute(f"UPDATE events SET {edit} WHERE seq = 5")
    conn.close()
    return path


@pytest.mark.parametrize("edit", ["version = 'one'", "version = 4.5"])
def test_a_stream_version_of_the_wrong_type_is_a_damaged_record_not_a_crash(
    tmp_path: Path, edit: str
) -> None:
    """The batched version reads (restore, rebuild) take max(version), which SQLite returns
    as the edited value itself: text or a real must be named, never cast or crash."""
    path = _five_notes_edited(tmp_path, edit)
    with EventLog.open(path) as log:
        with pytest.raises(DamagedRecordError, match="stream 's'") as caught:
            log.stream_versions(["s"])
        assert caught.value.column == "version"
        with pytest.raises(DamagedRecordError, match="stream 's'"):
            log.versions_between(1, 5)


# (edit of the newest record, seq 5 of stream 's'; the stream appended to; what is named)
WRITER_EDITS = [
    ("version = 'one'", "s", "stream 's': its newest version is TEXT"),
    ("version = 4.5", "s", "stream 's': its newest version is REAL"),
    ("chain = 'x'", "t", "seq 5: column chain holds TEXT"),
    ("chain = 32", "t", "seq 5: column chain holds INTEGER"),  # bytes(32) is the genesis value
]


@pytest.mark.parametrize(
    ("edit", "stream", "named"), WRITER_EDITS, ids=[e[0] for e in WRITER_EDITS]
)
def test_the_writer_refuses_to_build_on_a_damaged_record_and_writes_nothing(
    tmp_path: Path, edit: str, stream: str, named: str
) -> None:
    """What an append reads under the write lock (the chain it links to, the version it
    counts from) is checked as every read is: a damaged record is named, never linked
    from, cast, or a TypeError (CLI exit 70)."""
    path = _five_notes_edited(tmp_path, edit)
    with EventLog.open(path) as log, pytest.raises(DamagedRecordError, match=named):
        log.append(stream, [LogNote(text="x")])
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT max(seq) FROM events").fetchone() == (5,)
    conn.close()


def test_a_retry_of_an_id_whose_stored_record_is_damaged_is_refused_naming_the_seq(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.db"
    event_id = uuid.uuid4()
    with EventLog.open(path) as log:
        log.append("s", [Proposed(LogNote(text="a"), event_id)])
    with sqlite3.connect(path) as conn:
        drop_append_only(conn)
        conn.execute("UPDATE events SET payload = 'hello' WHERE seq = 1")
    conn.close()
    with EventLog.open(path) as log:
        with pytest.raises(DamagedRecordError, match="seq 1: column payload holds TEXT") as caught:
            log.append("s", [Proposed(LogNote(text="a"), event_id)])
        assert (caught.value.seq, caught.value.column) == (1, "payload")
        assert log.head() == 1


def test_a_stream_with_a_damaged_version_fails_alone_in_a_group_commit(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    with EventLog.open(path) as log:
        log.append("s", [LogNote(text="a")])
    with sqlite3.connect(path) as conn:
        drop_append_only(conn)
        conn.execute("UPDATE events SET version = 'one' WHERE seq = 1")
    conn.close()

    async def main(log: EventLog) -> list[object]:
        with write_lock_held(str(path)):  # all of them queue for one commit
            streams = ["t0", "t1", "s", "t2", "t3"]
            appends = [log.append_async(s, [LogNote(text="x")]) for s in streams]
            tasks = [asyncio.create_task(append) for append in appends]
            await asyncio.sleep(0.3)
        return await asyncio.gather(*tasks, return_exceptions=True)

    with EventLog.open(path) as log:
        outcomes = asyncio.run(main(log))
        assert isinstance(outcomes.pop(2), DamagedRecordError)
        assert all(isinstance(o, AppendResult) for o in outcomes), outcomes
        assert [r.stream for r in log.read_records(2)] == ["t0", "t1", "t2", "t3"]
