"""A stdout that cannot take the output: closed (`>&-`), full (`> /dev/full`) or a pipe whose
reader went away. Each ran the installed command with a real file descriptor: a closed
stdout was exit 70 (`'NoneType' object has no attribute 'isatty'`) or output dropped with
exit 0, a full one exit 70 (`unexpected OSError`), after `append` had committed its events."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cli.helpers import EVENTLOG, REPO, count, line, lines

FULL = "/dev/full"

needs_dev_full = pytest.mark.skipif(not Path(FULL).exists(), reason="no /dev/full here")


def run(
    *args: str,
    stdout: Any,
    input: str | None = None,
    unbuffered: bool = False,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`eventlog ARGS` with stdout as given: a file, a pipe, or None with fd 1 closed."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | (env or {})
    env["PYTHONPATH"] = str(REPO)
    if unbuffered:  # stdout's byte layer is then the FileIO itself, without a buffer
        env["PYTHONUNBUFFERED"] = "1"
    return subprocess.run(
        [str(EVENTLOG), "--events-module", "tests.cli_vocabulary", *args],
        input=input,
        stdout=subprocess.DEVNULL if stdout is None else stdout,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=(lambda: os.close(1)) if stdout is None else None,
        timeout=120,
        check=False,
    )


def full(*args: str, input: str | None = None, unbuffered: bool = False) -> Any:
    with open(FULL, "w") as out:
        return run(*args, stdout=out, input=input, unbuffered=unbuffered)


def assert_one_error(result: subprocess.CompletedProcess[str], message: str) -> None:
    """Exit 2 (not 70), the error on one line, no traceback, nothing else on stderr."""
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[0] == f"error: {message}", result.stderr
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr


CLOSED = (
    "stdout is closed: give the command a stdout (`> FILE`, or `> /dev/null` to discard what "
    "it prints)"
)


@pytest.mark.parametrize(
    "args",
    [
        ["replay", "{log}", "--json"],
        ["replay", "{log}", "--json", "-j", "2"],
        ["replay", "{log}", "--json", "--type", "CliNote"],
        ["tail", "{log}", "--json"],
        ["info", "{log}"],  # printed nothing, exit 0
    ],
)
def test_a_closed_stdout_is_named_with_exit_2(audit_log: str, args: list[str]) -> None:
    result = run(*[arg.format(log=audit_log) for arg in args], stdout=None)
    assert_one_error(result, CLOSED)


def test_append_refuses_a_closed_stdout_before_appending(log_file: str) -> None:
    """Refused before the commit, as a closed stdin is: it could not say what it appended."""
    result = run("append", log_file, stdout=None, input=lines(line("s", "CliNote", {"text": "a"})))
    assert_one_error(result, CLOSED)
    assert count(log_file) == 0


@needs_dev_full
@pytest.mark.parametrize(
    "args",
    [
        ["info", "{log}"],
        ["replay", "{log}"],
        ["replay", "{log}", "--json"],
        ["replay", "{log}", "--json", "-j", "2"],
        ["tail", "{log}", "--json"],
        ["stats", "{log}"],
        ["verify", "{log}"],
    ],
)
def test_a_full_stdout_is_named_with_exit_2(audit_log: str, args: list[str]) -> None:
    result = full(*[arg.format(log=audit_log) for arg in args])
    assert_one_error(result, "stdout: cannot write: No space left on device")


@needs_dev_full
def test_a_full_unbuffered_stdout_is_named_with_exit_2(audit_log: str) -> None:
    """Under `python -u` / PYTHONUNBUFFERED stdout has no BufferedWriter: still checked."""
    result = full("info", audit_log, unbuffered=True)
    assert_one_error(result, "stdout: cannot write: No space left on device")


@needs_dev_full
@pytest.mark.parametrize("unbuffered", [False, True])
def test_append_to_a_full_stdout_says_its_events_were_appended(
    log_file: str, unbuffered: bool
) -> None:
    """The events are committed when the lines are printed: a script retrying on a failure
    must read that they are in the log (exit 70 said nothing of them)."""
    text = lines(line("s", "CliNote", {"text": "a"}), line("s", "CliNote", {"text": "b"}))
    result = full("append", log_file, input=text, unbuffered=unbuffered)
    assert_one_error(
        result,
        "2 events were appended (seq 1..2); stdout: cannot write: No space left on device",
    )
    assert result.stderr.splitlines()[1] == "hint: they are in the log: do not append them again"
    assert count(log_file) == 2
    one = full("append", log_file, "--json", input=lines(line("s", "CliNote", {"text": "c"})))
    assert_one_error(
        one, "1 event was appended (seq 3); stdout: cannot write: No space left on device"
    )


def test_a_character_stdout_cannot_encode_is_escaped_not_exit_70(log_file: str) -> None:
    """PYTHONIOENCODING=ascii and a stream named in another script: the plain views (replay,
    tail) raised UnicodeEncodeError, exit 70."""
    appended = run(
        "append",
        log_file,
        stdout=subprocess.PIPE,
        input=lines(line("notes/ünï", "CliNote", {"text": "çø"})),
    )
    assert appended.returncode == 0, appended.stderr
    for command in ("replay", "tail"):
        shown = run(command, log_file, stdout=subprocess.PIPE, env={"PYTHONIOENCODING": "ascii"})
        assert shown.returncode == 0, shown.stderr
        assert "notes/\\xfcn\\xef" in shown.stdout and "text=\\xe7\\xf8" in shown.stdout, command


def test_a_reader_that_goes_away_still_ends_quietly_with_exit_0(audit_log: str) -> None:
    """`eventlog replay LOG | head`: a broken pipe is no failure of ours (unchanged)."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write
    try:
        result = run("replay", audit_log, "--json", stdout=write)
    finally:
        os.close(write)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


