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


def ctrl_c_held(state: None, arg: None) -> bool:
    """Whether this worker's thread blocks SIGINT."""
    return signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def pid_after(state: None, seconds: float) -> int:
    """This worker's pid, after a while."""
    time.sleep(seconds)
    return os.getpid()


def interrupt_a_starting_worker() -> None:
    """A command whose worker gets Ctrl-C while it starts (after its exec, before its
    initializer runs); the command ignores it and prints whether the worker, once started,
    holds Ctrl-C still."""
    import threading

    from eventlog.cli.workers import Workers, portable_vocabulary

    signal.signal(signal.SIGINT, lambda *_: None)
    vocabulary = portable_vocabulary()
    assert vocabulary is not None
    threading.Thread(target=_interrupt_first_worker, args=(os.getpid(),), daemon=True).start()
    with Workers(1, vocabulary, nothing, ctrl_c_held) as pool:
        print(next(pool.map([None])), flush=True)


def _interrupt_first_worker(parent: int) -> None:
    """SIGINT the first child of `parent` that runs a worker's interpreter (by its pid)."""
    while True:
        for task in os.listdir(f"/proc/{parent}/task"):
            with open(f"/proc/{parent}/task/{task}/children") as children:
                for pid in children.read().split():
                    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                        if b"spawn_main" in cmdline.read():
                            os.kill(int(pid), signal.SIGINT)
                            return
        time.sleep(0.001)


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
