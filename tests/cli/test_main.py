"""The `eventlog` group itself: errors as one line, exit codes, subcommand loading, the
installed entry point (a real process), and the same behaviour on every backend."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from eventlog import AppendRequest, EventLog
from eventlog.cli.exits import exit_code_for
from eventlog.cli.main import SUBCOMMANDS
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
from tests.cli.helpers import (
    EVENTLOG,
    HEAD_REVISION,
    REPO,
    cli,
    json_lines,
    line,
    lines,
    run_installed,
)
from tests.cli_vocabulary import CliNote
from tests.reliability import wait_until


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


@pytest.mark.parametrize(
    ("target", "said"),
    [
        ("sqlite://", "an SQLite URL needs a file"),
        ("://", "not a log location"),
        ("postgresql://u:secret@h:notaport/db", "not a log location"),
        ("postgresql+asyncpg://u:secret@127.0.0.1:1/db", "driver 'asyncpg'"),
        ("postgresql+psycopg2://u@127.0.0.1:1/db", "driver 'psycopg2'"),
        ("sqlite+pysqlcipher:///x.db", "driver 'pysqlcipher'"),
        ("mysql://u@h/db", "unsupported backend 'mysql'"),
    ],
)
def test_a_target_that_is_no_log_location_is_an_input_error(target: str, said: str) -> None:
    result = cli("info", target)
    assert result.exit_code == 2, result.stderr
    assert said in result.stderr and "Traceback" not in result.stderr
    assert "secret" not in result.stderr


@pytest.mark.parametrize(
    "url", ["postgres://u@h/db", "postgres+psycopg://u@h/db", "postgresql://u@h/db"]
)
def test_postgresql_urls_of_either_name_go_through_psycopg(url: str) -> None:
    from eventlog.log import resolve_url

    assert resolve_url(url).drivername == "postgresql+psycopg"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["info", ""], "TARGET is empty"),
        (["init", "{dir}"], "is a folder, not a log file"),
        (["init", "sqlite:///{dir}"], "is a folder, not a log file"),
        (["info", "sqlite:///{dir}/missing.db"], "no such file"),
        (["info", "sqlite:///{dir}"], "is a folder, not a log file"),
        (["info", "{dir}/fifo"], "not a regular file"),
        (["replay", "{dir}/fifo"], "not a regular file"),
        (["init", "{dir}/fifo"], "not a regular file"),
        (["append", "{dir}/fifo"], "not a regular file"),
        (["info", "~no-such-user-here/run.db"], "cannot expand ~no-such-user-here: no such user"),
        (["init", "~no-such-user-here/run.db"], "cannot expand ~no-such-user-here: no such user"),
        (["info", "sqlite:///%00"], "a file name cannot hold a NUL character"),
        (["info", "n" * 300 + "/run.db"], "File name too long"),
        (["export", "{dir}/fifo", "-o", "~no-such-user-here/x"], "cannot expand"),
    ],
)
def test_a_target_file_that_cannot_be_a_log_is_named_as_such(
    tmp_path: Path, argv: list[str], said: str
) -> None:
    """An SQLite URL is checked as its path is (it was exit 6, "unable to open database
    file" or "disk I/O error"), a folder is not a new log, an empty TARGET is named; a FIFO
    is no log (reading one waited for a writer for good); `~user` of no user and a NUL in a
    name were exit 70."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result = cli(*[a.format(dir=tmp_path) for a in argv], input="")
    assert result.exit_code == 2, result.output
    assert said in result.stderr and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == [fifo]


def test_an_argument_that_is_not_utf8_is_a_usage_error(tmp_path: Path) -> None:
    not_text = os.fsdecode(b"x\xff.db")  # what Python makes of such bytes in argv
    for argv in (["info", not_text], ["replay", str(tmp_path / "a.db"), "--group", not_text]):
        result = cli(*argv)
        assert result.exit_code == 2, result.output
        assert "is not UTF-8 text" in result.output


def test_an_events_module_that_fails_to_import_is_named(tmp_path: Path) -> None:
    broken = tmp_path / "broken_events.py"
    broken.write_text("raise RuntimeError('half written')\n")
    (tmp_path / "exiting_events.py").write_text("import sys\nsys.exit(3)\n")  # 3: our schema code
    sys.path.insert(0, str(tmp_path))
    try:
        for name, said in [
            ("broken_events", "RuntimeError: half written"),
            ("exiting_events", "importing it called sys.exit(3)"),
            (".relative", "importing it failed: TypeError"),
        ]:
            result = cli("--events-module", name, "info", str(tmp_path / "a.db"))
            assert result.exit_code == 2, result.stderr
            assert f"--events-module {name}: " in result.stderr and said in result.stderr
    finally:
        sys.path.remove(str(tmp_path))


@pytest.mark.parametrize("command", ["replay", "verify", "info", "stats"])
def test_a_folder_as_the_target_is_named_as_one(tmp_path: Path, command: str) -> None:
    result = cli(command, str(tmp_path))
    assert result.exit_code == 2, result.stderr
    assert result.stderr.splitlines()[0] == f"error: {tmp_path}: is a folder, not a log file"


INTERRUPT_AT_IMPORT = """
import sys


class InterruptAt:
    \"\"\"Ctrl-C arriving while `{module}` is being imported (as a real one may, at start).\"\"\"

    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            sys.meta_path.remove(self)
            raise KeyboardInterrupt
        return None


sys.meta_path.insert(0, InterruptAt())
"""


@pytest.mark.parametrize("module", ["typing", "click", "sqlalchemy", "msgspec", "eventlog.log"])
def test_ctrl_c_while_the_command_loads_is_one_line_and_exit_130(
    log_file: str, tmp_path: Path, module: str
) -> None:
    """Before the package's names loaded lazily, the console script imported SQLAlchemy and
    click before any handler was in place: Ctrl-C in the first ~0.3 s printed a traceback."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(INTERRUPT_AT_IMPORT.format(module=module))
    done = run_installed("verify", log_file, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]))
    assert (done.returncode, done.stderr) == (130, "interrupted\n")


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_sigterm_stops_a_command_as_ctrl_c_does_cleaning_up_and_saying_so(
    tmp_path: Path, jobs: str
) -> None:
    """SIGTERM (`timeout`, systemd, Kubernetes) ended the process at once: exit 143 with the
    export's folder and partial tables left behind. It now stops it as Ctrl-C does: the
    clean-up runs, one line says so, exit 143."""
    path = tmp_path / "run.db"
    with EventLog.open(path) as log:
        for block in range(150):
            log.append_batch(
                [AppendRequest(f"s{block}", [CliNote(text="x" * 50, n=n) for n in range(1000)])]
            )
    out = tmp_path / "export"
    command = [str(EVENTLOG), "--events-module", "tests.cli_vocabulary", "export", str(path)]
    process = subprocess.Popen(
        [*command, "--format", "jsonl", "-o", str(out), "--jobs", jobs],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        wait_until(lambda: out.is_dir() and any(out.iterdir()))
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert (process.returncode, stderr) == (143, "terminated\n")
    assert not out.exists()