GUARDED = """
import sys, click
from eventlog.cli.stdout import StdoutError, guarded_stdout
before = sys.stdout
try:
    with guarded_stdout():
        sys.stdout.write("left in the buffer, not flushed")
        {end}
except StdoutError as exc:
    print("raised:", exc, file=sys.stderr)
except click.exceptions.Exit:
    print("exit", file=sys.stderr)
print("restored" if sys.stdout is before else "not restored", file=sys.stderr)
"""


@needs_dev_full
@pytest.mark.parametrize("end", ["pass", "raise click.exceptions.Exit(1)"])
def test_what_a_command_left_buffered_is_flushed_and_checked_when_it_ends(end: str) -> None:
    """Flushed at the command's end (also one ended by ctx.exit, as verify's exit 1 is), not
    in the interpreter's last flush, whose failure is 'Exception ignored' and exit 120."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with open(FULL, "w") as out:
        result = subprocess.run(
            [sys.executable, "-c", GUARDED.replace("{end}", end)],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
            timeout=120,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "raised: stdout: cannot write: No space left on device",
        "restored",
    ]


def test_what_was_printed_before_a_command_stays_before_its_output(tmp_path: Path) -> None:
    """The interpreter's stdout is flushed before the command's takes over: not reordered."""
    snippet = (
        "import sys\n"
        "from eventlog.cli.stdout import guarded_stdout\n"
        "sys.stdout.write('before ')\n"
        "with guarded_stdout():\n"
        "    sys.stdout.write('during')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    path = tmp_path / "out.txt"
    with path.open("w") as out:
        subprocess.run(
            [sys.executable, "-c", snippet], stdout=out, cwd=REPO, env=env, timeout=120, check=True
        )
    assert path.read_text() == "before during"


@needs_dev_full
@pytest.mark.parametrize("option", ["--help", "--version"])
def test_the_group_s_own_help_and_version_check_their_stdout_too(option: str) -> None:
    """They print while the arguments are parsed, before any command: to a full stdout that
    was exit 1 and a traceback, to a closed one exit 0 with nothing printed."""
    assert_one_error(full(option), "stdout: cannot write: No space left on device")
    assert_one_error(run(option, stdout=None), CLOSED)
    shown = run(option, stdout=subprocess.PIPE)
    assert shown.returncode == 0 and shown.stdout.strip(), shown.stderr


@needs_dev_full
def test_an_error_stderr_cannot_take_still_ends_with_its_own_exit_code(tmp_path: Path) -> None:
    """The error line failed to write and escaped as exit 1, an integrity problem's code."""
    with open(FULL, "w") as err:
        done = subprocess.run(
            [str(EVENTLOG), "info", str(tmp_path / "missing.db")],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=120,
            check=False,
        )
    assert done.returncode == 2
