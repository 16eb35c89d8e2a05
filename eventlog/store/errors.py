"""Driver errors in, typed eventlog errors out: the one place the store translates them.

Both drivers follow PEP 249, so the classification is by its classes (OperationalError,
IntegrityError, ...), refined by SQLite's extended error name where PEP 249 is too coarse
(a damaged file is an OperationalError or a plain DatabaseError to `sqlite3`).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator

from sqlalchemy import exc as sa_exc

from eventlog.errors import (
    EventLogError,
    StorageDamagedError,
    StorageError,
    StorageIntegrityError,
    StorageUnavailableError,
)

_DAMAGED = ("SQLITE_CORRUPT", "SQLITE_NOTADB")
_READ_ONLY = "SQLITE_READONLY"
_FULL = "SQLITE_FULL"
_SQLITE_UNAVAILABLE = (
    "SQLITE_BUSY",
    "SQLITE_LOCKED",
    "SQLITE_IOERR",
    "SQLITE_CANTOPEN",
    "SQLITE_PERM",
    "SQLITE_PROTOCOL",
    "SQLITE_NOLFS",
    "SQLITE_AUTH",
    "SQLITE_INTERRUPT",
)
"""sqlite3 raises OperationalError for these and for plain SQL errors alike: tell them apart."""


def _driver_classes() -> tuple[tuple[type[BaseException], ...], ...]:
    """(unavailable, integrity, any database error) classes of the installed drivers."""
    unavailable: list[type[BaseException]] = [sqlite3.OperationalError, sqlite3.InterfaceError]
    integrity: list[type[BaseException]] = [sqlite3.IntegrityError]
    database: list[type[BaseException]] = [sqlite3.Error]
    try:
        import psycopg
    except ImportError:  # the postgres extra is not installed
        pass
    else:
        unavailable += [psycopg.OperationalError, psycopg.InterfaceError]
        unavailable.append(psycopg.errors.ReadOnlySqlTransaction)
        integrity.append(psycopg.IntegrityError)
        database.append(psycopg.Error)
    return tuple(unavailable), tuple(integrity), tuple(database)


_CLASSES: tuple[tuple[type[BaseException], ...], ...] | None = None


def translate(exc: BaseException, target: str) -> EventLogError | None:
    """The typed error for a driver or SQLAlchemy error; None for anything else."""
    global _CLASSES
    if isinstance(exc, EventLogError):
        return exc
    original: BaseException = exc
    if isinstance(exc, sa_exc.DBAPIError) and exc.orig is not None:
        original = exc.orig
    if _CLASSES is None:
        _CLASSES = _driver_classes()
    unavailable, integrity, database = _CLASSES
    text = " ".join(str(original).split()) or type(original).__name__
    name = getattr(original, "sqlite_errorname", "") or ""
    if name.startswith(_DAMAGED):
        return StorageDamagedError(
            f"{target}: the database file is damaged or not a database ({text})",
            hint=f"restore it from a backup (`eventlog backup`); `eventlog verify {target}` "
            "names the first bad record if the file still opens",
        )
    if name.startswith(_READ_ONLY):
        return StorageUnavailableError(f"{target}: the log is read-only here ({text})")
    if name.startswith(_FULL):
        return StorageUnavailableError(
            f"{target}: the disk is full ({text}); nothing of this append was committed",
            hint="free space, then retry the append with the same event ids",
        )
    if isinstance(original, integrity):
        return StorageIntegrityError(f"{target}: the database refused the write: {text}")
    if (
        name
        and not name.startswith(_SQLITE_UNAVAILABLE)
        and not name.startswith("SQLITE_CONSTRAINT")
    ):
        return StorageError(f"{target}: database error: {text}")
    if isinstance(original, unavailable) or (
        isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated
    ):
        return StorageUnavailableError(f"{target}: database unavailable: {text}")
    if isinstance(original, database) or isinstance(exc, sa_exc.DBAPIError):
        return StorageError(f"{target}: database error: {text}")
    return None


@contextlib.contextmanager
def translating(target: str) -> Iterator[None]:
    """Raise driver errors from the block as their typed eventlog error (cause kept)."""
    try:
        yield
    except EventLogError:
        raise
    except Exception as exc:
        typed = translate(exc, target)
        if typed is None:
            raise
        raise typed from exc
