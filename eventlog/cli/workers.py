"""Worker processes for a read command's chunks: built in order, on as many CPUs as the host
lends, with what each chunk's result depends on made the same in every process.

A worker is a fresh interpreter (`spawn`: it inherits no thread, lock or open connection of
the command's process). It rebuilds the command's event types and upcasters by importable
name, and refuses to work when its vocabulary is not the command's: two processes that
decode a record differently would write a table no single process writes. An error raised in
a worker is carried back as itself (type, message, attributes), so the command reports it as
it would have without workers.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

import click

from eventlog import codec
from eventlog.cli.interrupts import STOPS, stops_deferred
from eventlog.cli.numbers import number
from eventlog.errors import EventLogError, rebuilt
from eventlog.events import event_type
from eventlog.log import EventLog

MAX_JOBS = 8
"""Workers started by default on a large host: past this, the database's reads and the one
process that writes the output leave more CPUs little to do."""

WORTH_CHUNKS = 25
"""Chunks from which a command starts workers unless told how many: on a shorter read
their start (~0.5 s each) costs more than they save (an export of 10^5 records, 10 chunks:
2.6 s with two, 2.0 s without)."""

IN_FLIGHT = 4
"""Results per worker submitted and not yet taken: what bounds memory (an export chunk's
tables are a few MB) while the consumer, writing in order, falls behind now and then."""

T = TypeVar("T")


def default_jobs() -> int:
    """The CPUs this process may run on (its affinity), at most MAX_JOBS."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_JOBS))


