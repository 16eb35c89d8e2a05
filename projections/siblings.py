"""Per-group sibling/attempt state: the recovery ledger's state, folded from the log.

`fold(state, event)` is the only way this state changes, live and on rebuild alike (a rebuild's
`Folder` runs the same handlers over many events). It enforces
every rule of the ledger (docs/design.md §4) and raises `RuleViolation` on an event that breaks
one, so a hand-edited or out-of-order log cannot fold into a state the ledger would never have
produced.
The fold updates the container it is given (so a rebuild over 10^8 records does not copy a
1000-group dict per record) and changes it only once an event is known to be valid; take
`state.copy()` first to try events out. Group, sibling and attempt values are immutable.

A finalized group leaves the ledger and becomes a replay entry, owned by the replay buffer until
it is consumed by a train step or evicted; both are addressed by group id only.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable
from typing import Literal, TypedDict

import msgspec

from eventlog.events import Event
from eventlog.recovery.vocabulary import (
    AttemptFailed,
    AttemptRef,
    FinalizationRetryable,
    FinalizationStarted,
    FinalizationUnknown,
    Granularity,
    GroupAbandoned,
    GroupAdmitted,
    GroupDiscarded,
    GroupFinalized,
    GroupReserved,
    GroupSealed,
    PromptRef,
    Receipt,
    ReplayConsumed,
    ReplayEvicted,
    ReplayReleased,
    ReplaySelected,
    RetryPrepared,
    SealResult,
    SiblingsDispatched,
    SiblingSealed,
    UnsealedAbandoned,
    logical_id,
    parse_rollout_id,
    rollout_id_for,
)

AttemptStatus = Literal["reserved", "dispatched", "sealed", "failed", "abandoned"]
GroupStatus = Literal["generating", "ready_to_finalize", "finalizing", "finalization_unknown"]
Phase = Literal["reserved", "admitted"]
ReplayStatus = Literal["ready", "selected"]


class _Where(TypedDict, total=False):
    group_id: str
    generation_index: int
    attempt: int


class RuleViolation(ValueError):
    """An event (or a command's would-be event) breaks a ledger rule."""

    def __init__(
        self,
        message: str,
        *,
        group_id: str | None = None,
        generation_index: int | None = None,
        attempt: int | None = None,
    ) -> None:
        self.group_id = group_id
        self.generation_index = generation_index
        self.attempt = attempt
        where = []
        if group_id is not None:
            where.append(f"group {group_id!r}")
        if generation_index is not None:
            where.append(f"sibling {generation_index}")
        if attempt is not None:
            where.append(f"attempt {attempt}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)


class StaleAttempt(RuleViolation):
    """A result names an attempt that is no longer current (superseded, failed or abandoned).

    Carries both rollout ids, so the ledger can raise `StaleAttemptError` and the controller
    can record the rejection (`StaleResultRejected`) without parsing the message.
    """

    group_id: str
    generation_index: int

    def __init__(
        self,
        message: str,
        *,
        group_id: str,
        generation_index: int,
        rollout_id: str,
        current_rollout_id: str,
    ) -> None:
        super().__init__(message, group_id=group_id, generation_index=generation_index)
        self.rollout_id = rollout_id
        self.current_rollout_id = current_rollout_id


class AttemptState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One physical run of a sibling; only a sealed attempt carries a result."""

    attempt: int
    rollout_id: str
    status: AttemptStatus
    receipt: Receipt | None = None
    reward: float | None = None
    mask_sample: bool | None = None

    @property
    def staging_keys(self) -> tuple[str, ...]:
        """The rows this attempt owns: those of its receipt, while it is sealed."""
        if self.status != "sealed" or self.receipt is None:
            return ()
        return tuple(self.receipt.staging_keys)


class SiblingState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One generation slot; its attempts in order, the last one current."""

    generation_index: int
    attempts: tuple[AttemptState, ...]

    @property
    def current(self) -> AttemptState:
        return self.attempts[-1]


class GroupState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One prompt group as the ledger owns it, from reservation until it is finalized."""

    group_id: str
    admission_id: str
    prompt_ref: PromptRef
    prompt_id: str
    prompt_hash: str | None
    agent_name: str | None
    granularity: Granularity
    expected_generations: int
    target_step: int | None
    start_weight_version: int
    phase: Phase
    status: GroupStatus
    siblings: tuple[SiblingState, ...]
    finalization_owner: str | None = None

    def canonical_row_ids(self) -> list[str]:
        """The training rows a finalized group becomes: one per sibling, by logical id."""
        return [logical_id(self.group_id, i) for i in range(self.expected_generations)]

    def sibling(self, index: int) -> SiblingState:
        """Sibling `index`; an index outside the group breaks a rule (RuleViolation)."""
        if not 0 <= index < self.expected_generations:
            raise RuleViolation(
                f"no such sibling (the group has {self.expected_generations})",
                group_id=self.group_id,
                generation_index=index,
            )
        return self.siblings[index]

    def indices(self, *statuses: AttemptStatus) -> list[int]:
        """Generation indices whose current attempt has one of `statuses`."""
        return [s.generation_index for s in self.siblings if s.current.status in statuses]

    def staging_keys(self) -> list[str]:
        """Staging keys owned by the group's sealed current attempts, in sibling order."""
        return [key for s in self.siblings for key in s.current.staging_keys]


class ReplayEntry(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A finalized group the replay buffer owns until it trains (consumed) or is evicted."""

    group_id: str
    prompt_id: str
    target_step: int | None
    canonical_row_ids: tuple[str, ...]
    min_weight_version: int | None
    status: ReplayStatus = "ready"
    selected_step: int | None = None


class LedgerState(msgspec.Struct, kw_only=True):
    """Everything the ledger owns; serializable for snapshots, with a stable digest."""

    groups: dict[str, GroupState] = msgspec.field(default_factory=dict)
    admissions: dict[str, tuple[str, ...]] = msgspec.field(default_factory=dict)
    replay: dict[str, ReplayEntry] = msgspec.field(default_factory=dict)

    def copy(self) -> LedgerState:
        """A container that can be folded into without touching this one (values are shared)."""
        return LedgerState(
            groups=dict(self.groups), admissions=dict(self.admissions), replay=dict(self.replay)
        )

    def group(self, group_id: str) -> GroupState:
        found = self.groups.get(group_id)
        if found is None:
            where = " (finalized: the replay buffer owns it)" if group_id in self.replay else ""
            raise RuleViolation(f"not in the ledger{where}", group_id=group_id)
        return found


_ENCODER = msgspec.msgpack.Encoder(order="sorted")


def encode_state(state: LedgerState) -> bytes:
    """Canonical bytes of a state (map keys sorted): snapshot payload and digest input."""
    return _ENCODER.encode(state)


def state_digest(state: LedgerState) -> str:
    """sha256 of the canonical bytes: equal states have equal digests, in any process."""
    return hashlib.sha256(encode_state(state)).hexdigest()


# -- the fold ---------------------------------------------------------------------------------


def fold(state: LedgerState, event: Event) -> LedgerState:
    """Apply one event; events outside the ledger's vocabulary leave the state as it is."""
    handler = _HANDLERS.get(type(event))
    if handler is not None:
        handler(state, event)
    return state


def fold_all(state: LedgerState, events: Iterable[Event]) -> LedgerState:
    apply = Folder(state)
    for event in events:
        apply(event)
    return state


class Folder:
    """`fold` of many events into one state, in order: a rebuild's loop.

    The same handlers, rules and resulting state as `fold` of each event, except that it
    remembers per group what the group's sealed siblings own (`_Owners`), so a seal checks
    its receipt against them in the receipt's length rather than visiting every sibling
    (bench/README.md has what that saves). The memo is checked against
    the group it was built from before each use, so an event that replaced the group by any
    other way is seen; it is dropped when the group leaves the ledger.
    """

    def __init__(self, state: LedgerState) -> None:
        self.state = state
        self._owners: dict[str, _Owners] = {}

    def __len__(self) -> int:
        """The groups whose owned keys it holds: at most those in the ledger."""
        return len(self._owners)

    def __call__(self, event: Event) -> None:
        kind = type(event)
        if kind is SiblingSealed:
            _seal_sibling(self.state, event, self._owners)  # type: ignore[arg-type]
            return
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self.state, event)
            if kind in _LEAVING:
                self._owners.pop(event.group_id, None)  # type: ignore[attr-defined]


def _replace_sibling(group: GroupState, sibling: SiblingState) -> GroupState:
    return _replace_siblings(group, [sibling])


def _replace_siblings(group: GroupState, replacements: Iterable[SiblingState]) -> GroupState:
    """One new group for any number of changed siblings (not one copy per sibling)."""
    siblings = list(group.siblings)
    for sibling in replacements:
        siblings[sibling.generation_index] = sibling
    return msgspec.structs.replace(group, siblings=tuple(siblings))


def _with_current(sibling: SiblingState, attempt: AttemptState) -> SiblingState:
    return SiblingState(
        generation_index=sibling.generation_index, attempts=(*sibling.attempts[:-1], attempt)
    )


_SIBLING = Granularity.SIBLING
_ENDED: tuple[AttemptStatus, ...] = ("failed", "abandoned")
_DISPATCHED: tuple[AttemptStatus, ...] = ("dispatched",)
_RESERVED: tuple[AttemptStatus, ...] = ("reserved",)


def _named(group: GroupState, index: int, rollout_id: str, *allowed: AttemptStatus) -> AttemptState:
    """The current attempt of sibling `index`, if `rollout_id` names it and its status allows.

    The stale-attempt rule: an attempt that was superseded, or that failed or was abandoned
    (when `allowed` does not admit that), raises StaleAttempt; a rollout id the sibling never
    had, or another status, raises RuleViolation.
    """
    sibling = group.sibling(index)
    current = sibling.attempts[-1]
    if rollout_id == current.rollout_id and current.status in allowed:
        return current  # the common case, checked first: the rest only names what is wrong
    if rollout_id != current.rollout_id:
        for old in sibling.attempts[:-1]:
            if old.rollout_id == rollout_id:
                raise StaleAttempt(
                    f"attempt {old.attempt} ({rollout_id!r}) was superseded by attempt "
                    f"{current.attempt} ({current.rollout_id!r}); its result is rejected",
                    group_id=group.group_id,
                    generation_index=index,
                    rollout_id=rollout_id,
                    current_rollout_id=current.rollout_id,
                )
        parsed = parse_rollout_id(rollout_id)
        if (
            parsed is not None
            and (parsed.group_id, parsed.generation_index) == (group.group_id, index)
            and parsed.attempt < current.attempt
        ):
            # A number below the current one that this history never minted: a restore
            # rolled it back and skipped past it, so its result is late, not unknown.
            raise StaleAttempt(
                f"attempt {parsed.attempt} ({rollout_id!r}) was rolled back by a restore; "
                f"the current attempt is {current.attempt} ({current.rollout_id!r})",
                group_id=group.group_id,
                generation_index=index,
                rollout_id=rollout_id,
                current_rollout_id=current.rollout_id,
            )
        raise RuleViolation(
            f"unknown rollout id {rollout_id!r}, expected the current attempt "
            f"{current.attempt} ({current.rollout_id!r})",
            group_id=group.group_id,
            generation_index=index,
        )
    if current.status not in allowed:
        if current.status in _ENDED:
            raise StaleAttempt(
                f"attempt {current.attempt} ({rollout_id!r}) was {current.status}; "
                "its result is rejected",
                group_id=group.group_id,
                generation_index=index,
                rollout_id=rollout_id,
                current_rollout_id=current.rollout_id,
            )
        raise RuleViolation(
            f"attempt {current.attempt} is {current.status}, expected {' or '.join(allowed)}",
            group_id=group.group_id,
            generation_index=index,
        )
    return current


def live_attempt(group: GroupState, index: int, rollout_id: str) -> AttemptState:
    """The attempt a worker result names, while it may still be sealed or failed.

    For commands that must find the attempt before they build an event (its number goes into
    the event); the event's fold applies the same rule again.
    """
    return _named(group, index, rollout_id, "reserved", "dispatched", "sealed")


def _current(group: GroupState, ref: AttemptRef, *allowed: AttemptStatus) -> AttemptState:
    """The sibling's current attempt, checked to be exactly `ref` and in an allowed status."""
    return _current_at(group, ref.generation_index, ref.attempt, ref.rollout_id, allowed)


def _current_at(
    group: GroupState,
    index: int,
    attempt: int,
    rollout_id: str,
    allowed: tuple[AttemptStatus, ...],
) -> AttemptState:
    """`_current` for callers that hold the fields, not an AttemptRef (a seal's event).

    The common case (the current attempt is the one named, in an allowed status) is checked
    in place: a dispatch and a seal, a run's most frequent records, take it; `_named` runs
    (and names what is wrong) only when it fails.
    """
    siblings = group.siblings
    if 0 <= index < len(siblings):
        current = siblings[index].attempts[-1]
        if (
            current.rollout_id == rollout_id
            and current.attempt == attempt
            and current.status in allowed
        ):
            return current
    current = _named(group, index, rollout_id, *allowed)
    if attempt != current.attempt:
        raise RuleViolation(
            f"names attempt {attempt} ({rollout_id!r}) but the current attempt is "
            f"{current.attempt} ({current.rollout_id!r})",
            group_id=group.group_id,
            generation_index=index,
        )
    return current


def _require(group: GroupState, *, status: tuple[GroupStatus, ...], action: str) -> None:
    if group.status not in status:
        raise RuleViolation(
            f"cannot {action} while the group is {group.status} (expected {' or '.join(status)})",
            group_id=group.group_id,
        )


def require_granularity(group: GroupState, granularity: Granularity, action: str) -> None:
    """The seal-method rule: a `sibling` group seals one by one, a `prompt_group` all at once."""
    if group.granularity != granularity:
        hint = (
            "seal every sibling at once with seal_group"
            if granularity == "sibling"
            else "seal siblings one by one with seal_sibling"
        )
        raise RuleViolation(
            f"cannot {action}: the group's granularity is {group.granularity} ({hint})",
            group_id=group.group_id,
        )


def _unique_indices(group: GroupState, indices: list[int], what: str, *, every: bool) -> None:
    if not indices:
        raise RuleViolation(f"{what} names no sibling", group_id=group.group_id)
    if len(set(indices)) != len(indices):
        raise RuleViolation(f"{what} names a sibling twice: {indices}", group_id=group.group_id)
    if every and sorted(indices) != list(range(group.expected_generations)):
        raise RuleViolation(
            f"{what} must name every sibling 0..{group.expected_generations - 1} "
            f"(granularity prompt_group), found {sorted(indices)}",
            group_id=group.group_id,
        )


def _on_reserved(state: LedgerState, ev: GroupReserved) -> None:
    gid = ev.group_id
    if gid in state.groups:
        raise RuleViolation("is already reserved", group_id=gid)
    if gid in state.replay:
        raise RuleViolation("is already finalized; a group id is used once", group_id=gid)
    phase: Phase = "admitted" if ev.admitted else "reserved"
    members = state.admissions.get(ev.admission_id, ())
    if members:
        other = state.groups[members[0]]
        if (other.phase, other.target_step) != (phase, ev.target_step):
            raise RuleViolation(
                f"admission {ev.admission_id!r} is ({other.phase}, target_step="
                f"{other.target_step}) in group {other.group_id!r}, this group would be "
                f"({phase}, target_step={ev.target_step}): groups of one admission must agree",
                group_id=gid,
            )
    siblings = tuple(
        SiblingState(
            generation_index=i,
            attempts=(
                AttemptState(attempt=0, rollout_id=rollout_id_for(gid, i, 0), status="reserved"),
            ),
        )
        for i in range(ev.expected_generations)
    )
    state.groups[gid] = GroupState(
        group_id=gid,
        admission_id=ev.admission_id,
        prompt_ref=ev.prompt_ref,
        prompt_id=ev.prompt_id,
        prompt_hash=ev.prompt_hash,
        agent_name=ev.agent_name,
        granularity=ev.granularity,
        expected_generations=ev.expected_generations,
        target_step=ev.target_step,
        start_weight_version=ev.start_weight_version,
        phase=phase,
        status="generating",
        siblings=siblings,
    )
    state.admissions[ev.admission_id] = (*members, gid)


def _on_admitted(state: LedgerState, ev: GroupAdmitted) -> None:
    group = state.group(ev.group_id)
    if group.phase != "reserved":
        raise RuleViolation("is already admitted; admission happens once", group_id=group.group_id)
    if ev.admission_id != group.admission_id:
        raise RuleViolation(
            f"belongs to admission {group.admission_id!r}, not {ev.admission_id!r}",
            group_id=group.group_id,
        )
    for member in state.admissions.get(group.admission_id, ()):
        other = state.groups[member]
        if other.phase == "admitted" and other.target_step != ev.target_step:
            raise RuleViolation(
                f"admission {group.admission_id!r} already stamped group {member!r} with "
                f"target_step={other.target_step}, not {ev.target_step}",
                group_id=group.group_id,
            )
    state.groups[group.group_id] = msgspec.structs.replace(
        group,
        phase="admitted",
        target_step=ev.target_step,
        start_weight_version=ev.start_weight_version,
    )


def _on_dispatched(state: LedgerState, ev: SiblingsDispatched) -> None:
    group = state.group(ev.group_id)
    if group.phase != "admitted":
        raise RuleViolation("cannot dispatch before admission", group_id=group.group_id)
    _require(group, status=("generating",), action="dispatch")
    indices = [ref.generation_index for ref in ev.attempts]
    _unique_indices(group, indices, "dispatch", every=group.granularity == "prompt_group")
    before = group.siblings
    siblings = list(before)
    for ref in ev.attempts:
        index = ref.generation_index
        current = _current_at(group, index, ref.attempt, ref.rollout_id, _RESERVED)
        siblings[index] = SiblingState(
            generation_index=index,
            attempts=(
                *before[index].attempts[:-1],
                msgspec.structs.replace(current, status="dispatched"),
            ),
        )
    state.groups[group.group_id] = msgspec.structs.replace(group, siblings=tuple(siblings))


def _on_failed(state: LedgerState, ev: AttemptFailed) -> None:
    group = state.group(ev.group_id)
    _require(group, status=("generating",), action="record a failed attempt")
    ref = AttemptRef(
        generation_index=ev.generation_index, attempt=ev.attempt, rollout_id=ev.rollout_id
    )
    current = _current(group, ref, "dispatched")
    sibling = group.siblings[ev.generation_index]
    state.groups[group.group_id] = _replace_sibling(
        group, _with_current(sibling, msgspec.structs.replace(current, status="failed"))
    )


def _sealed(group: GroupState, result: SealResult | SiblingSealed) -> SiblingState:
    """The sibling with `result` sealed into its current attempt, if every seal rule holds.

    `result` is a GroupSealed's SealResult or the SiblingSealed event itself (same fields:
    building a SealResult per seal only to read it back cost a struct per record).
    """
    index = result.generation_index
    current = _current_at(group, index, result.attempt, result.rollout_id, _DISPATCHED)
    sealed = _sealed_attempt(group, result, current, _Owners(group))
    attempts = group.siblings[index].attempts
    return SiblingState(generation_index=index, attempts=(*attempts[:-1], sealed))


class _Owners:
    """Which sibling's sealed current attempt owns a staging key, and how many siblings are
    sealed, as of `group`: found by visiting the sealed siblings (one seal), or from an index
    of their keys kept seal by seal once `add` is called (a `Folder`'s memo, never state)."""

    __slots__ = ("_attempts", "_index", "group", "sealed")

    def __init__(self, group: GroupState) -> None:
        self.group = group
        self._attempts = [
            (s.generation_index, current)
            for s in group.siblings
            if (current := s.attempts[-1]).status == "sealed"
        ]
        self.sealed = len(self._attempts)
        self._index: dict[str, int] | None = None

    def owner(self, keys: list[str], index: int) -> int | None:
        """The first sibling in sibling order, other than `index`, that owns one of `keys`."""
        found = self._index
        if found is None:
            wanted = set(keys)
            for i, current in self._attempts:
                receipt = current.receipt
                if (
                    i != index
                    and receipt is not None
                    and not wanted.isdisjoint(receipt.staging_keys)
                ):
                    return i
            return None
        taken = [found[key] for key in keys if found.get(key, index) != index]
        return min(taken) if taken else None

    def add(self, group: GroupState, index: int, sealed: AttemptState) -> None:
        """`group` is the one before with sibling `index` now `sealed` (keys no other sibling
        owns: the seal checked them); from the first call on, owners come from the index."""
        if self._index is None:
            self._index = {}
            for i, current in reversed(self._attempts):  # a key named twice: the first's
                if current.receipt is not None:
                    self._index.update(dict.fromkeys(current.receipt.staging_keys, i))
            self._attempts = []
        self.group = group
        self.sealed += 1
        if sealed.receipt is not None:
            self._index.update(dict.fromkeys(sealed.receipt.staging_keys, index))


def _sealed_attempt(
    group: GroupState,
    result: SealResult | SiblingSealed,
    current: AttemptState,
    owners: _Owners,
) -> AttemptState:
    """`current` (already checked to be the attempt `result` names) with `result` sealed in,
    if the receipt, reward and mask_sample rules hold; `owners`: who owns the staging keys of
    the other siblings' sealed current attempts, which the receipt must not name."""
    receipt = result.receipt
    if receipt is not None:
        if receipt.rollout_id != result.rollout_id:
            raise RuleViolation(
                f"receipt names rollout {receipt.rollout_id!r}, expected {result.rollout_id!r}",
                **_where_of(group, result),
            )
        keys = receipt.staging_keys
        if len(set(keys)) != len(keys):
            raise RuleViolation(
                f"receipt lists a staging key twice: {keys}", **_where_of(group, result)
            )
        owner = owners.owner(keys, result.generation_index)
        if owner is not None:
            theirs = group.siblings[owner].attempts[-1]
            owned = sorted(set(keys).intersection(theirs.staging_keys))
            raise RuleViolation(
                f"receipt names staging keys {owned} that sibling {owner} "
                f"({theirs.rollout_id!r}) owns",
                **_where_of(group, result),
            )
    reward = result.reward
    if isinstance(reward, bool) or not math.isfinite(reward):
        raise RuleViolation(
            f"reward must be a finite number, found {reward!r}", **_where_of(group, result)
        )
    if not isinstance(result.mask_sample, bool):
        raise RuleViolation(
            f"mask_sample must be a bool, found {result.mask_sample!r}",
            **_where_of(group, result),
        )
    return AttemptState(
        attempt=current.attempt,
        rollout_id=current.rollout_id,
        status="sealed",
        receipt=receipt,
        reward=float(reward),
        mask_sample=result.mask_sample,
    )


def _where_of(group: GroupState, result: SealResult | SiblingSealed) -> _Where:
    return {
        "group_id": group.group_id,
        "generation_index": result.generation_index,
        "attempt": result.attempt,
    }


def _ready_if_complete(group: GroupState) -> GroupState:
    for s in group.siblings:
        if s.attempts[-1].status != "sealed":
            return group
    return msgspec.structs.replace(group, status="ready_to_finalize")


def _on_sibling_sealed(state: LedgerState, ev: SiblingSealed) -> None:
    _seal_sibling(state, ev, None)


def _seal_sibling(state: LedgerState, ev: SiblingSealed, memo: dict[str, _Owners] | None) -> None:
    """Seal one sibling; `memo` (a `Folder`'s) holds the `_Owners` of groups folded before,
    each used only while it is of the group as it stands, and gets this group's.

    The most frequent record of a run: the common case (a sibling group that is generating,
    its current attempt dispatched: `_current_at`) is checked in place, and the functions
    that own each rule run (and name what is wrong) only when it fails."""
    group = state.groups.get(ev.group_id) or state.group(ev.group_id)
    if group.granularity is not _SIBLING:
        require_granularity(group, Granularity.SIBLING, "seal one sibling")
    if group.status != "generating":
        _require(group, status=("generating",), action="seal")
    index = ev.generation_index
    siblings = group.siblings
    current = _current_at(group, index, ev.attempt, ev.rollout_id, _DISPATCHED)
    owners = memo.get(group.group_id) if memo is not None else None
    if owners is None or owners.group is not group:
        owners = _Owners(group)
    sealed = _sealed_attempt(group, ev, current, owners)
    replaced = list(siblings)
    replaced[index] = SiblingState(
        generation_index=index, attempts=(*siblings[index].attempts[:-1], sealed)
    )
    changed = msgspec.structs.replace(
        group,
        siblings=tuple(replaced),
        # Every other sibling's current attempt sealed, and now this one: ready.
        status="ready_to_finalize" if owners.sealed == len(siblings) - 1 else group.status,
    )
    state.groups[group.group_id] = changed
    if memo is not None:
        owners.add(changed, index, sealed)
        memo[group.group_id] = owners


def _on_group_sealed(state: LedgerState, ev: GroupSealed) -> None:
    group = state.group(ev.group_id)
    require_granularity(group, Granularity.PROMPT_GROUP, "seal the whole group")
    _require(group, status=("generating",), action="seal")
    _unique_indices(group, [r.generation_index for r in ev.results], "GroupSealed", every=True)
    attempts = {r.attempt for r in ev.results}
    if len(attempts) != 1:
        raise RuleViolation(
            f"GroupSealed mixes attempts {sorted(attempts)}; every sibling must come from the "
            "same attempt",
            group_id=group.group_id,
        )
    # Every result is validated against the unchanged group before anything changes.
    sealed = [_sealed(group, result) for result in ev.results]
    seen: dict[str, int] = {}
    for result in ev.results:
        for key in result.receipt.staging_keys if result.receipt else ():
            first = seen.setdefault(key, result.generation_index)
            if first != result.generation_index:
                raise RuleViolation(
                    f"staging key {key!r} is in the receipts of siblings {first} and "
                    f"{result.generation_index}; a row is owned by one sibling",
                    group_id=group.group_id,
                )
    state.groups[group.group_id] = _ready_if_complete(_replace_siblings(group, sealed))


def _abandon(group: GroupState, refs: list[AttemptRef], *allowed: AttemptStatus) -> GroupState:
    abandoned = []
    for ref in refs:
        current = _current(group, ref, *allowed)
        attempt = AttemptState(
            attempt=current.attempt, rollout_id=current.rollout_id, status="abandoned"
        )
        abandoned.append(_with_current(group.siblings[ref.generation_index], attempt))
    return _replace_siblings(group, abandoned)


def _on_unsealed_abandoned(state: LedgerState, ev: UnsealedAbandoned) -> None:
    group = state.group(ev.group_id)
    require_granularity(group, Granularity.SIBLING, "abandon single siblings")
    _require(group, status=("generating",), action="abandon")
    _unique_indices(
        group, [r.generation_index for r in ev.attempts], "UnsealedAbandoned", every=False
    )
    state.groups[group.group_id] = _abandon(group, ev.attempts, "reserved", "dispatched", "failed")


def _on_group_abandoned(state: LedgerState, ev: GroupAbandoned) -> None:
    group = state.group(ev.group_id)
    require_granularity(group, Granularity.PROMPT_GROUP, "abandon the whole group")
    _require(group, status=("generating",), action="abandon")
    _unique_indices(group, [r.generation_index for r in ev.attempts], "GroupAbandoned", every=True)
    state.groups[group.group_id] = _abandon(
        group, ev.attempts, "reserved", "dispatched", "failed", "abandoned"
    )


def _on_retry(state: LedgerState, ev: RetryPrepared) -> None:
    group = state.group(ev.group_id)
    _require(group, status=("generating",), action="prepare a retry")
    indices = [r.generation_index for r in ev.attempts]
    if group.granularity == "prompt_group":
        live = group.indices("reserved", "dispatched")
        if live and len(live) < group.expected_generations:
            raise RuleViolation(
                f"prompt_group retries every sibling together, but siblings {live} are still "
                f"live while {group.indices('failed', 'abandoned')} ended; abandon_unsealed first",
                group_id=group.group_id,
            )
    _unique_indices(group, indices, "RetryPrepared", every=group.granularity == "prompt_group")
    numbers = {ref.attempt for ref in ev.attempts}
    if group.granularity == "prompt_group" and len(numbers) != 1:
        raise RuleViolation(
            f"RetryPrepared mints attempts {sorted(numbers)}; under prompt_group every sibling "
            "reruns as the same attempt",
            group_id=group.group_id,
        )
    retried: list[SiblingState] = []
    for ref in ev.attempts:
        sibling = group.sibling(ref.generation_index)
        current = sibling.current
        where: _Where = {"group_id": group.group_id, "generation_index": ref.generation_index}
        if current.status not in ("failed", "abandoned"):
            raise RuleViolation(
                f"cannot retry from attempt {current.attempt} while it is {current.status} "
                "(only a failed or abandoned attempt is retried)",
                **where,
            )
        # Numbers only grow. A gap is legal: a restore skips numbers that rolled-back
        # history already used, so a rollout id never names two physical runs.
        expected = rollout_id_for(group.group_id, ref.generation_index, ref.attempt)
        if ref.attempt <= current.attempt or ref.rollout_id != expected:
            raise RuleViolation(
                f"the next attempt must be numbered above {current.attempt} and named "
                f"{expected!r}, found {ref.attempt} ({ref.rollout_id!r})",
                **where,
            )
        fresh = AttemptState(attempt=ref.attempt, rollout_id=ref.rollout_id, status="reserved")
        retried.append(
            SiblingState(generation_index=ref.generation_index, attempts=(*sibling.attempts, fresh))
        )
    state.groups[group.group_id] = _replace_siblings(group, retried)


def _on_finalization_started(state: LedgerState, ev: FinalizationStarted) -> None:
    group = state.group(ev.group_id)
    if group.status == "finalizing":
        raise RuleViolation(
            f"is already being finalized by {group.finalization_owner!r}", group_id=group.group_id
        )
    _require(group, status=("ready_to_finalize",), action="start finalization")
    if group.phase != "admitted":
        raise RuleViolation("cannot finalize before admission", group_id=group.group_id)
    state.groups[group.group_id] = msgspec.structs.replace(
        group, status="finalizing", finalization_owner=ev.owner
    )


def _check_owner(group: GroupState, owner: str) -> None:
    if group.finalization_owner != owner:
        raise RuleViolation(
            f"finalization is owned by {group.finalization_owner!r}, not {owner!r}",
            group_id=group.group_id,
        )


def _leave(state: LedgerState, group: GroupState) -> None:
    del state.groups[group.group_id]
    members = tuple(g for g in state.admissions.get(group.admission_id, ()) if g != group.group_id)
    if members:
        state.admissions[group.admission_id] = members
    else:
        state.admissions.pop(group.admission_id, None)


def _on_finalized(state: LedgerState, ev: GroupFinalized) -> None:
    group = state.group(ev.group_id)
    # From finalization_unknown too: resolving it found every canonical row in place.
    _require(group, status=("finalizing", "finalization_unknown"), action="finalize")
    _check_owner(group, ev.owner)
    canonical = group.canonical_row_ids()
    if list(ev.canonical_row_ids) != canonical:
        raise RuleViolation(
            f"canonical rows must be {canonical}, found {list(ev.canonical_row_ids)}",
            group_id=group.group_id,
        )
    if (ev.prompt_id, ev.target_step) != (group.prompt_id, group.target_step):
        raise RuleViolation(
            f"finalized as prompt {ev.prompt_id!r} for step {ev.target_step}, but the group is "
            f"prompt {group.prompt_id!r} for step {group.target_step}",
            group_id=group.group_id,
        )
    if ev.weight_versions and len(ev.weight_versions) != group.expected_generations:
        raise RuleViolation(
            f"weight_versions must list one entry per sibling ({group.expected_generations}), "
            f"found {len(ev.weight_versions)}",
            group_id=group.group_id,
        )
    _leave(state, group)
    state.replay[group.group_id] = ReplayEntry(
        group_id=group.group_id,
        prompt_id=group.prompt_id,
        target_step=group.target_step,
        canonical_row_ids=tuple(canonical),
        min_weight_version=ev.min_weight_version,
    )


def _on_finalization_unknown(state: LedgerState, ev: FinalizationUnknown) -> None:
    group = state.group(ev.group_id)
    _require(group, status=("finalizing",), action="mark finalization unknown")
    _check_owner(group, ev.owner)
    state.groups[group.group_id] = msgspec.structs.replace(group, status="finalization_unknown")


def _on_finalization_retryable(state: LedgerState, ev: FinalizationRetryable) -> None:
    group = state.group(ev.group_id)
    _require(group, status=("finalization_unknown",), action="make finalization retryable")
    _check_owner(group, ev.owner)
    state.groups[group.group_id] = msgspec.structs.replace(
        group, status="ready_to_finalize", finalization_owner=None
    )


def _on_discarded(state: LedgerState, ev: GroupDiscarded) -> None:
    group = state.group(ev.group_id)
    if group.status == "finalizing":
        raise RuleViolation(
            f"cannot discard while {group.finalization_owner!r} is finalizing it",
            group_id=group.group_id,
        )
    owned = group.staging_keys()
    if sorted(ev.staging_keys) != sorted(owned):
        raise RuleViolation(
            f"GroupDiscarded must clear exactly the keys the group owns {owned}, "
            f"found {list(ev.staging_keys)}",
            group_id=group.group_id,
        )
    _leave(state, group)


def _replay_entries(
    state: LedgerState, group_ids: list[str], status: ReplayStatus, action: str
) -> list[ReplayEntry]:
    if not group_ids:
        raise RuleViolation(f"{action} names no group")
    if len(set(group_ids)) != len(group_ids):
        raise RuleViolation(f"{action} names a group twice: {group_ids}")
    entries = []
    for gid in group_ids:
        entry = state.replay.get(gid)
        if entry is None:
            raise RuleViolation(f"cannot {action}: the replay buffer does not own it", group_id=gid)
        if entry.status != status:
            raise RuleViolation(f"cannot {action} while it is {entry.status}", group_id=gid)
        entries.append(entry)
    return entries


def _on_replay_selected(state: LedgerState, ev: ReplaySelected) -> None:
    for entry in _replay_entries(state, ev.group_ids, "ready", "select"):
        state.replay[entry.group_id] = msgspec.structs.replace(
            entry, status="selected", selected_step=ev.step
        )


def _on_replay_released(state: LedgerState, ev: ReplayReleased) -> None:
    for entry in _replay_entries(state, ev.group_ids, "selected", "release"):
        state.replay[entry.group_id] = msgspec.structs.replace(
            entry, status="ready", selected_step=None
        )


def _on_replay_consumed(state: LedgerState, ev: ReplayConsumed) -> None:
    entries = _replay_entries(state, ev.group_ids, "selected", "consume")
    for entry in entries:
        if entry.selected_step != ev.step:
            raise RuleViolation(
                f"was selected for step {entry.selected_step}, not consumed by step {ev.step}",
                group_id=entry.group_id,
            )
    for entry in entries:
        del state.replay[entry.group_id]


def _on_replay_evicted(state: LedgerState, ev: ReplayEvicted) -> None:
    for entry in _replay_entries(state, ev.group_ids, "ready", "evict"):
        del state.replay[entry.group_id]


_HANDLERS: dict[type[Event], Callable[[LedgerState, Event], None]] = {
    GroupReserved: _on_reserved,  # type: ignore[dict-item]
    GroupAdmitted: _on_admitted,  # type: ignore[dict-item]
    SiblingsDispatched: _on_dispatched,  # type: ignore[dict-item]
    AttemptFailed: _on_failed,  # type: ignore[dict-item]
    SiblingSealed: _on_sibling_sealed,  # type: ignore[dict-item]
    GroupSealed: _on_group_sealed,  # type: ignore[dict-item]
    UnsealedAbandoned: _on_unsealed_abandoned,  # type: ignore[dict-item]
    GroupAbandoned: _on_group_abandoned,  # type: ignore[dict-item]
    RetryPrepared: _on_retry,  # type: ignore[dict-item]
    FinalizationStarted: _on_finalization_started,  # type: ignore[dict-item]
    GroupFinalized: _on_finalized,  # type: ignore[dict-item]
    FinalizationUnknown: _on_finalization_unknown,  # type: ignore[dict-item]
    FinalizationRetryable: _on_finalization_retryable,  # type: ignore[dict-item]
    GroupDiscarded: _on_discarded,  # type: ignore[dict-item]
    ReplaySelected: _on_replay_selected,  # type: ignore[dict-item]
    ReplayReleased: _on_replay_released,  # type: ignore[dict-item]
    ReplayConsumed: _on_replay_consumed,  # type: ignore[dict-item]
    ReplayEvicted: _on_replay_evicted,  # type: ignore[dict-item]
}


_LEAVING: frozenset[type[Event]] = frozenset({GroupFinalized, GroupDiscarded})
"""The events after which their group is no longer in the ledger (`_leave`)."""


def _type_name(cls: type[Event]) -> str:
    return str(cls.__struct_config__.tag)


FOLDED_TYPES: tuple[str, ...] = tuple(sorted(_type_name(cls) for cls in _HANDLERS))
"""The record types `fold` handles; every other type leaves the state as it is, so a rebuild
reads only these (`log.read(types=FOLDED_TYPES)`) and never decodes the rest."""
