"""`eventlog export --jobs N`: chunks built by worker processes, tables the same as one
process writes, errors as one process reports them, and no worker that would decode
otherwise."""

from __future__ import annotations

import concurrent.futures.process
import json
import operator
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pyarrow.parquet as pq
import pytest

from eventlog import codec
from eventlog.cli import workers
from eventlog.errors import DamagedRecordError, EventLogError
from eventlog.events import Event
from tests.cli import worker_functions
from tests.cli.audited_run import AuditedRun
from tests.cli.helpers import append_notes, chunks_asked, cli, insert_raw, line, lines, sql
from tests.cli_vocabulary import CliMeasured

SMALL_BATCH = 5
"""Records per chunk in these tests: the audited run then spans more chunks than the
workers hold in flight."""


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    from eventlog.cli import export as module

    monkeypatch.setattr(module, "BATCH", SMALL_BATCH)


def export(target: str, out: Path, fmt: str, jobs: int) -> str:
    result = cli("export", target, "--format", fmt, "-o", str(out), "--jobs", str(jobs))
    assert result.exit_code == 0, result.stderr
    return result.stdout


def test_chunks_start_at_records_the_log_holds_across_a_gap(
    log_file: str, tmp_path: Path, small_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A damaged log may jump seqs: no chunk is made for the empty span."""
    append_notes(log_file, 12)
    sql(log_file, "UPDATE events SET seq = 5000 WHERE seq = 12")
    asked = chunks_asked(monkeypatch, "eventlog.cli.export")
    export(log_file, tmp_path / "out", "jsonl", 2)
    records = (tmp_path / "out" / "records.jsonl").read_text().splitlines()
    assert [json.loads(line)["seq"] for line in records] == [*range(1, 12), 5000]
    assert asked == [(1, 5), (6, 10), (11, 15), (5000, 5000)]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_tables_built_by_workers_are_those_one_process_writes(
    run: AuditedRun, tmp_path: Path, fmt: str, small_chunks: None
) -> None:
    """Byte for byte, every table, with the rolled-back marks and rare types spread over
    many chunks; the summary says who built them."""
    head = run.h.log.head()
    assert head > SMALL_BATCH * workers.IN_FLIGHT * 2  # more chunks than are ever in flight
    alone = export(run.path, tmp_path / "one", fmt, 1)
    shared = export(run.path, tmp_path / "two", fmt, 2)
    assert "worker process" not in alone
    # the pool starts its second worker when the first is busy: one may build every chunk
    assert re.search(r"^tables built by (1 worker process|2 worker processes)$", shared, re.M)
    tables = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert len(tables) > 5
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == tables
    for name in tables:
        one = (tmp_path / "one" / name).read_bytes()
        assert (tmp_path / "two" / name).read_bytes() == one, name


def test_a_damaged_record_read_by_a_worker_is_the_error_one_process_gives(
    log_file: str, tmp_path: Path, small_chunks: None
) -> None:
    append_notes(log_file, SMALL_BATCH * 3)
    damaged = SMALL_BATCH * 2 + 5
    sql(log_file, f"UPDATE events SET payload = 'text' WHERE seq = {damaged}")
    results = [
        cli("export", log_file, "--format", "jsonl", "-o", str(tmp_path / f"j{jobs}"), "-j", jobs)
        for jobs in ("1", "2")
    ]
    one, two = results
    assert one.exit_code == two.exit_code != 0
    assert one.stderr == two.stderr
    assert f"seq {damaged}: column payload holds TEXT" in two.stderr
    assert "Traceback" not in two.stderr


def test_a_vocabulary_no_worker_can_import_is_exported_here(
    log_file: str, tmp_path: Path, small_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event type defined inside a function exists only in this process: the export
    builds every chunk itself, and the type still gets its table."""
    from eventlog import events

    class LocalNote(Event, frozen=True, kw_only=True, tag="LocalNote"):
        schema: ClassVar[int] = 1
        text: str

    monkeypatch.setitem(events._EVENT_TYPES, "LocalNote", LocalNote)
    assert workers.portable_vocabulary() is None
    append_notes(log_file, SMALL_BATCH * 3)
    from eventlog.log import EventLog

    with EventLog.open(log_file) as log:
        log.append("local", [LocalNote(text="only here")])
    out = export(log_file, tmp_path / "out", "jsonl", 2)
    assert "worker process" not in out
    assert "only here" in (tmp_path / "out" / "LocalNote.jsonl").read_text()


def _upcast_note(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "text": f"upcast {data['text']}", "n": 0}


def test_an_upcaster_registered_at_run_time_is_registered_in_workers_too(
    log_file: str, tmp_path: Path, small_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command's vocabulary is rebuilt in a worker by name, not only by importing: an
    upcaster the command registered while it ran decodes old records there as here."""
    monkeypatch.setitem(codec._UPCASTERS, ("CliNote", 0), _upcast_note)
    append_notes(log_file, SMALL_BATCH * 3)
    old = insert_raw(log_file, "old", "CliNote", 0, {"text": "v0"})
    append_notes(log_file, SMALL_BATCH * 3)
    export(log_file, tmp_path / "one", "jsonl", 1)
    shared = export(log_file, tmp_path / "two", "jsonl", 2)
    assert "worker process" in shared
    notes = (tmp_path / "two" / "CliNote.jsonl").read_text()
    assert notes == (tmp_path / "one" / "CliNote.jsonl").read_text()
    assert f'"seq":{old},' in notes and "upcast v0" in notes


def test_a_worker_whose_imports_register_more_refuses_to_build(
    log_file: str, tmp_path: Path, small_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that would decode a type the command does not (its imports registered it,
    the command's registry lacks it) fails closed, naming it, instead of writing tables no
    one process writes."""
    from eventlog import events

    append_notes(log_file, SMALL_BATCH * 3)
    monkeypatch.delitem(events._EVENT_TYPES, "CliNote")
    result = cli("export", log_file, "--format", "jsonl", "-o", str(tmp_path / "out"), "-j", "2")
    assert result.exit_code == 5, result.stderr
    assert "decodes records otherwise than this one (type CliNote)" in result.stderr
    assert "--jobs 1" in result.stderr


def test_jobs_below_one_are_refused_naming_the_option(log_file: str, tmp_path: Path) -> None:
    result = cli("export", log_file, "--format", "jsonl", "-o", str(tmp_path / "o"), "-j", "0")
    assert result.exit_code == 2
    assert "--jobs" in result.stderr


def test_the_default_is_the_cpus_this_process_may_use_at_most_eight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3})
    assert workers.default_jobs() == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert workers.default_jobs() == workers.MAX_JOBS == 8


