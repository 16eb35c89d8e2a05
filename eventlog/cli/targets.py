"""Opening a command's TARGET: a file path or URL, read-only unless the command writes."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from eventlog.cli.exits import CliUsageError
from eventlog.errors import StorageUnavailableError
from eventlog.log import DEFAULT_BUSY_TIMEOUT, EventLog, expanded_path, open_store, resolve_url
from eventlog.store import migrate, runs


def selected_run() -> str | None:
    """The run the command line selected (`--run NAME` or EVENTLOG_RUN), if any."""
    ctx = click.get_current_context(silent=True)
    run = None if ctx is None else ctx.find_root().params.get("run")
    return run if isinstance(run, str) and run else None


def run_target(target: str) -> str:
    """TARGET with the selected run named in it (`?run=NAME`), so every command that opens
    it sees that run's records only."""
    return runs.with_run(target, selected_run())


def shown_target(target: str) -> str:
    """The target as messages show it: a path as given, a URL without its password."""
    if "://" not in target:
        return target
    return resolve_url(run_target(target)).render_as_string(hide_password=True)


def sqlite_file(target: str) -> Path | None:
    """The file of an SQLite target, a path or an `sqlite:///` URL; None for a server."""
    if not target:
        raise CliUsageError("TARGET is empty: give a log file or a database URL")
    if "://" not in target:
        return expanded_path(target)
    url = resolve_url(target)
    return Path(url.database) if url.drivername.startswith("sqlite") and url.database else None


def require_existing(target: str) -> None:
    """Refuse a file that does not exist, instead of creating an empty database there."""
    path = sqlite_file(target)
    if path is None:
        return
    found = _stat(target, path)
    if found is None:
        raise CliUsageError(
            f"{target}: no such file", hint=f"create a log with `eventlog init {target}`"
        )
    _require_regular(target, found)


def _stat(target: str, path: Path) -> os.stat_result | None:
    """The file's status, None where there is no such file; a folder on its way this user
    may not search is named (Path.exists raised PermissionError there: exit 70)."""
    try:
        return path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError as exc:
        raise StorageUnavailableError(
            f"{target}: this user may not reach the log ({exc.strerror}: a folder on its way "
            "may not be searched)",
            hint="run as a user who may read it and its folder, or audit a copy",
        ) from None
    except OSError as exc:  # a name too long, a loop of links
        raise CliUsageError(f"{target}: {exc.strerror or exc}") from None


def _require_regular(target: str, found: os.stat_result | None) -> None:
    """A folder or a special file (a FIFO, a device) is no log: SQLite says only "disk I/O
    error" of a folder, and its read-only open of a FIFO waited for a writer for good."""
    if found is None:
        return
    if stat.S_ISDIR(found.st_mode):
        raise CliUsageError(f"{target}: is a folder, not a log file")
    if not stat.S_ISREG(found.st_mode):
        raise CliUsageError(f"{target}: not a regular file, so not a log file")


def require_parent(target: str) -> None:
    """A new SQLite file needs its folder, and no folder of its name; say so instead of a
    driver error."""
    path = sqlite_file(target)
    if path is None:
        return
    parent = path.resolve().parent
    folder = _stat(target, parent)
    if folder is None or not stat.S_ISDIR(folder.st_mode):
        raise CliUsageError(f"{target}: folder {parent} does not exist")
    _require_regular(target, _stat(target, path))
    refuse_side_file_name(path)


class OutputPath(click.Path):
    """`click.Path` that refuses '' (an unset variable in a script): Path('') is the current
    folder, where the command would have written."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == "":
            self.fail("is empty", param, ctx)
        return super().convert(value, param, ctx)


SIDE_FILES = ("", "-wal", "-shm", "-journal")
"""An SQLite log's file and the files SQLite keeps beside it."""


def log_file_at(target: str, path: Path) -> str | None:
    """The name of TARGET's own file (the log, or one of SQLite's files beside it) that
    `path` is, by name or as another name of the same file (a hard link); None if none."""
    file = sqlite_file(target)
    if file is None:
        return None
    log = file.resolve()  # (sqlite_file expanded it)
    out = expanded_path(str(path)).resolve()
    for suffix in SIDE_FILES:
        beside = log.with_name(log.name + suffix)
        if out == beside or _same_file(out, beside):
            return beside.name
    return None


def _same_file(one: Path, other: Path) -> bool:
    """Whether two names are one file; False where either cannot be looked at (this user may
    not search its folder: writing there fails on its own, named)."""
    try:
        return os.path.samefile(one, other)
    except OSError:
        return False


def refuse_writing_onto_log(target: str, output: Path) -> None:
    """Refuse an output file that is TARGET's own (`log_file_at`): a read command never
    writes to the log it reads (a report written over `run.db-wal` lost every record
    committed there); nor one named as another database's (`refuse_side_file_name`)."""
    own = log_file_at(target, output)
    if own is not None:
        raise CliUsageError(
            f"{output}: that is the log's own file {own}; a read command never writes to the "
            "log it reads"
        )
    refuse_side_file_name(output)


_SQLITE_HEADER = b"SQLite format 3\x00"


def refuse_side_file_name(path: Path) -> None:
    """Refuse a file named as one SQLite keeps beside a database that is there (`run.db-wal`
    beside `run.db`): SQLite takes it for that database's own, and deleted a log made there
    or read a backup written there as a hot journal."""
    for suffix in SIDE_FILES[1:]:
        if not path.name.endswith(suffix) or path.name == suffix:
            continue
        base = path.with_name(path.name.removesuffix(suffix))
        try:  # not blocking: a FIFO of that name
            fd = os.open(base, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return
        try:
            header = os.read(fd, len(_SQLITE_HEADER))
        except OSError:
            header = b""
        finally:
            os.close(fd)
        if header == _SQLITE_HEADER:
            raise CliUsageError(
                f"{path}: named as SQLite's {suffix} file of the database {base}, which SQLite "
                "would take it for",
                hint="choose another name",
            )


@contextmanager
def writing_output(output: Path) -> Iterator[None]:
    """Writing `output` (a report's file, an export's folder): a path that cannot be written
    (a missing or non-folder parent, a read-only or full disk) is one line naming it."""
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise CliUsageError(f"{output}: cannot write it: {reason}") from exc


BUSY_TIMEOUT_ENV = "EVENTLOG_BUSY_TIMEOUT"


def busy_timeout() -> float:
    """Seconds an append waits for another writer's lock (env EVENTLOG_BUSY_TIMEOUT)."""
    text = os.environ.get(BUSY_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_BUSY_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86_400:
        raise CliUsageError(f"{BUSY_TIMEOUT_ENV}={text!r}: expected seconds in 0..86400")
    return value


def open_log(target: str, *, create: bool = False, write: bool = False) -> EventLog:
    """Open a log at head; without `create`, a missing file or an empty database is refused.

    Unless the command creates or appends (`create`, `write`), the log is opened read-only:
    an audit never creates, migrates or changes the file it reads.
    """
    target = run_target(target)
    if create:
        require_parent(target)
    else:
        require_existing(target)
    store = open_store(target, busy_timeout=busy_timeout(), read_only=not (create or write))
    try:
        migrate.ensure_at_head(store.engine, target=shown_target(target), create=create)
    except BaseException:
        store.close()
        raise
    return EventLog(store)
