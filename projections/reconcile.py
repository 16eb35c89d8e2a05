"""Ledger state x the staging keys the data plane holds -> keep / clear / missing.

Ownership is the union of the staging keys of every sealed current attempt. A referenced key
the data plane lacks is missing (restore must fail closed: training on a sealed sibling whose
tokens are gone would be silent data loss). A key nobody references is cleared; it is reported
as a row of a known attempt when a `TokensStaged` event names it, and as never staged otherwise
(something wrote to the staging partition outside the protocol).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from eventlog.events import Event
from eventlog.recovery.vocabulary import ClearedKey, TokensStaged
from projections.siblings import LedgerState, RuleViolation


class RowOwner(msgspec.Struct, frozen=True, kw_only=True):
    """The sealed attempt that owns a staging key."""

    group_id: str
    generation_index: int
    attempt: int
    rollout_id: str


class MissingRow(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    owner: RowOwner


class Reconciliation(msgspec.Struct, frozen=True, kw_only=True):
    """The verdict for one partition; keys sorted so equal inputs give equal verdicts."""

    partition: str
    keep: list[str]
    missing: list[MissingRow]
    clear_of_attempts: list[ClearedKey]
    clear_never_staged: list[str]

    @property
    def clear(self) -> list[str]:
        """Every key to delete from the data plane."""
        return sorted([c.key for c in self.clear_of_attempts] + self.clear_never_staged)


def referenced_keys(state: LedgerState) -> dict[str, RowOwner]:
    """Every staging key a sealed current attempt owns; a key owned twice is a rule violation."""
    owners: dict[str, RowOwner] = {}
    for group in state.groups.values():
        for sibling in group.siblings:
            current = sibling.current
            for key in current.staging_keys:
                owner = RowOwner(
                    group_id=group.group_id,
                    generation_index=sibling.generation_index,
                    attempt=current.attempt,
                    rollout_id=current.rollout_id,
                )
                other = owners.setdefault(key, owner)
                if other is not owner:
                    raise RuleViolation(
                        f"staging key {key!r} is owned by both {other.rollout_id!r} and "
                        f"{owner.rollout_id!r}",
                        group_id=group.group_id,
                        generation_index=sibling.generation_index,
                        attempt=current.attempt,
                    )
    return owners


def staged_by(events: Iterable[Event], partition: str) -> dict[str, str]:
    """staging key -> rollout id, from the workers' TokensStaged events for `partition`."""
    return {
        ev.staging_key: ev.rollout_id
        for ev in events
        if isinstance(ev, TokensStaged) and ev.partition == partition
    }


def reconcile(
    state: LedgerState,
    present: Iterable[str],
    staged: Mapping[str, str],
    partition: str,
) -> Reconciliation:
    """Compare what the ledger owns with what the data plane holds in `partition`."""
    owners = referenced_keys(state)
    held = set(present)
    missing = [MissingRow(key=k, owner=owners[k]) for k in sorted(owners) if k not in held]
    unreferenced = sorted(held.difference(owners))
    return Reconciliation(
        partition=partition,
        keep=sorted(held.intersection(owners)),
        missing=missing,
        clear_of_attempts=[
            ClearedKey(key=k, rollout_id=staged[k]) for k in unreferenced if k in staged
        ],
        clear_never_staged=[k for k in unreferenced if k not in staged],
    )