def test_a_portable_vocabulary_names_each_class_with_its_schema() -> None:
    found = workers.portable_vocabulary()
    assert found is not None
    assert found["type GroupReserved"] == "eventlog.recovery.vocabulary:GroupReserved v1"


def test_a_carried_error_is_rebuilt_as_itself() -> None:
    damaged = DamagedRecordError("seq 7: column payload holds TEXT", seq=7, column="payload")
    damaged.hint = "restore it from a backup"
    rebuilt = pickle.loads(pickle.dumps(workers.Carried(damaged))).rebuilt()
    assert type(rebuilt) is DamagedRecordError
    assert str(rebuilt) == str(damaged)
    assert (rebuilt.seq, rebuilt.column, rebuilt.hint) == (7, "payload", damaged.hint)


def test_an_error_holding_what_cannot_travel_is_carried_as_its_text() -> None:
    failed = RuntimeError("the driver failed")
    failed.cursor = lambda: None  # type: ignore[attr-defined]
    rebuilt = pickle.loads(pickle.dumps(workers.Carried(failed))).rebuilt()
    assert type(rebuilt) is EventLogError
    assert str(rebuilt) == "RuntimeError: the driver failed"
    (note,) = rebuilt.__notes__  # the worker's traceback, shown with --debug
    assert note.startswith(f"in worker process {os.getpid()}:")


