"""Any number of processes may open (and so create) one new log at the same moment: creation
is serialized (SQLite's write lock, a PostgreSQL advisory lock) and re-checked under the lock,
so one process creates the log and the others find it at head."""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable
from multiprocessing.synchronize import Barrier
from pathlib import Path

from alembic.script import ScriptDirectory

from eventlog import EventLog
from eventlog.cli.main import main
from eventlog.store import migrate
from tests.vocabulary import LogNote

PROCESSES = 10
ROUNDS = 4
HEAD = ScriptDirectory(str(migrate.migrations_dir())).get_current_head()


def _open_and_append(target: str, barrier: Barrier, index: int, results: object) -> None:
    barrier.wait()
    try:
        with EventLog.open(target, busy_timeout=30) as log:
            log.append(f"p{index}", [LogNote(text="opened", n=index)])
        outcome = "ok"
    except BaseException as exc:  # reported to the test, which names it
        outcome = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    results.put((index, outcome))  # type: ignore[attr-defined]


def _upgrade(target: str, barrier: Barrier, index: int, results: object) -> None:
    barrier.wait()
    try:
        code = main(["db", "upgrade", target], standalone_mode=False)
        outcome = "ok" if code in (None, 0) else f"exit {code}"
    except BaseException as exc:  # reported to the test, which names it
        outcome = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    results.put((index, outcome))  # type: ignore[attr-defined]


def _race(target: str, worker: Callable[..., None] = _open_and_append) -> None:
    context = multiprocessing.get_context("fork")  # no engine is open in this process yet
    barrier = context.Barrier(PROCESSES)
    results = context.Queue()
    processes = [
        context.Process(target=worker, args=(target, barrier, i, results)) for i in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    outcomes = dict(results.get(timeout=120) for _ in processes)
    for process in processes:
        process.join(timeout=60)
    failed = {i: o for i, o in outcomes.items() if o != "ok"}
    assert not failed, f"{len(failed)} of {PROCESSES} opens failed: {failed}"
    if worker is not _open_and_append:
        return
    with EventLog.open(target, create=False) as log:
        assert log.head() == PROCESSES
        assert {r.stream for r in log.read()} == {f"p{i}" for i in range(PROCESSES)}
        assert log.verify().ok
        assert log.info()["revision"] == HEAD


def test_processes_opening_one_new_log_at_once_all_succeed(log_target: str) -> None:
    _race(log_target)


def test_repeated_races_on_new_sqlite_files_all_succeed(tmp_path: Path) -> None:
    """The window is narrow on SQLite: race on a few new files to be sure to hit it."""
    for round_ in range(ROUNDS):
        _race(str(tmp_path / f"log{round_}.db"))


def test_processes_running_db_upgrade_on_one_new_log_at_once_all_succeed(log_target: str) -> None:
    _race(log_target, _upgrade)
    with EventLog.open(log_target, create=False) as log:
        assert log.info()["revision"] == HEAD
        assert log.head() == 0
