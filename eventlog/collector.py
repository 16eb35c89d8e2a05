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
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_pauses = 0
_was_enabled = False


def pause() -> None:
    """Begin a pause; every `pause` must be ended by one `resume` (in a `finally`)."""
    global _pauses, _was_enabled
    with _lock:
        if _pauses == 0:
            _was_enabled = gc.isenabled()
            if _was_enabled:
                gc.disable()
        _pauses += 1


def resume() -> None:
    """End a pause; the last one to end restores the collector as the first one found it."""
    global _pauses
    with _lock:
        _pauses -= 1
        if _pauses == 0 and _was_enabled:
            gc.enable()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No cyclic garbage collection inside (nor while another thread's pause lasts)."""
    pause()
    try:
        yield
    finally:
        resume()
