"""Errors travel between processes as themselves: a Ray actor's or a worker process's
ConcurrencyError reaches its caller as a ConcurrencyError, with its fields.

An exception is pickled as its class and `args`, and unpickled by calling the class with
those args: every error whose constructor takes other arguments than its message failed
there (ConcurrencyError, DuplicateEventError, IntegrityError, ...)."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from eventlog.errors import (
    ConcurrencyError,
    DamagedRecordError,
    DuplicateEventError,
    EventLogError,
    IntegrityError,
    LogRevisionError,
    SchemaError,
)
from eventlog.recovery.errors import ControllerFencedError, MissingRowsError

ERRORS = [
    ConcurrencyError("group/g1", 3, 4),
    DuplicateEventError("0190-abc", "group/g1", 7),
    IntegrityError("seq 9: chain differs", seq=9),
    DamagedRecordError("seq 9: payload is TEXT", seq=9, column="payload"),
    SchemaError("seq 2: no such type", seq=2, type_name="Gone"),
    LogRevisionError("at 0003", hint="run `eventlog db upgrade`"),
    ControllerFencedError("controller/epoch", held_epoch=2, current_epoch=3, by=" by host b"),
    MissingRowsError("rollout_staging", ["g1_g0/call-0"]),
]


def _same(found: BaseException, error: BaseException) -> None:
    assert type(found) is type(error)
    assert (str(found), found.args, vars(found)) == (str(error), error.args, vars(error))


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_an_error_unpickles_as_itself_with_its_fields(error: EventLogError) -> None:
    _same(pickle.loads(pickle.dumps(error)), error)


def test_an_error_raised_in_another_process_arrives_as_itself() -> None:
    """Across a real process boundary (what Ray and multiprocessing do)."""
    raised = (
        "import pickle, sys; from eventlog.errors import ConcurrencyError; "
        "sys.stdout.buffer.write(pickle.dumps(ConcurrencyError('group/g1', 3, 4)))"
    )
    sent = subprocess.run([sys.executable, "-c", raised], capture_output=True, check=True)
    found = pickle.loads(sent.stdout)
    _same(found, ERRORS[0])
    assert isinstance(found, ConcurrencyError) and (found.expected, found.actual) == (3, 4)
