"""`eventlog replay --json --jobs N`: lines written by worker processes, printed in seq order,
the same bytes as one process prints, errors as one process reports them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from eventlog.cli import workers
from tests.cli.audited_run import AuditedRun
from tests.cli.helpers import append_notes, chunks_asked, cli, insert_raw, sql

SMALL_CHUNK = 5


@pytest.fixture
def pools(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Small chunks, and the number of workers of each pool `replay` starts."""
    from eventlog.cli import replay as module

    monkeypatch.setattr(module, "JSON_CHUNK", SMALL_CHUNK)
    started: list[int] = []

    class Counted(workers.Workers[Any]):
        def __init__(self, jobs: int, *args: Any) -> None:
            started.append(jobs)
            super().__init__(jobs, *args)

    monkeypatch.setattr(module, "Workers", Counted)
    return started


def replay(target: str, *args: str) -> str:
    result = cli("replay", target, "--json", *args)
    assert result.exit_code == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--effective"],
        ["--type", "TokensStaged", "--type", "RestoreStarted", "--from-seq", "7"],
        ["--until-seq", "60", "--since", "2000-01-01T00:00:00Z"],
    ],
)
def test_lines_written_by_workers_are_those_one_process_prints(
    run: AuditedRun, pools: list[int], args: list[str]
) -> None:
    alone = replay(run.path, *args, "--jobs", "1")
    assert pools == []
    shared = replay(run.path, *args, "--jobs", "2")
    assert pools == [2]
    assert shared == alone
    assert len(alone.splitlines()) > SMALL_CHUNK * workers.IN_FLIGHT * 2 or args


