"""Replay ownership: who owns a finalized group until it trains or is evicted (design §4).

Every command names groups by id, never by buffer position, so a removal computed before an
`await` still removes exactly the groups it meant even if other removals shifted positions in
between. Removals (`consume`, `evict`) skip ids that are already gone and say which ones they
removed: a concurrent task may legitimately have taken them first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from eventlog.events import Event
from eventlog.recovery.errors import LedgerRuleError
from eventlog.recovery.vocabulary import (
    REPLAY_STREAM,
    ReplayConsumed,
    ReplayEvicted,
    ReplayReleased,
    ReplaySelected,
)
from projections.siblings import ReplayEntry, ReplayStatus

if TYPE_CHECKING:
    from eventlog.recovery.ledger import Cut, RecoveryLedger


class ReplayOwnership:
    """The `replay` stream's commands, sharing the ledger's state, cut checks and log."""

    def __init__(self, ledger: RecoveryLedger) -> None:
        self._ledger = ledger

    def entries(self, status: ReplayStatus | None = None) -> list[ReplayEntry]:
        """Owned groups in finalization order (optionally only those in `status`)."""
        replay = self._ledger._require_state().replay
        return [e for e in replay.values() if status is None or e.status == status]

    def _append(self, cut: Cut, event: Event) -> None:
        self._ledger._commit(cut, [(REPLAY_STREAM, [event])])

    def select(self, cut: Cut, group_ids: Sequence[str], *, step: int) -> None:
        """Pick ready groups to train `step`; every id must be owned and ready."""
        self._append(cut, ReplaySelected(group_ids=list(group_ids), step=step))

    def release(self, cut: Cut, group_ids: Sequence[str], *, reason: str) -> None:
        """Return selected groups to the buffer untrained."""
        self._append(cut, ReplayReleased(group_ids=list(group_ids), reason=reason))

    def _present(self, group_ids: Sequence[str], status: ReplayStatus, action: str) -> list[str]:
        replay = self._ledger._require_state().replay
        present = []
        for gid in dict.fromkeys(group_ids):
            entry = replay.get(gid)
            if entry is None:
                continue  # already removed by someone else: that is the point of ids
            if entry.status != status:
                raise LedgerRuleError(f"group {gid!r}: cannot {action} while it is {entry.status}")
            present.append(gid)
        return present

    def consume(self, cut: Cut, group_ids: Sequence[str], *, step: int) -> list[str]:
        """Selected groups trained at `step`; returns the ids removed (absent ones skipped)."""
        present = self._present(group_ids, "selected", "consume")
        if present:
            self._append(cut, ReplayConsumed(group_ids=present, step=step))
        return present

    def evict(self, cut: Cut, group_ids: Sequence[str], *, reason: str) -> list[str]:
        """Drop ready groups untrained; returns the ids removed (absent ones skipped)."""
        present = self._present(group_ids, "ready", "evict")
        if present:
            self._append(cut, ReplayEvicted(group_ids=present, reason=reason))
        return present
