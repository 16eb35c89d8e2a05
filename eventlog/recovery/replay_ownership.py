"""Replay ownership: who owns a finalized group until it trains or is evicted (docs/design.md §3).

Every command names groups by id, never by buffer position, so a removal computed before an
`await` still removes exactly the groups it meant even if other removals shifted positions in
between. Removals (`consume`, `evict`) skip ids that are already gone and say which ones they
removed: a concurrent task may legitimately have taken them first.

A removal also frees the group's canonical rows: RowsCleared goes into the same append as
ReplayConsumed / ReplayEvicted, and the rows are deleted after it (log first, delete after).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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

Commit = Callable[[Cut, Sequence[tuple[str, None, Sequence[Event]]]], object]
"""The ledger's one commit path: validate by folding, append atomically, adopt."""


class ReplayOwnership:
    """The `replay` stream's commands, on the ledger's state and through its commit path."""

    def __init__(
        self,
        state: Callable[[], LedgerState],
        commit: Commit,
        data_plane: DataPlane | None = None,
        partition: Callable[[], str] | None = None,
    ) -> None:
        self._state = state
        self._commit = commit
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
        return present

    def evict(self, cut: Cut, group_ids: Sequence[str], *, reason: str) -> list[str]:
        """Drop ready groups untrained; returns the ids removed (absent ones skipped)."""
        present = self._present(group_ids)
        if present:
            self._append(cut, ReplayEvicted(group_ids=present, reason=reason))
        return present
