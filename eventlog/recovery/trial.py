"""A trial of a ledger command: the fold writes into overlays, adopting copies only what changed.

A command validates by folding its events into a trial state and adopts the trial only once
the append is durable. Copying the whole state for each trial costs in proportion to the
groups held; an overlay over the live state costs in proportion to what the command changes:
reads fall through to the live mappings, writes and deletions stay in the overlay until
`adopt` applies them. Its `touched` keys are what the command's fold read or changed, so
commands whose keys are disjoint can be in flight together and adopt in either order: a fold
that checks one entity against another (a reserve against its admission's first group, an
admit against its members) conflicts with a command changing the one it only read.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Generic, TypeVar, cast

from projections.siblings import GroupState, LedgerState, ReplayEntry

K = TypeVar("K")
V = TypeVar("V")

_ABSENT = object()


class Overlay(MutableMapping[K, V], Generic[K, V]):
    """A mapping that reads through to `base` and keeps its own writes and deletions."""

    def __init__(self, base: MutableMapping[K, V]) -> None:
        self.base = base
        self.written: dict[K, V] = {}
        self.deleted: set[K] = set()
        self.read: set[K] = set()
        """Keys looked up (the fold reads by key only: it never iterates a trial)."""

    def __getitem__(self, key: K) -> V:
        self.read.add(key)
        found = self.written.get(key, _ABSENT)
        if found is not _ABSENT:
            return cast(V, found)
        if key in self.deleted:
            raise KeyError(key)
        return self.base[key]

    def __setitem__(self, key: K, value: V) -> None:
        self.written[key] = value
        self.deleted.discard(key)

    def __delitem__(self, key: K) -> None:
        if key not in self:
            raise KeyError(key)
        self.written.pop(key, None)
        if key in self.base:
            self.deleted.add(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(cast(K, key))
        if key in self.written:
            return True
        return key not in self.deleted and key in self.base

    def __iter__(self) -> Iterator[K]:
        # A dict's order: keys already in base keep their place, new ones follow.
        for key in self.base:
            if key not in self.deleted:
                yield key
        for key in self.written:
            if key not in self.base:
                yield key

    def __len__(self) -> int:
        added = sum(1 for key in self.written if key not in self.base)
        return len(self.base) - len(self.deleted) + added

    def touched(self) -> set[K]:
        """The keys read, written or deleted."""
        return set(self.written) | self.deleted | self.read

    def adopt(self) -> None:
        """Apply the writes and deletions to `base`."""
        for key in self.deleted:
            self.base.pop(key, None)
        self.base.update(self.written)


class Trial:
    """A ledger state to fold a command's events into, over the live `LedgerState`."""

    def __init__(self, live: LedgerState) -> None:
        self.live = live
        self.groups: Overlay[str, GroupState] = Overlay(live.groups)
        self.admissions: Overlay[str, tuple[str, ...]] = Overlay(live.admissions)
        self.replay: Overlay[str, ReplayEntry] = Overlay(live.replay)
        # The fold takes a LedgerState and only reads and assigns its mappings' items.
        self.state = LedgerState(
            groups=cast(dict[str, GroupState], self.groups),
            admissions=cast(dict[str, tuple[str, ...]], self.admissions),
            replay=cast(dict[str, ReplayEntry], self.replay),
        )

    def touched(self) -> frozenset[str]:
        """What the command's fold read or changed: ``group:<id>``, ``admission:<id>``,
        ``replay:<id>`` (the keys a command in flight holds)."""
        return frozenset(
            [f"group:{k}" for k in self.groups.touched()]
            + [f"admission:{k}" for k in self.admissions.touched()]
            + [f"replay:{k}" for k in self.replay.touched()]
        )

    def take(self, folded: LedgerState) -> None:
        """Write what `folded` changed: a state folded from a copy of this trial's live state
        (`LedgerState.copy`, values shared), whose events need not be folded again. A value
        not identical to the live one is written, a key it lacks is deleted."""
        pairs = (
            (self.groups, folded.groups),
            (self.admissions, folded.admissions),
            (self.replay, folded.replay),
        )
        for overlay, now in cast(tuple[tuple[Overlay[str, object], dict[str, object]], ...], pairs):
            live = overlay.base
            for key, value in now.items():
                if live.get(key, _ABSENT) is not value:
                    overlay[key] = value
            for key in [k for k in live if k not in now]:
                del overlay[key]

    def adopt(self) -> None:
        """Make the trial's changes live (only the keys it touched are written)."""
        for overlay in (self.groups, self.admissions, self.replay):
            overlay.adopt()

    def materialize(self) -> LedgerState:
        """A standalone state with the trial's changes (for a restore that starts over)."""
        return LedgerState(
            groups=dict(self.groups), admissions=dict(self.admissions), replay=dict(self.replay)
        )
