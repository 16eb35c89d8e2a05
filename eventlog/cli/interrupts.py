"""Ctrl-C and SIGTERM stop a command alike: its clean-up runs (an export's partial tables and
the folder it made are removed), one line says so on stderr, and the exit code is 128 plus
the signal's number (130, 143). SIGTERM is what `timeout`, systemd and Kubernetes send; by
default it ended the process at once, clean-up skipped.

Imported by the console script before anything else: nothing here may load slowly.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


class Interrupted(KeyboardInterrupt):
    """A command stopped by a signal, with what it had done by then (`said`, `hint`)."""

    def __init__(self, signum: int = signal.SIGINT, said: str = "", hint: str | None = None):
        super().__init__(said)
        self.signum = signum
        self.said = said
        self.hint = hint

    @classmethod
    def of(cls, stop: KeyboardInterrupt, said: str = "", hint: str | None = None) -> Interrupted:
        """`stop` (Ctrl-C's KeyboardInterrupt, or an Interrupted) saying what was done."""
        return cls(getattr(stop, "signum", signal.SIGINT), said, hint)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def line(self) -> str:
        what = "terminated" if self.signum == signal.SIGTERM else "interrupted"
        return f"{what}: {self.said}" if self.said else what


STOPS = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop a command."""

_deferring = 0
_pending: int | None = None


def _stop(signum: int, _frame: object) -> None:
    global _pending
    if _deferring:
        _pending = signum
        return
    raise Interrupted(signum)


def stop_on_signals() -> None:
    """SIGINT and SIGTERM raise Interrupted (a KeyboardInterrupt) in the main thread, or
    once `stops_deferred` ends."""
    for signum in STOPS:
        signal.signal(signum, _stop)


@contextlib.contextmanager
def stops_deferred() -> Iterator[None]:
    """A stop that comes meanwhile is raised when the block ends: a worker process being
    spawned whose parent stopped mid-hand-over printed a traceback of its own."""
    global _deferring, _pending
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
        if not _deferring and _pending is not None:
            signum, _pending = _pending, None
            raise Interrupted(signum)
