"""Group commit: concurrent appenders share one transaction and one fsync.

Callers (threads or asyncio tasks) hand a submission to the writer thread and wait on a
future. The thread takes everything queued, commits it as one transaction, and resolves
each future with that submission's own result or error: the store validates submissions
one by one, so a rejected one adds nothing and costs the others nothing.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future

from eventlog.errors import LogClosedError
from eventlog.store.base import Outcome, SqlStore, Submission

log = logging.getLogger(__name__)

_Item = tuple[Submission, "Future[Outcome]"]


class GroupCommitWriter:
    """One writer thread per open log; batches are bounded by `max_batch_events`."""

    def __init__(self, store: SqlStore, max_batch_events: int = 20_000) -> None:
        self._store = store
        self._max_batch_events = max_batch_events
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="eventlog-writer", daemon=True)
        self._thread.start()
        self.batches = 0
        """Transactions committed so far (the benchmarks report events per commit)."""

    def submit(self, submission: Submission) -> Future[Outcome]:
        future: Future[Outcome] = Future()
        with self._lock:
            if self._closed:
                raise LogClosedError("the log is closed")
            self._queue.put((submission, future))
        return future

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            items = [first]
            size = sum(len(r.events) for r in first[0])
            stop = False
            while size < self._max_batch_events:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                items.append(item)
                size += sum(len(r.events) for r in item[0])
            self._commit(items)
            if stop:
                return

    def _commit(self, items: list[_Item]) -> None:
        try:
            outcomes = self._store.write([submission for submission, _ in items])
        except BaseException as exc:  # the whole transaction failed: everyone learns why
            log.exception("append batch failed")
            for _, future in items:
                future.set_exception(exc)
            return
        self.batches += 1
        for (_, future), outcome in zip(items, outcomes, strict=True):
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def close(self) -> None:
        """Finish what was submitted, then stop the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
        self._thread.join()
