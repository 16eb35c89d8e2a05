"""Group commit: concurrent appenders share one transaction and one fsync.

Callers (threads or asyncio tasks) queue a submission with a future. Whoever holds the
leader lock takes everything queued, commits it as one transaction, and resolves each
future with that submission's own result or error: the store validates submissions one by
one, so a rejected one adds nothing and costs the others nothing. A synchronous caller that
finds no commit in progress leads itself (no hand-off to another thread), taking what is
queued along; otherwise, and always for asyncio callers, the writer thread leads. A caller in
the main thread always commits its own alone, waiting for the leader lock if need be.
asyncio futures of one batch are resolved with a single wake-up of their loop, not one per
future.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import defaultdict
from concurrent.futures import Future
from typing import TypeAlias

from eventlog import collector, forks
from eventlog.errors import EventLogError, LogClosedError
from eventlog.records import AppendResult
from eventlog.store.base import LOG_CLOSED, Outcome, SqlStore, Submission

log = logging.getLogger(__name__)

Results = list[AppendResult]
_Waiter: TypeAlias = "Future[Results] | asyncio.Future[Results]"
_Item = tuple[Submission, _Waiter]


class GroupCommitWriter:
    """One writer thread per open log; batches are bounded by `max_batch_events`."""

    def __init__(self, store: SqlStore, max_batch_events: int = 20_000) -> None:
        self._store = store
        self._max_batch_events = max_batch_events
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self._leader = threading.Lock()
        """Held while a batch is being written: one transaction at a time per log."""
        self._thread = self._start()
        forks.watch(self)
        self.batches = 0
        """Transactions committed so far (the benchmarks report events per commit)."""
        self.cpu_seconds = 0.0
        """CPU time the writer thread spent writing (waiting for fsync costs none); commits
        a caller leads count in its caller's time (`EventLog.cpu_seconds`)."""

    def _start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="eventlog-writer", daemon=True)
        thread.start()
        return thread

    def after_fork_in_child(self) -> None:
        """The writer thread, a caller leading a commit and the callers of what is queued
        are the parent's: the child starts with locks no one holds, an empty queue and a
        writer thread of its own (an append there waited for good)."""
        self._lock, self._leader = threading.Lock(), threading.Lock()
        self._queue = queue.SimpleQueue()
        if not self._closed:
            self._thread = self._start()

    def submit(self, submission: Submission) -> Future[Results]:
        """Queue a submission; the future resolves (or raises) after its transaction."""
        future: Future[Results] = Future()
        self._put((submission, future))
        return future

    def write(self, submission: Submission) -> Results:
        """Commit a submission and wait for it, leading the commit when nobody else is.

        A leader does not queue its own submission: waking the writer thread through the
        queue cost more than the commit's own CPU (a GIL hand-off per append).
        """
        # The main thread, where Ctrl-C and SIGTERM land, waits for the leader lock and
        # commits its own submission alone: a stop while it waits leaves nothing queued to
        # land later, and one in its commit fails no other caller's (leading the queued
        # ones, it handed them its stop, committed or not: retried, they were stored twice).
        # So the stop's caller asks the log (`EventLog.seq_of`) whether its append landed.
        in_main = threading.current_thread() is threading.main_thread()
        if in_main:
            self._leader.acquire()
        elif not self._leader.acquire(blocking=False):
            return self.submit(submission).result()
        try:
            if self._closed:  # checked under the leader lock, which `close` waits for
                raise LogClosedError(LOG_CLOSED)
            if in_main or self._queue.empty():  # no future to build, settle and wait on
                return self._commit_alone(submission)
            queued, _ = self._drain([], sum([len(r.events) for r in submission]))
            if not queued:
                return self._commit_alone(submission)
            future: Future[Results] = Future()
            # Others' events, which no pause of their callers covers (an asyncio caller's
            # ended once it queued) and a caller of a few events took none for its own.
            with collector.paused():
                self._commit([(submission, future), *queued])
        finally:
            self._leader.release()
        return future.result()

    def _commit_alone(self, submission: Submission) -> Results:
        try:
            outcome = self._store.write([submission])[0]
            self.batches += 1
        except BaseException as exc:
            if _unexpected(exc):
                log.exception("append batch failed")
            raise
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def submit_async(self, submission: Submission) -> asyncio.Future[Results]:
        """Queue a submission from a running loop; the future resolves on that loop."""
        future: asyncio.Future[Results] = asyncio.get_running_loop().create_future()
        self._put((submission, future))
        return future

    def _put(self, item: _Item) -> None:
        with self._lock:
            if self._closed:
                raise LogClosedError(LOG_CLOSED)
            self._queue.put(item)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            with self._leader:  # paused once leading, not while a caller's commit lasts (a
                collector.pause()  # caller leading others' queued events pauses in `write`;
                started = time.thread_time()  # its CPU counts as its caller's)
                try:
                    items, stop = self._drain([first])
                    self._commit(items)
                finally:
                    self.cpu_seconds += time.thread_time() - started
                    collector.resume()
            if stop:
                return

    def _drain(self, items: list[_Item], size: int = 0) -> tuple[list[_Item], bool]:
        """Take what is queued, up to the batch bound; True when the stop marker was seen."""
        size += sum(len(r.events) for submission, _ in items for r in submission)
        while size < self._max_batch_events and not self._queue.empty():
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                # Only the writer thread stops: a caller leading this batch hands it back.
                if threading.current_thread() is not self._thread:
                    self._queue.put(None)
                    break
                return items, True
            items.append(item)
            size += sum(len(r.events) for r in item[0])
        return items, False

    def _commit(self, items: list[_Item]) -> None:
        outcomes: list[Outcome | BaseException]
        try:
            outcomes = list(self._store.write([submission for submission, _ in items]))
            self.batches += 1
        except BaseException as exc:  # the whole transaction failed: everyone learns why
            if _unexpected(exc):
                log.exception("append batch failed")
            else:  # typed (a storage error), or a stop (Ctrl-C): the callers report it
                log.debug("append batch of %d failed: %s", len(items), repr(exc))
            outcomes = [exc] * len(items)
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Results], object]]]
        by_loop = defaultdict(list)
        for (_, waiter), outcome in zip(items, outcomes, strict=True):
            if isinstance(waiter, asyncio.Future):
                by_loop[waiter.get_loop()].append((waiter, outcome))
            elif isinstance(outcome, BaseException):
                waiter.set_exception(outcome)
            else:
                waiter.set_result(outcome)
        for loop, settled in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle, settled)
            except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
                log.debug("event loop closed before %d appends were settled", len(settled))

    def close(self) -> None:
        """Finish what was submitted, then stop the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
        self._thread.join()
        with self._leader:  # a caller leading its own commit finishes before the store closes
            pass


def _unexpected(exc: BaseException) -> bool:
    """An error no caller reports with its cause: logged with its traceback. A typed error
    and a stop (Ctrl-C, SIGTERM: a KeyboardInterrupt) are not: the traceback of an
    interrupted commit was printed beside the command's one line."""
    return isinstance(exc, Exception) and not isinstance(exc, EventLogError)


def _settle(settled: list[tuple[asyncio.Future[Results], object]]) -> None:
    """On the caller's loop: resolve every future of one batch (skipping cancelled ones)."""
    for future, outcome in settled:
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)  # type: ignore[arg-type]
