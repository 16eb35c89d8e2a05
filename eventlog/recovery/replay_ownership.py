"""Replay ownership: who owns a finalized group until it trains or is evicted (docs/design.md §3).

Every command names groups by id, never by buffer position, so a removal computed before an
`await` still removes exactly the groups it meant even if other removals shifted positions in
between. Removals (`consume`, `evict`) skip ids that are already gone and say which ones they
removed: a concurrent task may legitimately have taken them first.

A removal also frees the group's canonical rows: RowsCleared goes into the same append as
ReplayConsumed / ReplayEvicted, and the rows are deleted after it (log first, delete after).

Each command has an asyncio form (`select_async`, ...): it awaits the log's group commit, so
it shares commits with the ledger's commands on groups, and deletes the rows in a thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from eventlog.dataplane.protocol import DataPlane
from eventlog.events import Event
from eventlog.recovery.barrier import Cut
from eventlog.recovery.vocabulary import (
    REPLAY_STREAM,
    ReplayConsumed,
    ReplayEvicted,
    ReplayReleased,
    ReplaySelected,
    RowsCleared,
)
from projections.siblings import LedgerState, ReplayEntry, ReplayStatus

Append = tuple[str, None, Sequence[Event]]
Commit = Callable[[Cut, Sequence[Append]], object]
"""The ledger's one commit path: validate by folding, append atomically, adopt."""
CommitAsync = Callable[[Cut, Callable[[], Sequence[Append]]], Awaitable[object]]
"""The same, awaiting the group commit; the appends are asked for again if it had to wait."""


class ReplayOwnership:
    """The `replay` stream's commands, on the ledger's state and through its commit path."""

    def __init__(
        self,
        state: Callable[[], LedgerState],
        commit: Commit,
        data_plane: DataPlane | None = None,
        partition: Callable[[], str] | None = None,
        *,
        commit_async: CommitAsync | None = None,
    ) -> None:
        self._state = state
        self._commit = commit
        self._commit_async = commit_async
        self._data_plane = data_plane
        self._partition = partition
        """The canonical rows' partition (None, or no data plane: rows are not cleared)."""

    def _cleared(self, event: Event) -> list[RowsCleared]:
        """The canonical rows a consume or evict frees, as the event that records them."""
        if self._data_plane is None or self._partition is None:
            return []
        if isinstance(event, ReplayConsumed):
            gids, reason, step = event.group_ids, f"trained at step {event.step}", event.step
        elif isinstance(event, ReplayEvicted):
            gids, reason, step = event.group_ids, f"evicted: {event.reason}", None
        else:
            return []
        replay = self._state().replay
        keys = [k for gid in gids if gid in replay for k in replay[gid].canonical_row_ids]
        if not keys:
            return []
        return [
            RowsCleared(
                partition=self._partition(), keys=keys, reason=reason, step=step, group_ids=gids
            )
        ]

    def entries(self, status: ReplayStatus | None = None) -> list[ReplayEntry]:
        """Owned groups in finalization order (optionally only those in `status`)."""
        replay = self._state().replay
        return [e for e in replay.values() if status is None or e.status == status]

    def _append(self, cut: Cut, event: Event) -> None:
        cleared = self._cleared(event)
        self._commit(cut, [(REPLAY_STREAM, None, [event, *cleared])])
        for rows in cleared:
            assert self._data_plane is not None
            self._data_plane.delete_rows(rows.partition, rows.keys)

    async def _append_async(self, cut: Cut, event: Callable[[], Event | None]) -> Event | None:
        """`_append` awaiting the commit; `event` decides again after a wait (None: nothing)."""
        if self._commit_async is None:
            raise TypeError("this replay buffer was made without an asyncio commit path")
        chosen: list[Event | None] = [None]
        cleared: list[RowsCleared] = []

        def appends() -> list[Append]:
            chosen[0] = found = event()
            cleared[:] = [] if found is None else self._cleared(found)
            return [] if found is None else [(REPLAY_STREAM, None, [found, *cleared])]

        await self._commit_async(cut, appends)
        for rows in cleared:
            assert self._data_plane is not None
            await asyncio.to_thread(self._data_plane.delete_rows, rows.partition, rows.keys)
        return chosen[0]

    def select(self, cut: Cut, group_ids: Sequence[str], *, step: int) -> None:
        """Pick ready groups to train `step`; every id must be owned and ready."""
        self._append(cut, ReplaySelected(group_ids=list(group_ids), step=step))

    def release(self, cut: Cut, group_ids: Sequence[str], *, reason: str) -> None:
        """Return selected groups to the buffer untrained."""
        self._append(cut, ReplayReleased(group_ids=list(group_ids), reason=reason))

    def _present(self, group_ids: Sequence[str]) -> list[str]:
        """The ids the buffer still owns: one already removed by someone else is skipped (that
        is the point of ids); the status an owned one must be in is the fold's rule."""
        replay = self._state().replay
        return [gid for gid in dict.fromkeys(group_ids) if gid in replay]

    def consume(self, cut: Cut, group_ids: Sequence[str], *, step: int) -> list[str]:
        """Selected groups trained at `step`; returns the ids removed (absent ones skipped)."""
        present = self._present(group_ids)
        if present:
            self._append(cut, ReplayConsumed(group_ids=present, step=step))
        else:
            self._commit(cut, [])  # nothing to remove: the cut is checked all the same
        return present

    def evict(self, cut: Cut, group_ids: Sequence[str], *, reason: str) -> list[str]:
        """Drop ready groups untrained; returns the ids removed (absent ones skipped)."""
        present = self._present(group_ids)
        if present:
            self._append(cut, ReplayEvicted(group_ids=present, reason=reason))
        else:
            self._commit(cut, [])  # nothing to remove: the cut is checked all the same
        return present

    # -- the asyncio forms ------------------------------------------------------------------

    async def select_async(self, cut: Cut, group_ids: Sequence[str], *, step: int) -> None:
        """`select`, awaiting the group commit."""
        ids = list(group_ids)
        await self._append_async(cut, lambda: ReplaySelected(group_ids=ids, step=step))

    async def release_async(self, cut: Cut, group_ids: Sequence[str], *, reason: str) -> None:
        """`release`, awaiting the group commit."""
        ids = list(group_ids)
        await self._append_async(cut, lambda: ReplayReleased(group_ids=ids, reason=reason))

    async def consume_async(self, cut: Cut, group_ids: Sequence[str], *, step: int) -> list[str]:
        """`consume`, awaiting the group commit; the ids it removed (absent ones skipped)."""

        def event() -> Event | None:
            present = self._present(group_ids)
            return ReplayConsumed(group_ids=present, step=step) if present else None

        done = await self._append_async(cut, event)
        return list(done.group_ids) if isinstance(done, ReplayConsumed) else []

    async def evict_async(self, cut: Cut, group_ids: Sequence[str], *, reason: str) -> list[str]:
        """`evict`, awaiting the group commit; the ids it removed (absent ones skipped)."""

        def event() -> Event | None:
            present = self._present(group_ids)
            return ReplayEvicted(group_ids=present, reason=reason) if present else None

        done = await self._append_async(cut, event)
        return list(done.group_ids) if isinstance(done, ReplayEvicted) else []
