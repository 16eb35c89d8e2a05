"""Errors travel between processes as themselves: a Ray actor's or a worker process's
ConcurrencyError reaches its caller as a ConcurrencyError, with its fields.

An exception is pickled as its class and `args`, and unpickled by calling the class with
those args: every error whose constructor takes other arguments than its message failed
there (ConcurrencyError, DuplicateEventError, IntegrityError, ...)."""

from __future__ import annotations

import copy
import importlib
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
from eventlog.recovery.errors import ControllerFencedError, MissingRowsError, StaleAttemptError
from eventlog.rollout.actor import RemoteAttemptError

MODULES_WITH_ERRORS = (
    "eventlog.cli.exits",
    "eventlog.recovery.errors",
    "eventlog.rollout.actor",
    "eventlog.rollout.faults",
    "eventlog.rollout.pool",
)

ERRORS = [
    ConcurrencyError("group/g1", 3, 4),
    DuplicateEventError("0190-abc", "group/g1", 7),
    IntegrityError("seq 9: chain differs", seq=9),
    DamagedRecordError("seq 9: payload is TEXT", seq=9, column="payload"),
    SchemaError("seq 2: no such type", seq=2, type_name="Gone"),
    LogRevisionError("at 0003", hint="run `eventlog db upgrade`"),
    ControllerFencedError("controller/epoch", held_epoch=2, current_epoch=3, by=" by host b"),
    MissingRowsError("rollout_staging", ["g1_g0/call-0"]),
    StaleAttemptError(
        "g1_g0-a1 is superseded",
        group_id="g1",
        generation_index=0,
        rollout_id="g1_g0-a1",
        current_rollout_id="g1_g0-a2",
    ),
    RemoteAttemptError("vLLM died", error_type="EngineDeadError"),
]


def _every_error_class() -> set[type[EventLogError]]:
    """Every error class of the package (the modules that define some, imported)."""
    for module in MODULES_WITH_ERRORS:
        importlib.import_module(module)
    found: set[type[EventLogError]] = set()
    todo: list[type[EventLogError]] = [EventLogError]
    while todo:
        cls = todo.pop()
        found.add(cls)
        todo.extend(cls.__subclasses__())
    return found


def _same(found: BaseException, error: BaseException) -> None:
    assert type(found) is type(error)
    assert (str(found), found.args, vars(found)) == (str(error), error.args, vars(error))


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_an_error_unpickles_as_itself_with_its_fields(error: EventLogError) -> None:
    _same(pickle.loads(pickle.dumps(error)), error)


def test_every_error_class_travels() -> None:
    """Each class that takes a message alone is tried here; each other one must be in ERRORS
    (a new error class with a constructor of its own fails this until it is)."""
    tried = {type(error) for error in ERRORS}
    for cls in _every_error_class() - tried:
        try:
            error = cls("a message")
        except TypeError:
            pytest.fail(f"{cls.__qualname__} takes other arguments: add it to ERRORS")
        _same(pickle.loads(pickle.dumps(error)), error)


def test_an_error_that_refers_to_itself_still_does_after_the_trip() -> None:
    """Fields given to the rebuilding call (not as pickle's state) recursed without end."""
    error = ConcurrencyError("group/g1", 3, 4)
    error.me = error  # type: ignore[attr-defined]
    error.related = [error]  # type: ignore[attr-defined]
    for found in (pickle.loads(pickle.dumps(error)), copy.deepcopy(error)):
        assert vars(found)["me"] is found and vars(found)["related"][0] is found


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
