"""The cyclic garbage collector's pause: one home for every thread that pauses it.

Appends, commits, rebuild folds and restores allocate many short-lived, acyclic containers
(prepared events, rows, ids, results, folded values); a collection in the middle scanned and
promoted every one of them, and promoted ones fed the full collections that rescan the whole
heap. Paused, most are freed by their reference counts before the next collection looks.
Nothing is leaked: cycles made meanwhile are found by the next collection.

The collector's state is the process's while the pauses come from several threads (callers,
the writer thread, a restore), so pauses are counted under a lock: the first one switches
the collector off if it was on, the last one to end switches it on again, and a collector a
caller had switched off before any pause began stays off.

Pauses that keep overlapping (threads appending back to back, each waiting for another's
commit) would never all end, and the whole process, training code included, would run with
the collector off for as long as they last. So a stretch of overlapping pauses has a bound:
once it has kept the collector off for `MAX_OFF_S`, the next pause or resume switches it on
again, and it stays on until that stretch has ended (the next stretch pauses afresh). One
pause can last long too (an append waiting up to its busy timeout for another process's
write lock), with no pause or resume to apply the bound: a daemon thread, started by the
first pause, applies it twice per `MAX_OFF_S` (it costs the append path nothing), except
while a pause that is long by its own work lasts (`paused(long=True)`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
from collections.abc import Iterator

MAX_OFF_S = 1.0
"""The longest one stretch of overlapping pauses keeps the collector off."""

_lock = threading.Lock()
_pauses = 0
_was_enabled = False
_off_since = 0.0
_long = 0
"""Pauses of a whole restore, rebuild fold or export (`paused(long=True)`): their length is
their work's, not a wait, so the watchdog leaves them be."""
_watching = False
"""Whether this process's watchdog thread runs (a forked child starts its own)."""


def _watch() -> None:
    """Apply the bound to a pause that outlasts it with no pause or resume meanwhile."""
    while True:
        time.sleep(MAX_OFF_S / 2)
        with _lock:
            if _pauses and not _long:
                _bounded()


def _start_watching() -> None:
    global _watching
    _watching = True
    threading.Thread(target=_watch, name="eventlog-collector-bound", daemon=True).start()


def _forked() -> None:
    """A child of fork has none of its parent's threads, so none of their pauses: they are
    dropped (the collector on again if the stretch switched it off), the child starts its
    own watchdog at its first pause, and gets a lock no parent thread can be holding."""
    global _watching, _lock, _pauses, _long
    if _pauses and _was_enabled:
        gc.enable()
    _watching, _lock, _pauses, _long = False, threading.Lock(), 0, 0


os.register_at_fork(after_in_child=_forked)


def pause() -> None:
    """Begin a pause; every `pause` must be ended by one `resume` (in a `finally`)."""
    global _pauses, _was_enabled, _off_since
    with _lock:
        if not _watching:
            _start_watching()
        if _pauses == 0:
            _was_enabled = gc.isenabled()
            if _was_enabled:
                gc.disable()
                _off_since = time.monotonic()
        else:
            _bounded()
        _pauses += 1


def resume() -> None:
    """End a pause; the last one to end restores the collector as the first one found it."""
    global _pauses
    with _lock:
        _pauses -= 1
        if _pauses == 0 and _was_enabled:
            gc.enable()
        elif _pauses:
            _bounded()


def _bounded() -> None:
    """Switch the collector on again once this stretch has kept it off for MAX_OFF_S."""
    if _was_enabled and time.monotonic() - _off_since >= MAX_OFF_S:
        gc.enable()


@contextlib.contextmanager
def paused(*, long: bool = False) -> Iterator[None]:
    """No cyclic garbage collection inside (nor while another thread's pause lasts).

    `long`: the block is long by its own work (a restore, a rebuild, an export), not by
    waiting: the watchdog does not switch the collector on while it lasts."""
    global _long
    pause()
    if long:
        with _lock:
            _long += 1
    try:
        yield
    finally:
        if long:
            with _lock:
                _long -= 1
        resume()
