"""What tests run in worker processes: importable by name, as a worker needs them."""

from __future__ import annotations

import os
import signal
import sys
import time


def nothing() -> None:
    """A worker's setup that sets nothing up."""


def exit_now(state: None, code: int) -> int:
    """Die mid-chunk, as a worker the OOM killer takes."""
    os._exit(code)


def exit_if_negative(state: None, n: int) -> int:
    """`n`, or die mid-chunk when it is negative."""
    if n < 0:
        os._exit(3)
    return n


def interrupt_self(state: None, n: int) -> int:
    """Ctrl-C this worker, then go on."""
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
    return n


def pid_after(state: None, seconds: float) -> int:
    """This worker's pid, after a while."""
    time.sleep(seconds)
    return os.getpid()


def main() -> None:
    """A command that starts a worker and waits on it: it prints the worker's pid, then is
    killed by the test (argv[1]: the seconds the worker's task lasts; argv[2], if given: a
    folder the worker removes when orphaned, as export's spool folder)."""
    import functools
    from pathlib import Path

    from eventlog.cli.export import _remove
    from eventlog.cli.workers import Workers, portable_vocabulary

    vocabulary = portable_vocabulary()
    assert vocabulary is not None
    orphaned = functools.partial(_remove, Path(sys.argv[2])) if len(sys.argv) > 2 else None
    with Workers(1, vocabulary, nothing, pid_after, orphaned=orphaned) as pool:
        found = pool.map([0.0, float(sys.argv[1])])
        print(next(found), flush=True)
        next(found)


if __name__ == "__main__":
    main()