def test_workers_mark_records_as_the_log_stood_at_the_commands_head(run: AuditedRun) -> None:
    """A restore appended while an export runs must not mark the chunks a worker builds
    after it: marks are read as of the head the command started at."""
    from eventlog.recovery.cli.replay import RolledBackMarker

    marker = RolledBackMarker()
    now = marker.marks(run.h.log)
    assert now is not None and now(run.restore_seq - 1) is not None
    assert marker.marks(run.h.log, run.restore_seq - 1) is None


def test_workers_run_ahead_of_their_consumer_by_a_bounded_number_of_results() -> None:
    """Results come in their arguments' order, and no more than IN_FLIGHT per worker are
    asked for before the first is taken: memory stays bounded when writing falls behind."""
    vocabulary = workers.portable_vocabulary()
    assert vocabulary is not None
    pulled: list[int] = []

    def arguments() -> Iterator[int]:
        for n in range(40):
            pulled.append(n)
            yield n

    with workers.Workers(2, vocabulary, int, operator.add) as pool:
        results = pool.map(arguments())
        assert next(results) == 0
        assert len(pulled) <= workers.IN_FLIGHT * 2 + 1
        assert list(results) == list(range(1, 40))


def test_a_worker_that_dies_is_one_error_line_not_a_traceback() -> None:
    """A worker killed mid-chunk (out of memory, a signal) breaks the pool: the command says
    so in a typed error with a hint, as no input could make it (never exit 70)."""
    vocabulary = workers.portable_vocabulary()
    assert vocabulary is not None
    with (
        workers.Workers(1, vocabulary, worker_functions.nothing, worker_functions.exit_now) as pool,
        pytest.raises(EventLogError, match="stopped before their chunks were done") as caught,
    ):
        list(pool.map([3, 3, 3]))
    assert caught.value.hint is not None and "--jobs 1" in caught.value.hint


def test_a_pool_broken_while_its_consumer_writes_is_the_same_error_at_the_next_submit() -> None:
    """The consumer takes a result, and while it writes the worker dies: the next chunk's
    submission meets the broken pool, which is the same typed error."""
    vocabulary = workers.portable_vocabulary()
    assert vocabulary is not None
    die = worker_functions.exit_if_negative
    with workers.Workers(1, vocabulary, worker_functions.nothing, die) as pool:
        results = pool.map([0, -1, *range(1, 2 * workers.IN_FLIGHT)])
        assert next(results) == 0
        time.sleep(1.5)  # the worker dies on -1 meanwhile
        with pytest.raises(EventLogError, match="stopped before their chunks were done") as caught:
            next(results)
    assert isinstance(caught.value.__cause__, concurrent.futures.process.BrokenProcessPool)


def test_a_worker_leaves_ctrl_c_to_the_command() -> None:
    """Ctrl-C reaches every process of the terminal's group: a worker goes on (the command's
    process stops the pool), instead of each printing a traceback of its own."""
    vocabulary = workers.portable_vocabulary()
    assert vocabulary is not None
    with workers.Workers(
        1, vocabulary, worker_functions.nothing, worker_functions.interrupt_self
    ) as pool:
        assert list(pool.map([5, 6])) == [5, 6]


def test_a_worker_leaves_ctrl_c_to_the_command_while_it_starts_too() -> None:
    """A worker holds Ctrl-C from its start until its initializer ignores it: one that came
    while it imported was a traceback on the terminal and a broken pool. Started, it holds
    Ctrl-C no more (it ignores it)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tests.cli.worker_functions import interrupt_a_starting_worker as run; run()",
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[2],
        timeout=120,
    )
    assert "Traceback" not in done.stderr
    assert "KeyboardInterrupt" not in done.stderr
    assert (done.returncode, done.stdout) == (0, "False\n"), done.stderr


def test_a_ctrl_c_pending_as_a_worker_starts_leaves_ctrl_c_unblocked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Blocking SIGINT runs the handler of one already pending (the KeyboardInterrupt comes
    from that call): the command's thread must not keep it blocked afterwards."""
    real = signal.pthread_sigmask

    def interrupted(how: int, mask: Any) -> Any:
        before = real(how, mask)
        if how == signal.SIG_BLOCK and signal.SIGINT in set(mask):
            raise KeyboardInterrupt
        return before

    vocabulary = workers.portable_vocabulary()
    assert vocabulary is not None
    with workers.Workers(1, vocabulary, worker_functions.nothing, operator.add) as pool:
        monkeypatch.setattr(signal, "pthread_sigmask", interrupted)
        with pytest.raises(KeyboardInterrupt):
            pool.start()
        monkeypatch.undo()
        assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_started_workers_run_before_any_task_is_asked_for() -> None:
    """`start` spawns every worker at once (each would start at a submit that found none
    idle), so that they set up while the command does other work (report's painters)."""
    vocabulary = workers.portable_vocabulary()
    assert vocabulary is not None
    with workers.Workers(
        2, vocabulary, worker_functions.nothing, worker_functions.pid_after
    ) as pool:
        before = _children()  # multiprocessing's resource tracker started with the pool
        pool.start()
        started = _children() - before
        found = set(pool.map([0.05] * 8))
    assert len(started) == 2
    assert found <= started  # the tasks ran on the workers `start` spawned, no others


