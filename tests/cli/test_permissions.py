"""A log or an output this user may not reach: one line naming the cause, never exit 70.

SQLite said only "unable to open database file" of a log the user may not read, and
Path.exists() raised PermissionError (exit 70) where a folder on the way may not be searched.
Run as user nobody (as root) on files root owns; as another user, on modes that deny their
owner too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.helpers import EVENTLOG, REPO, as_nobody, cli


@pytest.fixture
def prefix() -> list[str]:
    found = as_nobody()
    if found is None:
        pytest.skip("no way to run a process as another user here")
    return found


@pytest.fixture
def folder() -> Iterator[Path]:
    """A folder of its own (tmp_path's parents may not be searched by nobody)."""
    made = Path(tempfile.mkdtemp(prefix="eventlog-perm-"))
    made.chmod(0o755)
    try:
        yield made
    finally:  # (chmod -R opens a folder to its owner before it descends into it)
        subprocess.run(["chmod", "-R", "u+rwx", str(made)], check=True)
        shutil.rmtree(made)


def _run(prefix: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, str(EVENTLOG), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.DEVNULL,
        timeout=120,
    )


def _log(path: Path) -> None:
    assert cli("init", str(path)).exit_code == 0
    assert cli("info", str(path)).exit_code == 0  # leaves the -shm a reader needs


def test_a_log_this_user_may_not_read_is_named_with_the_cause(
    prefix: list[str], folder: Path
) -> None:
    log = folder / "run.db"
    _log(log)
    for path in folder.iterdir():
        path.chmod(0o000)  # (as root, the command runs as nobody; else as this user)
    for command in ("info", "replay", "verify"):
        result = _run(prefix, command, str(log))
        assert result.returncode == 6, result.stderr
        assert result.stderr.splitlines()[0] == (
            f"error: {log}: this user may not read the log (Permission denied)"
        )


def test_a_log_behind_a_folder_this_user_may_not_search_is_named(
    prefix: list[str], folder: Path
) -> None:
    inner = folder / "private"
    inner.mkdir()
    _log(inner / "run.db")
    inner.chmod(0o000)
    for args in (
        ("info", str(inner / "run.db")),
        ("append", str(inner / "run.db")),
        ("init", str(inner / "new.db")),
    ):
        result = _run(prefix, *args)
        assert result.returncode == 6, (args, result.stderr)
        assert "this user may not reach the log (Permission denied" in result.stderr, args
        assert "Traceback" not in result.stderr and "unexpected" not in result.stderr


def test_a_new_log_in_a_folder_this_user_may_not_write_is_named(
    prefix: list[str], folder: Path
) -> None:
    folder.chmod(0o555)
    result = _run(prefix, "init", str(folder / "new.db"))
    assert result.returncode == 6, result.stderr
    assert result.stderr.splitlines()[0] == (
        f"error: {folder / 'new.db'}: this user may not create the log in {folder} "
        "(permission denied)"
    )
    assert not (folder / "new.db").exists()


def test_an_output_behind_a_folder_this_user_may_not_search_is_named(
    prefix: list[str], folder: Path
) -> None:
    log = folder / "run.db"
    _log(log)
    for path in folder.iterdir():
        path.chmod(0o666)  # the reader needs the -shm
    closed = folder / "closed"
    closed.mkdir()
    closed.chmod(0o000)
    for args, output in (
        (("export", str(log), "--format", "jsonl", "-o", str(closed / "ex")), closed / "ex"),
        (("backup", str(log), str(closed / "copy.db")), closed / "copy.db"),
    ):
        result = _run(prefix, *args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.splitlines() == [
            f"error: {output}: cannot write it: Permission denied"
        ]
