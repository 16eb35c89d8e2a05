"""`eventlog tail`: the newest records, and following appends."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlog import EventLog
from tests.cli.helpers import EVENTLOG, REPO, _reader, append_notes, cli, json_lines, run_installed
from tests.cli_vocabulary import CliAttempt, CliDispatched, CliNote


def test_tail_prints_the_newest_records(audit_log: str) -> None:
    result = cli("tail", audit_log, "-n", "2", "--json")
    assert [obj["seq"] for obj in json_lines(result.stdout)] == [6, 7]
    plain = cli("tail", audit_log, "-n", "1").stdout
    assert plain.split()[0] == "7" and plain.rstrip().endswith("text=a1 again n=0")


@contextlib.contextmanager
def _interruptible_children() -> Iterator[None]:
    """Children started inside take SIGINT as a terminal's Ctrl-C would reach them.

    A process started with SIGINT ignored passes that on through exec, and Python then never
    raises KeyboardInterrupt: a test session run as a background job of a non-interactive
    shell (`make test &`) ignores SIGINT, and its `tail -f` child would follow forever.
    """
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the child's is SIG_DFL
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


TAIL = [str(EVENTLOG), "--events-module", "tests.cli_vocabulary", "tail"]


@contextlib.contextmanager
def following(target: str, lines: int) -> Iterator[tuple[subprocess.Popen[str], queue.Queue[str]]]:
    """`eventlog tail TARGET -f --json -n LINES` running, with a queue of its output lines;
    killed at the end if it still runs."""
    with _interruptible_children():
        proc = subprocess.Popen(
            [*TAIL, target, "-f", "--json", "-n", str(lines)],
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


@pytest.fixture
def follower(log_file: str) -> Iterator[tuple[subprocess.Popen[str], queue.Queue[str]]]:
    append_notes(log_file, 1)
    with following(log_file, 1) as running:
        yield running


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


def test_a_log_restored_under_the_follower_ends_it_naming_the_record_it_lost(
    log_file: str, tmp_path: Path
) -> None:
    """A backup restored over the log while it was followed: the records appended after
    were printed as if they followed the ones the restore took away."""
    backup = tmp_path / "backup.db"
    append_notes(log_file, 1)
    assert cli("backup", log_file, str(backup)).exit_code == 0
    append_notes(log_file, 2, stream="s2")
    with following(log_file, 3) as (proc, output):
        assert [json.loads(output.get(timeout=60))["seq"] for _ in range(3)] == [1, 2, 3]
        with sqlite3.connect(backup) as source, sqlite3.connect(log_file) as target:
            source.backup(target)  # restored in place, as SQLite copies a database
        source.close()
        target.close()
        appended = run_installed(
            "--events-module",
            "tests.cli_vocabulary",
            "append",
            log_file,
            input="".join(
                json.dumps({"stream": "s3", "type": "CliNote", "data": {"text": f"n{i}"}}) + "\n"
                for i in range(3)
            ),
        )
        assert appended.returncode == 0, appended.stderr
        assert proc.wait(timeout=60) == 1
        said = proc.stderr.read() if proc.stderr is not None else ""
        assert "seq 3: the log no longer holds the record printed as seq 3" in said
        assert "Traceback" not in said
        with pytest.raises(queue.Empty):  # no record of the other history was printed
            output.get(timeout=1)


@pytest.mark.parametrize("change", ["renamed over", "deleted"])
def test_a_log_file_replaced_or_deleted_under_the_follower_ends_it_naming_the_path(
    log_file: str,
    tmp_path: Path,
    follower: tuple[subprocess.Popen[str], queue.Queue[str]],
    change: str,
) -> None:
    """The follower's connection keeps the file it opened: it followed a deleted log, or the
    old file of a path another log was renamed onto, forever, printing nothing more."""
    proc, output = follower
    assert json.loads(output.get(timeout=60))["seq"] == 1  # caught up: now following
    if change == "deleted":
        for name in (log_file, f"{log_file}-wal", f"{log_file}-shm"):
            Path(name).unlink(missing_ok=True)
    else:
        other = str(tmp_path / "other.db")
        assert cli("init", other).exit_code == 0
        append_notes(other, 3)  # more records than the followed one had: a head to read
        os.replace(other, log_file)
    assert proc.wait(timeout=60) == 1
    said = proc.stderr.read() if proc.stderr is not None else ""
    what = "deleted" if change == "deleted" else "replaced by another file"
    assert f"{log_file}: the log file followed was {what} (followed up to seq 1)" in said
    assert "Traceback" not in said


@pytest.mark.postgres
def test_tail_follows_a_postgresql_log_which_has_no_file_to_check(
    fresh_postgres_url: str,
) -> None:
    """The follower's file check has nothing to stat on a server (it must not try)."""
    assert cli("init", fresh_postgres_url).exit_code == 0
    with EventLog.open(fresh_postgres_url) as log:
        log.append("notes", [CliNote(text="before")])
    with following(fresh_postgres_url, 1) as (proc, output):
        assert json.loads(output.get(timeout=60))["seq"] == 1
        with EventLog.open(fresh_postgres_url) as log:
            log.append("notes", [CliNote(text="after")])
        assert json.loads(output.get(timeout=30))["data"]["text"] == "after"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