def _children() -> set[int]:
    """This process's children now (which of two workers takes which task is up to the
    machine's load: a busy one may let the first worker take all of them)."""
    return {
        int(pid)
        for task in Path("/proc/self/task").iterdir()
        for pid in (task / "children").read_text().split()
    }


def test_a_worker_ends_when_its_command_is_killed(tmp_path: Path) -> None:
    """A command killed outright (a timeout, the OOM killer) leaves no worker holding the
    log: each one watches its parent and ends with it, removing what the command would
    have removed on its way out (export's spooled chunks)."""
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "chunk-10").write_bytes(b"tables")
    command = subprocess.Popen(
        [sys.executable, "-m", "tests.cli.worker_functions", "60", str(spool)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    worker = 0
    try:
        assert command.stdout is not None
        worker = int(command.stdout.readline())
        assert _running(worker)
        command.kill()
        command.wait()
        deadline = time.monotonic() + 20
        while _running(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(worker)
        assert not spool.exists()
    finally:
        command.kill()
        command.wait()
        if worker and _running(worker):  # the rule failed: leave no orphan behind
            os.kill(worker, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Alive and not a zombie (a container's init may be slow to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_a_log_missing_a_whole_chunk_of_seqs_is_exported_as_one_process_does(
    log_file: str, tmp_path: Path, small_chunks: None
) -> None:
    """A range of seqs with no record stored (rows deleted outside eventlog) is an empty
    chunk: skipped, not a crash."""
    append_notes(log_file, SMALL_BATCH * 6)
    sql(log_file, f"DELETE FROM events WHERE seq BETWEEN {SMALL_BATCH + 1} AND {2 * SMALL_BATCH}")
    export(log_file, tmp_path / "one", "jsonl", 1)
    export(log_file, tmp_path / "two", "jsonl", 2)
    lines = (tmp_path / "one" / "records.jsonl").read_text()
    assert len(lines.splitlines()) == SMALL_BATCH * 5
    assert (tmp_path / "two" / "records.jsonl").read_text() == lines


def test_types_a_module_registers_from_another_are_decoded_by_workers(
    log_file: str, tmp_path: Path, small_chunks: None
) -> None:
    """--events-module names the module that registers; the class may live in another one:
    a worker imports the module that defines it and registers it by name."""
    note = line("split", "SplitNote", {"text": "registered elsewhere"})
    text = lines(*[note] * (SMALL_BATCH * 4))
    given = ("--events-module", "tests.cli.split_reg")
    assert cli(*given, "append", log_file, input=text).exit_code == 0
    outs = []
    for jobs in ("1", "2"):
        out = tmp_path / f"j{jobs}"
        result = cli(*given, "export", log_file, "--format", "jsonl", "-o", str(out), "-j", jobs)
        assert result.exit_code == 0, result.stderr
        outs.append((out / "SplitNote.jsonl").read_text())
    assert outs[0] == outs[1] and "registered elsewhere" in outs[0]


def test_parquet_builds_dictionaries_only_for_columns_whose_values_repeat(
    run: AuditedRun, tmp_path: Path
) -> None:
    export(run.path, tmp_path, "parquet", 1)
    meta = pq.ParquetFile(tmp_path / "records.parquet").metadata.row_group(0)
    encodings = {
        meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)
    }
    assert not any("DICTIONARY" in e for e in encodings["event_id"] + encodings["data"])
    assert any("DICTIONARY" in e for e in encodings["type"] + encodings["stream"])


def test_a_worker_opens_the_log_read_only_with_the_marks_as_of_the_head(
    run: AuditedRun, tmp_path: Path
) -> None:
    from eventlog.cli.export import _setup_worker

    asked: list[int | None] = []

    class Marks:
        column = "rolled_back_by"

        def marks(self, log: object, until_seq: int | None = None) -> None:
            asked.append(until_seq)

    before = Path(run.path).read_bytes()
    log, _, spool = _setup_worker(run.path, "jsonl", 17, Marks(), tmp_path)  # type: ignore[arg-type]
    assert spool == tmp_path
    with log, pytest.raises(EventLogError):
        log.append("s", [CliMeasured(name="x", value=1.0, ok=True, tags=[])])
    assert asked == [17]
    assert Path(run.path).read_bytes() == before


def test_an_error_that_pickles_travels_as_itself_with_the_workers_traceback() -> None:
    try:
        open("/nonexistent/eventlog-test")  # noqa: SIM115
    except OSError as exc:
        carried = workers.Carried(exc)
    rebuilt = pickle.loads(pickle.dumps(carried)).rebuilt()
    assert type(rebuilt) is FileNotFoundError
    assert (rebuilt.errno, rebuilt.filename) == (2, "/nonexistent/eventlog-test")
    assert str(rebuilt) == "[Errno 2] No such file or directory: '/nonexistent/eventlog-test'"
    (note,) = rebuilt.__notes__
    assert note.startswith(f"in worker process {os.getpid()}:") and "test_export_jobs" in note


def test_workers_that_cannot_start_are_one_error_naming_them() -> None:
    """An interpreter that cannot be started (a frozen or embedded one) is a typed error
    with a hint, not a complaint about the output folder or exit 70."""
    from multiprocessing import spawn

    vocabulary = workers.portable_vocabulary()
    assert vocabulary is not None
    executable = spawn.get_executable()
    spawn.set_executable("/nonexistent/python")
    try:
        with (
            pytest.raises(EventLogError, match="failed to start") as caught,
            workers.Workers(1, vocabulary, worker_functions.nothing, operator.add) as pool,
        ):
            list(pool.map([1]))
    finally:
        spawn.set_executable(executable)
    assert caught.value.hint is not None and "--jobs 1" in caught.value.hint


def test_a_worker_registers_an_upcaster_of_a_type_whose_name_holds_spaces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(codec, "_UPCASTERS", dict(codec._UPCASTERS))
    named = "tests.cli.test_export_jobs:_upcast_note"
    workers._register({"upcaster spaced note v2 v7": named})
    assert codec.vocabulary()["upcaster spaced note v2 v7"] is _upcast_note
    assert ("spaced note v2", 7) in codec._UPCASTERS


def test_a_workers_parquet_chunk_crosses_as_a_file_read_back_and_removed(
    run: AuditedRun, tmp_path: Path
) -> None:
    """A worker writes its chunk's tables to a file and sends only where they are: the
    command's process reads them back as they were built and removes the file."""
    from eventlog.cli import export as module

    log = run.h.log
    builder = module._builder(log, "parquet", log.head(), None)
    folder = tmp_path / "spool"
    folder.mkdir()
    built = module._build_range((log, builder, None), (1, log.head()))  # the command's own
    assert built.spool is None and built.records is not None
    spooled = module._build_range((log, builder, folder), (1, log.head()))  # a worker's
    assert spooled.records is None and all(t.part is None for t in spooled.typed)
    assert spooled.spool is not None and Path(spooled.spool).parent == folder
    assert len(pickle.dumps(spooled)) < 4096 < len(pickle.dumps(built))
    back = module.unspooled(spooled, builder.form)
    assert back.records.equals(built.records)
    for part in [back.records, *(t.part for t in back.typed)]:  # each holds its own memory
        assert max(map(_root_size, _buffers(part))) <= part.nbytes + 4096
    assert [t.part for t in back.typed] == [t.part for t in built.typed]
    assert [(t.name, t.rows) for t in back.typed] == [(t.name, t.rows) for t in built.typed]
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_text_chunks_travel_as_they_are(run: AuditedRun, tmp_path: Path, fmt: str) -> None:
    from eventlog.cli import export as module

    log = run.h.log
    builder = module._builder(log, fmt, log.head(), None)
    built = builder.build(module._read(log, 1, log.head()))
    folder = tmp_path / "spool"
    folder.mkdir()
    assert module.spooled(built, builder.form, folder) is built
    assert list(folder.iterdir()) == []


def test_an_export_by_workers_leaves_no_spooled_chunk_behind(
    run: AuditedRun, tmp_path: Path, small_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Done or failed, the command's spool folder is gone when it ends."""
    import tempfile

    spools = tmp_path / "tmp"
    spools.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spools))
    export(run.path, tmp_path / "out", "parquet", 2)
    assert list(spools.iterdir()) == []
    (tmp_path / "out" / "TokensStaged.parquet").unlink()
    (tmp_path / "out" / "TokensStaged.parquet").mkdir()  # a table that cannot be written
    result = cli("export", run.path, "-o", str(tmp_path / "out"), "--jobs", "2")
    assert result.exit_code != 0
    assert list(spools.iterdir()) == []


def test_a_chunk_that_cannot_be_spooled_travels_as_it_is(run: AuditedRun, tmp_path: Path) -> None:
    """Spooling only saves copies: a spool folder that is gone (or full) costs nothing."""
    from eventlog.cli import export as module

    log = run.h.log
    builder = module._builder(log, "parquet", log.head(), None)
    built = module._build_range((log, builder, tmp_path / "gone"), (1, log.head()))
    assert built.spool is None and built.records is not None
    assert built.records.num_rows == log.head()


def _buffers(table: Any) -> list[Any]:
    return [
        buffer
        for column in table.columns
        for chunk in column.chunks
        for buffer in chunk.buffers()
        if buffer is not None
    ]


def _root_size(buffer: Any) -> int:
    """The size of the allocation a buffer is a view of."""
    while buffer.parent is not None:
        buffer = buffer.parent
    return int(buffer.size)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_an_export_by_workers_needs_no_temporary_folder(
    run: AuditedRun,
    tmp_path: Path,
    small_chunks: None,
    monkeypatch: pytest.MonkeyPatch,
    fmt: str,
) -> None:
    """Where no temporary folder can be made, the workers' chunks travel pickled: the same
    tables, and nothing about it said (a text format never asks for one)."""
    import tempfile

    def no_folder(*args: Any, **kwargs: Any) -> str:
        raise OSError(30, "Read-only file system")

    alone = export(run.path, tmp_path / "one", fmt, 1)
    monkeypatch.setattr(tempfile, "mkdtemp", no_folder)
    shared = export(run.path, tmp_path / "two", fmt, 2)

    def counts(summary: str) -> list[str]:
        return [line.split(" -> ")[0] for line in summary.splitlines() if " -> " in line]

    assert counts(alone) == counts(shared)
    for table in (tmp_path / "one").iterdir():
        assert (tmp_path / "two" / table.name).read_bytes() == table.read_bytes(), table.name


def test_a_spooled_chunk_that_cannot_be_read_back_is_an_error_naming_its_file(
    run: AuditedRun, tmp_path: Path
) -> None:
    """Not the output folder's fault: the error names the spooled file (and the file goes)."""
    from eventlog.cli import export as module

    log = run.h.log
    builder = module._builder(log, "parquet", log.head(), None)
    for damage in ("overwritten", "removed"):
        spooled = module._build_range((log, builder, tmp_path), (1, log.head()))
        assert spooled.spool is not None
        if damage == "overwritten":
            Path(spooled.spool).write_bytes(b"not arrow")
        else:
            Path(spooled.spool).unlink()
        with pytest.raises(EventLogError, match=re.escape(spooled.spool)):
            module.unspooled(spooled, builder.form)
        assert not Path(spooled.spool).exists()
