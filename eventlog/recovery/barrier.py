"""The mutation barrier: many mutations at once, or one checkpoint alone (asyncio).

A checkpoint must see the ledger, the log and the data plane at one consistent point, so it
blocks new mutations, waits for the active ones to drain, and only then runs. A waiting
checkpoint already blocks new mutations, so a steady stream of mutations cannot starve it.

Each section hands out a ``Cut``: the capability every mutating command takes, checked with
``cut.require_live()`` so a command cannot run outside the section it was granted in.

A task (or a task it spawned) that holds a section and opens another would deadlock as soon as a
checkpoint is waiting: the inner section waits for the checkpoint, the checkpoint waits for the
outer section. Nesting is therefore refused outright, waiting checkpoint or not.

Release is synchronous and waiting keeps no state that outlives a cancellation, so a task cancelled
while waiting leaves the barrier as it found it.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

from eventlog.recovery.errors import BarrierError

__all__ = ["CHECKPOINT", "Cut", "LiveCut", "MutationBarrier"]

logger = logging.getLogger(__name__)

CHECKPOINT = "checkpoint"
"""The ``kind`` of the cut a checkpoint section hands out."""


class LiveCut(Protocol):
    """What a mutating command needs of a cut: that it is still live (a `Cut` is one)."""

    def require_live(self) -> None: ...


class Cut:
    """Proof that its holder is inside a barrier section; dead once the section exits."""

    __slots__ = ("_barrier", "_barrier_name", "_live", "kind", "serial")

    def __init__(self, kind: str, serial: int, barrier: MutationBarrier) -> None:
        self.kind = kind
        self.serial = serial
        self._barrier = barrier
        self._barrier_name = barrier.name
        self._live = True

    @property
    def barrier(self) -> MutationBarrier:
        """The barrier whose section handed out this cut."""
        return self._barrier

    @property
    def live(self) -> bool:
        """True while the section that handed out this cut is open."""
        return self._live

    @property
    def exclusive(self) -> bool:
        """True for a checkpoint's cut, False for a mutation's."""
        return self.kind == CHECKPOINT

    def require_live(self) -> None:
        """Raise BarrierError unless the section that handed out this cut is still open."""
        if not self._live:
            raise BarrierError(
                f"barrier {self._barrier_name!r}: cut #{self.serial} ({self.kind}) is stale: "
                "its section has exited",
                hint="take a new cut with `async with barrier.mutation(kind) as cut:`",
            )

    def _expire(self) -> None:
        self._live = False

    def __repr__(self) -> str:
        state = "live" if self._live else "stale"
        return f"Cut(kind={self.kind!r}, serial={self.serial}, {state})"


class MutationBarrier:
    """Shared mutation sections and exclusive checkpoint sections, with checkpoint priority."""

    def __init__(self, name: str = "ledger") -> None:
        self.name = name
        self._active_mutations = 0
        self._checkpoint_active = False
        self._waiting_checkpoints = 0
        self._waiters: set[asyncio.Future[None]] = set()
        self._serials = itertools.count(1)
        # The cut the current task is inside of. Child tasks inherit a copy of the context, so
        # a task spawned inside a section is refused too while that section is open.
        self._current: contextvars.ContextVar[Cut | None] = contextvars.ContextVar(
            f"eventlog_barrier_{name}_{id(self)}", default=None
        )

    @property
    def active_mutations(self) -> int:
        """Mutation sections open right now."""
        return self._active_mutations

    @property
    def checkpoint_active(self) -> bool:
        """Whether a checkpoint section is open right now."""
        return self._checkpoint_active

    @property
    def waiting_checkpoints(self) -> int:
        """Checkpoints waiting for mutations to drain (each blocks new mutations)."""
        return self._waiting_checkpoints

    def mutation(self, kind: str) -> _Section:
        """A shared section for one mutating command; waits while a checkpoint runs or waits."""
        if not isinstance(kind, str) or not kind or kind == CHECKPOINT:
            raise BarrierError(
                f"barrier {self.name!r}: mutation kind must be a non-empty name other than "
                f"{CHECKPOINT!r}, found {kind!r}"
            )
        return _Section(self, kind)

    def checkpoint(self) -> _Section:
        """The exclusive section: blocks new mutations, drains active ones, then enters."""
        return _Section(self, CHECKPOINT)

    def require_own(self, cut: object) -> Cut:
        """`cut`, if it is a live cut this barrier handed out; else BarrierError.

        What a holder of state guarded by this barrier checks: a cut of another barrier (or
        an object that merely has a `require_live` method) proves nothing about this one.
        """
        if not isinstance(cut, Cut):
            raise BarrierError(
                f"barrier {self.name!r}: expected a cut this barrier handed out, found a "
                f"{type(cut).__name__}",
                hint="take one with `async with barrier.mutation(kind) as cut:`",
            )
        if cut.barrier is not self:
            raise BarrierError(
                f"barrier {self.name!r}: cut #{cut.serial} ({cut.kind}) was handed out by "
                f"another barrier ({cut.barrier.name!r}); it does not hold this one",
                hint="pass a cut of the barrier this ledger is bound to",
            )
        cut.require_live()
        return cut

    def __repr__(self) -> str:
        return (
            f"MutationBarrier({self.name!r}, active_mutations={self._active_mutations}, "
            f"checkpoint_active={self._checkpoint_active}, "
            f"waiting_checkpoints={self._waiting_checkpoints})"
        )

    # -- internals used by _Section -------------------------------------------------------

    def _refuse_nested(self, kind: str) -> None:
        held = self._current.get()
        if held is not None and held.live:
            raise BarrierError(
                f"barrier {self.name!r}: cannot open a {kind} section inside the open {held.kind} "
                f"section of cut #{held.serial}; pass the cut you have",
                hint="a nested section deadlocks behind a waiting checkpoint",
            )

    def _may_mutate(self) -> bool:
        return not self._checkpoint_active and self._waiting_checkpoints == 0

    def _may_checkpoint(self) -> bool:
        return not self._checkpoint_active and self._active_mutations == 0

    async def _wait_until(self, ready: Callable[[], bool]) -> None:
        """Wait until ``ready()``; every state change wakes every waiter to re-check."""
        loop = asyncio.get_running_loop()
        while not ready():
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.add(waiter)
            try:
                await waiter
            finally:
                self._waiters.discard(waiter)

    def _wake_all(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _acquire(self, kind: str) -> Cut:
        self._refuse_nested(kind)
        if kind != CHECKPOINT:
            await self._wait_until(self._may_mutate)
            self._active_mutations += 1
        else:
            self._waiting_checkpoints += 1
            try:
                await self._wait_until(self._may_checkpoint)
            finally:
                # Cancelled or not, this checkpoint no longer waits: mutations it was holding
                # back must re-check.
                self._waiting_checkpoints -= 1
                self._wake_all()
            self._checkpoint_active = True
        cut = Cut(kind, next(self._serials), self)
        logger.debug("barrier %r: entered %r", self.name, cut)
        return cut

    def _release(self, cut: Cut) -> None:
        cut._expire()
        if cut.kind == CHECKPOINT:
            self._checkpoint_active = False
        else:
            self._active_mutations -= 1
        logger.debug("barrier %r: left %r", self.name, cut)
        self._wake_all()


class _Section:
    """``async with`` handle for one barrier section; single use."""

    __slots__ = ("_barrier", "_cut", "_kind", "_token")

    def __init__(self, barrier: MutationBarrier, kind: str) -> None:
        self._barrier = barrier
        self._kind = kind
        self._cut: Cut | None = None
        self._token: contextvars.Token[Cut | None] | None = None

    async def __aenter__(self) -> Cut:
        if self._cut is not None:
            raise BarrierError(f"barrier {self._barrier.name!r}: a section can be entered once")
        cut = await self._barrier._acquire(self._kind)
        self._cut = cut
        self._token = self._barrier._current.set(cut)
        return cut

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        cut, token = self._cut, self._token
        if cut is None or token is None:  # pragma: no cover - __aenter__ did not complete
            return
        self._token = None
        try:
            self._barrier._current.reset(token)
        except ValueError:  # exited in another context than it was entered in
            self._barrier._current.set(None)
        self._barrier._release(cut)