def seq_chunks(
    log: EventLog, low: int, last: int, size: int
) -> tuple[int, Iterator[tuple[int, int]]]:
    """The chunks of seqs low..last, `size` seqs each, made as they are taken, and how many
    there are at most. Each starts at the next seq the log holds: seqs have no gaps, but a
    damaged log may jump (a record at seq 2**63 - 1 made trillions of empty chunks, listed
    up front until memory ran out)."""

    def chunks() -> Iterator[tuple[int, int]]:
        start = low
        while start <= last:
            found = log.next_seq(start, last)
            if found is None:
                return
            start = found
            high = min(start + size - 1, last)
            yield start, high
            start = high + 1

    return max(0, -(-(last - low + 1) // size)), chunks()


def jobs_for(chunks: int, requested: int | None) -> int:
    """How many workers build `chunks` chunks: as many as asked for, else the default from
    WORTH_CHUNKS chunks on; never more than there are chunks (1: the command builds them)."""
    if requested is None:
        requested = default_jobs() if chunks >= WORTH_CHUNKS else 1
    return max(1, min(requested, chunks))


def jobs_option(work: str, chunk: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The `-j/--jobs N` option of a command whose `work` worker processes do, `chunk`
    records at a time."""
    return click.option(
        "-j",
        "--jobs",
        type=number(min=1),
        default=None,
        metavar="N",
        help=f"{work}, {chunk:,} records at a time (default: this host's CPUs, at most "
        f"{MAX_JOBS}, for {WORTH_CHUNKS * chunk:,} records or more; 1: all here).",
    )


def portable_vocabulary() -> dict[str, str] | None:
    """`codec.vocabulary()` by importable name (`module:qualname`, and a type's schema), or
    None when some part of it cannot be imported by name in another process (defined in
    `__main__` or inside a function): then no worker can decode as this process does."""
    named: dict[str, str] = {}
    for key, obj in codec.vocabulary().items():
        module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
        if not isinstance(module, str) or module == "__main__" or "<locals>" in qualname:
            return None
        if _attribute(sys.modules.get(module), qualname) is not obj:
            return None
        schema = getattr(obj, "schema", None)
        named[key] = f"{module}:{qualname}" + (f" v{schema}" if isinstance(schema, int) else "")
    return named


def _attribute(module: object, qualname: str) -> Any:
    """What `qualname` names in `module` (None when it names nothing there)."""
    found: Any = module
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found


class Carried:
    """An exception raised in a worker, as the command's process rebuilds it (its type
    decides the exit code, its message the error line; its traceback is a note, shown with
    --debug). Pickled as itself where that round-trips; else as its class, arguments and
    attributes (an error whose constructor takes keyword arguments); else as its text."""

    def __init__(self, exc: BaseException) -> None:
        exc.add_note(
            f"in worker process {os.getpid()}:\n" + "".join(traceback.format_tb(exc.__traceback__))
        )
        self.exc: BaseException | None = exc
        self.state: tuple[type[BaseException], tuple[Any, ...], dict[str, Any]] | None = None
        if _travels(exc):
            return
        self.exc = None
        self.state = (type(exc), exc.args, dict(vars(exc)))
        if not _travels(self.state):  # an attribute (a connection, a cursor) cannot travel
            notes = {"__notes__": [str(note) for note in exc.__notes__]}  # the traceback
            self.state = (EventLogError, (f"{type(exc).__name__}: {exc}",), notes)

    def rebuilt(self) -> BaseException:
        if self.exc is not None:
            return self.exc
        assert self.state is not None
        return rebuilt(*self.state)


def _travels(value: object) -> bool:
    try:
        pickle.loads(pickle.dumps(value))
    except Exception:
        return False
    return True


_setup_error: Carried | None = None
_state: Any = None


def _start(
    modules: list[str],
    vocabulary: dict[str, str],
    setup: Callable[[], Any],
    orphaned: Callable[[], object] | None = None,
) -> None:
    """A worker's initializer: imports the modules of the command's vocabulary, registers
    what importing them did not, then checks that nothing more came with the imports.
    Never raises (a failed initializer breaks the whole pool without saying why): every
    task raises it instead."""
    global _setup_error, _state
    # Ctrl-C reaches the whole process group: the command's process stops the pool, so a
    # worker would only print a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)  # held since its start (SIGTERM kills)
    threading.Thread(
        target=_exit_with_parent, args=(orphaned,), name="eventlog-worker-parent", daemon=True
    ).start()
    try:
        for module in modules:
            importlib.import_module(module)
        _register(vocabulary)
        found = portable_vocabulary() or {}
        if found != vocabulary:
            differ = sorted(
                key for key in {*vocabulary, *found} if vocabulary.get(key) != found.get(key)
            )
            raise EventLogError(
                "a worker process decodes records otherwise than this one "
                f"({', '.join(differ[:3])}{' ...' if len(differ) > 3 else ''})",
                hint="rerun with --jobs 1",
            )
        _state = setup()
    except Exception as exc:
        _setup_error = Carried(exc)


def _register(vocabulary: dict[str, str]) -> None:
    """Register each type and upcaster of the command's vocabulary that importing did not
    (the command registered it at run time, or from another module: --events-module names
    the module that registers, which need not be the one that defines)."""
    have = codec.vocabulary()
    for key, value in vocabulary.items():
        if key in have:  # the same, or another one the check below names
            continue
        module, _, qualname = value.split(" ")[0].partition(":")
        found = _attribute(importlib.import_module(module), qualname)
        if key.startswith("type "):
            event_type(found)
        else:  # "upcaster NAME vN" (a type's name may hold spaces)
            name, _, schema = key.removeprefix("upcaster ").rpartition(" v")
            codec.register_upcaster(name, int(schema))(found)


def _exit_with_parent(orphaned: Callable[[], object] | None = None) -> None:
    """A worker whose command was killed (a timeout, the OOM killer) ends too: nothing
    would take what it builds, and it holds the log open. What the command would have
    cleaned up on its way out, `orphaned()` does (every worker, its last act)."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        multiprocessing.connection.wait([parent.sentinel])
        if orphaned is not None:
            with contextlib.suppress(Exception):
                orphaned()
        os._exit(1)


def _task(fn: Callable[[Any, Any], T], arg: Any) -> T | Carried:
    if _setup_error is not None:
        return _setup_error
    try:
        return fn(_state, arg)
    except Exception as exc:
        return Carried(exc)


@contextlib.contextmanager
def _stops_held() -> Iterator[None]:
    """SIGINT and SIGTERM blocked in this thread meanwhile (a worker being spawned that lost
    its parent mid-hand-over printed a traceback of its own); delivered to the process's
    other threads, or once unblocked, the command still stops."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])  # read only
    try:  # a stop already pending is raised by the call that blocks: restore it then too
        signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _ready() -> None:
    """A task that only has its worker started (`Workers.start`)."""


def _pool_failed(exc: BaseException) -> EventLogError:
    return EventLogError(
        f"worker processes failed to start or stopped before their chunks were done ({exc})",
        hint="rerun with --jobs 1, or with fewer --jobs where memory is short",
    )


class Workers(Generic[T]):
    """`jobs` worker processes, each set up once by `setup()` (picklable; run in the
    worker), then mapping `fn(state, arg)` over arguments in order; `orphaned()` (picklable)
    runs in a worker whose command died."""

    def __init__(
        self,
        jobs: int,
        vocabulary: dict[str, str],
        setup: Callable[[], Any],
        fn: Callable[[Any, Any], T],
        orphaned: Callable[[], object] | None = None,
    ) -> None:
        modules = sorted({value.partition(":")[0] for value in vocabulary.values()})
        self.fn = fn
        self.jobs = jobs
        try:  # the pool's locks start multiprocessing's resource tracker, a process too
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=jobs,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start,
                initargs=(modules, vocabulary, setup, orphaned),
            )
        except OSError as exc:
            raise _pool_failed(exc) from exc

    def start(self) -> None:
        """Start every worker now (each would start at a submit that finds none idle), so
        that they set up while the command does other work."""
        for _ in range(self.jobs):
            self._submit(_ready)

    def map(self, args: Iterable[Any]) -> Iterator[T]:
        """`fn` of each argument, in their order. At most IN_FLIGHT per worker are submitted
        and not yet taken: workers run ahead of a slow consumer by that much, no more."""
        pending: deque[concurrent.futures.Future[T | Carried]] = deque()
        remaining = iter(args)
        for arg in remaining:
            pending.append(self._submit(_task, self.fn, arg))
            if len(pending) >= IN_FLIGHT * self.jobs:
                break
        while pending:
            try:
                found = pending.popleft().result()
            except concurrent.futures.process.BrokenProcessPool as exc:
                raise _pool_failed(exc) from exc
            if isinstance(found, Carried):
                raise found.rebuilt()
            yield found
            for arg in remaining:  # once the consumer took the result: it may fall behind
                pending.append(self._submit(_task, self.fn, arg))
                break

    def _submit(self, *call: Any) -> concurrent.futures.Future[Any]:
        """Submitting starts a worker when one is missing: that may fail too. A worker
        starts with Ctrl-C and SIGTERM held (it inherits this thread's signal mask) until its
        initializer ignores the one and unblocks both: one that came while it imported was a
        traceback of its own."""
        try:
            with _stops_held(), stops_deferred():
                return self._pool.submit(*call)
        except (concurrent.futures.process.BrokenProcessPool, OSError) as exc:
            raise _pool_failed(exc) from exc

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Workers[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
