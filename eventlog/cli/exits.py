"""Exit codes of `eventlog`, and which error ends a command with which code."""

from __future__ import annotations

import enum

from sqlalchemy import exc as sa_exc

from eventlog.errors import (
    ConcurrencyError,
    DuplicateEventError,
    EventLogError,
    InputError,
    IntegrityError,
    LogRevisionError,
    SchemaError,
    StorageError,
)


class ExitCode(enum.IntEnum):
    """The documented exit codes of `eventlog` (also listed in `eventlog --help`)."""

    OK = 0
    INTEGRITY = 1
    USAGE = 2
    REVISION_OR_SCHEMA = 3
    CONFLICT = 4
    OTHER = 5
    DATABASE = 6
    INTERNAL = 70
    # A stop by a signal: 128 + its number (130 Ctrl-C, 143 SIGTERM; eventlog.cli.interrupts)


class CliUsageError(InputError):
    """The command line named something that does not exist or cannot be used."""


_EXIT_CODES: list[tuple[type[BaseException], ExitCode]] = [
    (IntegrityError, ExitCode.INTEGRITY),
    (InputError, ExitCode.USAGE),
    (LogRevisionError, ExitCode.REVISION_OR_SCHEMA),
    (SchemaError, ExitCode.REVISION_OR_SCHEMA),
    (ConcurrencyError, ExitCode.CONFLICT),
    (DuplicateEventError, ExitCode.CONFLICT),
    (StorageError, ExitCode.DATABASE),
    (EventLogError, ExitCode.OTHER),
]


def exit_code_for(exc: BaseException) -> ExitCode:
    """The exit code an error ends the command with (70 for anything not deliberate)."""
    if isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError) or (
        type(exc) is sa_exc.DatabaseError  # e.g. "file is not a database"
    ):
        return ExitCode.DATABASE
    for cls, code in _EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return ExitCode.INTERNAL