def test_time_filters_and_steps_inside_the_run_print_what_one_process_prints(
    run: AuditedRun, pools: list[int]
) -> None:
    from eventlog.cli.times import format_ns

    times = sorted({r.recorded_at for r in run.h.log.read()})
    since, until = format_ns(times[len(times) // 4]), format_ns(times[3 * len(times) // 4])
    for args in (["--since", since, "--until", until], ["--step", "1"], ["--checkpoint", "1"]):
        alone = cli("replay", run.path, "--json", *args, "--jobs", "1")
        shared = cli("replay", run.path, "--json", *args, "--jobs", "2")
        assert (shared.exit_code, shared.stdout, shared.stderr) == (
            alone.exit_code,
            alone.stdout,
            alone.stderr,
        ), args
        assert alone.exit_code == 0 and alone.stdout, (args, alone.stderr)
    first = [json.loads(line)["seq"] for line in alone.stdout.splitlines()][:1]
    assert first and pools, "the step ranges went through workers"


def test_chunks_start_at_records_the_log_holds_across_a_gap(
    log_file: str, pools: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A damaged log may jump seqs: its chunks skip the empty span (a record at seq
    2**63 - 1 listed trillions of chunks up front, until memory ran out)."""
    append_notes(log_file, 12)
    sql(log_file, "UPDATE events SET seq = 5000 WHERE seq = 12")
    asked = chunks_asked(monkeypatch, "eventlog.cli.replay")
    lines = replay(log_file, "--jobs", "2")
    assert [json.loads(line)["seq"] for line in lines.splitlines()] == [*range(1, 12), 5000]
    assert asked == [(1, 5), (6, 10), (11, 15), (5000, 5000)] and pools == [2]


def test_lines_stop_at_the_head_the_command_started_at(
    log_file: str, pools: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records appended while replay runs are not printed (they would be unmarked by the
    marks read at its start): with workers or without, the log as of its head."""
    from eventlog.log import EventLog

    append_notes(log_file, SMALL_CHUNK * 6)
    pinned = SMALL_CHUNK * 4 + 2
    monkeypatch.setattr(EventLog, "head", lambda self: pinned)
    for jobs in ("1", "2"):
        printed = [
            json.loads(line)["seq"] for line in replay(log_file, "--jobs", jobs).splitlines()
        ]
        assert printed == list(range(1, pinned + 1)), jobs


def test_a_selected_stream_is_printed_by_this_process(run: AuditedRun, pools: list[int]) -> None:
    replay(run.path, "--stream", "controller", "--jobs", "2")
    assert pools == []


def test_a_damaged_record_is_the_error_one_process_gives(log_file: str, pools: list[int]) -> None:
    """The same error; the lines before it are records in seq order from the first, never
    one at or after the damaged one (a worker's chunks before it may print more of them than
    one process, which fails at the page holding it)."""
    append_notes(log_file, SMALL_CHUNK * 6)
    damaged = SMALL_CHUNK * 4 + 2
    sql(log_file, f"UPDATE events SET payload = 'text' WHERE seq = {damaged}")
    one = cli("replay", log_file, "--json", "--jobs", "1")
    two = cli("replay", log_file, "--json", "--jobs", "2")
    assert pools == [2]
    assert one.exit_code == two.exit_code != 0
    assert one.stderr == two.stderr
    assert f"seq {damaged}" in two.stderr
    assert two.stdout.startswith(one.stdout)
    printed = [json.loads(line)["seq"] for line in two.stdout.splitlines()]
    assert printed == list(range(1, len(printed) + 1))
    assert SMALL_CHUNK * 2 <= len(printed) < damaged


def test_by_default_workers_start_from_a_long_range(
    log_file: str, pools: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    append_notes(log_file, SMALL_CHUNK * (workers.WORTH_CHUNKS - 1))
    replay(log_file)
    assert pools == []
    append_notes(log_file, SMALL_CHUNK)
    replay(log_file)
    assert pools == [2]


def test_jobs_without_json_are_refused(log_file: str, tmp_path: Path) -> None:
    append_notes(log_file, 2)
    result = cli("replay", log_file, "--jobs", "2")
    assert result.exit_code == 2
    assert "--jobs: only with --json" in result.stderr


def test_a_record_that_does_not_decode_stops_the_lines_where_one_process_stops_them(
    log_file: str, pools: list[int]
) -> None:
    """The lines before it, also those of its own chunk, are printed, then the error."""
    append_notes(log_file, SMALL_CHUNK * 4 + 2)
    unknown = insert_raw(log_file, "s2", "NoSuchType", 1, {"x": 1})
    append_notes(log_file, SMALL_CHUNK * 3)
    one = cli("replay", log_file, "--json", "--jobs", "1")
    two = cli("replay", log_file, "--json", "--jobs", "2")
    assert pools == [2]
    assert one.exit_code == two.exit_code != 0
    assert one.stderr == two.stderr
    assert "NoSuchType" in two.stderr
    assert two.stdout == one.stdout
    assert len(two.stdout.splitlines()) == unknown - 1


def test_a_range_with_no_record_stored_prints_nothing_for_it(
    log_file: str, pools: list[int]
) -> None:
    append_notes(log_file, SMALL_CHUNK * 6)
    sql(log_file, f"DELETE FROM events WHERE seq BETWEEN {SMALL_CHUNK + 1} AND {2 * SMALL_CHUNK}")
    one = replay(log_file, "--jobs", "1")
    assert replay(log_file, "--jobs", "2") == one
    assert pools == [2]
    assert len(one.splitlines()) == SMALL_CHUNK * 5


def test_a_worker_opens_the_log_read_only_with_the_marks_as_of_the_head(
    run: AuditedRun,
) -> None:
    from eventlog.cli.replay import _JsonOptions, _setup_worker
    from eventlog.errors import EventLogError
    from tests.cli_vocabulary import CliNote

    asked: list[int | None] = []

    class Marks:
        def marks(self, log: object, until_seq: int | None = None) -> None:
            asked.append(until_seq)

    before = Path(run.path).read_bytes()
    options = _JsonOptions(
        target=run.path,
        head=17,
        marker=Marks(),  # type: ignore[arg-type]
        types=[],
        since=None,
        until=None,
        hide_marked=False,
        allow_unknown=False,
    )
    worker = _setup_worker(options)
    with worker.log, pytest.raises(EventLogError):
        worker.log.append("s", [CliNote(text="x")])
    assert asked == [17]
    assert Path(run.path).read_bytes() == before
