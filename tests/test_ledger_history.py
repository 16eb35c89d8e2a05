"""A log written around the ledger (hand-edited, out of order) never folds into a state.

Each case appends a valid prefix and then one event that breaks exactly one rule, straight to
the log (SQLite and PostgreSQL); reopening the ledger must refuse it and name the seq and the
rule.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest
import sqlalchemy as sa

from eventlog import EventLog
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.errors import InvalidEventError, SchemaError
from eventlog.events import Event
from eventlog.log import resolve_url
from eventlog.records import ANY
from eventlog.recovery.ledger import RecoveryLedger
from eventlog.recovery.vocabulary import (
    REPLAY_STREAM,
    AttemptFailed,
    AttemptRef,
    FinalizationRetryable,
    FinalizationStarted,
    FinalizationUnknown,
    GroupAbandoned,
    GroupAdmitted,
    GroupDiscarded,
    GroupFinalized,
    GroupReserved,
    GroupSealed,
    PromptRef,
    Receipt,
    ReplayConsumed,
    RetryPrepared,
    SealResult,
    SiblingsDispatched,
    SiblingSealed,
    UnsealedAbandoned,
    group_stream,
)
from projections.siblings import (
    Folder,
    LedgerState,
    RuleViolation,
    StaleAttempt,
    fold,
    fold_all,
)
from tests.reliability import drop_append_only


def reserved(
    gid: str = "g",
    *,
    n: int = 2,
    granularity: str = "sibling",
    admitted: bool = True,
    target_step: int | None = 0,
    admission_id: str | None = None,
) -> GroupReserved:
    return GroupReserved(
        group_id=gid,
        admission_id=admission_id or gid,
        prompt_ref=PromptRef(sample_id=gid, task_name=None),
        prompt_id=gid,
        prompt_hash=None,
        agent_name=None,
        granularity=granularity,  # type: ignore[arg-type]
        expected_generations=n,
        target_step=target_step,
        start_weight_version=0,
        admitted=admitted,
    )


def ref(i: int, attempt: int = 0, gid: str = "g") -> AttemptRef:
    rid = f"{gid}_g{i}" if attempt == 0 else f"{gid}_g{i}-a{attempt}"
    return AttemptRef(generation_index=i, attempt=attempt, rollout_id=rid)


def dispatched(*refs: AttemptRef, gid: str = "g") -> SiblingsDispatched:
    return SiblingsDispatched(group_id=gid, attempts=list(refs))


def sealed(
    i: int, attempt: int = 0, *, keys: list[str] | None = None, rid: str | None = None
) -> SiblingSealed:
    rid = rid or ref(i, attempt).rollout_id
    return SiblingSealed(
        group_id="g",
        generation_index=i,
        attempt=attempt,
        rollout_id=rid,
        receipt=Receipt(rollout_id=rid, staging_keys=keys if keys is not None else [f"{rid}/0"]),
        reward=1.0,
        mask_sample=False,
    )


def result(i: int, attempt: int = 0) -> SealResult:
    rid = ref(i, attempt).rollout_id
    return SealResult(
        generation_index=i,
        attempt=attempt,
        rollout_id=rid,
        receipt=None,
        reward=0.0,
        mask_sample=True,
    )


READY = [reserved(n=1), dispatched(ref(0)), sealed(0)]
FINALIZING = [*READY, FinalizationStarted(group_id="g", owner="f")]
FINALIZED = [
    *FINALIZING,
    GroupFinalized(
        group_id="g",
        owner="f",
        prompt_id="g",
        target_step=0,
        canonical_row_ids=["g_g0"],
        min_weight_version=0,
    ),
]

CASES: dict[str, tuple[list[Event], Event, str]] = {
    "reserved twice": ([reserved()], reserved(), "already reserved"),
    "admitted twice": (
        [reserved()],
        GroupAdmitted(group_id="g", admission_id="g", target_step=1, start_weight_version=0),
        "already admitted",
    ),
    "admission disagrees": (
        [reserved("a", admission_id="b1", target_step=1)],
        reserved("c", admission_id="b1", target_step=2),
        "must agree",
    ),
    "unknown group": ([], dispatched(ref(0)), "not in the ledger"),
    "dispatch before admission": (
        [reserved(admitted=False)],
        dispatched(ref(0)),
        "before admission",
    ),
    "dispatch out of range": ([reserved()], dispatched(ref(5)), "no such sibling"),
    "dispatch twice": (
        [reserved(), dispatched(ref(0))],
        dispatched(ref(0)),
        "is dispatched, expected reserved",
    ),
    "seal before dispatch": ([reserved()], sealed(0), "is reserved, expected dispatched"),
    "seal names a future attempt": (
        [reserved(), dispatched(ref(0))],
        sealed(0, 1),
        "unknown rollout id 'g_g0-a1', expected the current attempt 0",
    ),
    "seal names a superseded attempt": (
        [
            reserved(),
            dispatched(ref(0)),
            UnsealedAbandoned(group_id="g", attempts=[ref(0)], reason="x"),
            RetryPrepared(group_id="g", attempts=[ref(0, 1)]),
        ],
        sealed(0, 0),
        "attempt 0 \\('g_g0'\\) was superseded by attempt 1",
    ),
    "receipt of another rollout": (
        [reserved(), dispatched(ref(0))],
        msgspec.structs.replace(sealed(0), receipt=Receipt(rollout_id="g_g1", staging_keys=[])),
        "receipt names rollout",
    ),
    "staging key twice in a receipt": (
        [reserved(), dispatched(ref(0))],
        sealed(0, keys=["k", "k"]),
        "staging key twice",
    ),
    "sibling seal under prompt_group": (
        [reserved(granularity="prompt_group"), dispatched(ref(0), ref(1))],
        sealed(0),
        "granularity is prompt_group",
    ),
    "group seal under sibling": (
        [reserved(), dispatched(ref(0), ref(1))],
        GroupSealed(group_id="g", results=[result(0), result(1)]),
        "granularity is sibling",
    ),
    "partial group seal": (
        [reserved(granularity="prompt_group"), dispatched(ref(0), ref(1))],
        GroupSealed(group_id="g", results=[result(0)]),
        "must name every sibling",
    ),
    "group seal mixes attempts": (
        [reserved(granularity="prompt_group"), dispatched(ref(0), ref(1))],
        GroupSealed(group_id="g", results=[result(0), result(1, 1)]),
        "mixes attempts",
    ),
    "partial abandon under prompt_group": (
        [reserved(granularity="prompt_group"), dispatched(ref(0), ref(1))],
        GroupAbandoned(group_id="g", attempts=[ref(0)], reason="x"),
        "must name every sibling",
    ),
    "abandon a sealed sibling": (
        [reserved(), dispatched(ref(0), ref(1)), sealed(0)],
        UnsealedAbandoned(group_id="g", attempts=[ref(0)], reason="x"),
        "is sealed",
    ),
    "retry a dispatched attempt": (
        [reserved(), dispatched(ref(0))],
        RetryPrepared(group_id="g", attempts=[ref(0, 1)]),
        "while it is dispatched",
    ),
    "partial retry under prompt_group": (
        [
            reserved(granularity="prompt_group"),
            dispatched(ref(0), ref(1)),
            AttemptFailed(
                group_id="g", generation_index=1, attempt=0, rollout_id="g_g1", error="x"
            ),
        ],
        RetryPrepared(group_id="g", attempts=[ref(1, 1)]),
        "siblings \\[0\\] are still live while \\[1\\] ended; abandon_unsealed first",
    ),
    "retry number does not grow": (
        [
            reserved(),
            dispatched(ref(0)),
            UnsealedAbandoned(group_id="g", attempts=[ref(0)], reason="x"),
        ],
        RetryPrepared(group_id="g", attempts=[ref(0, 0)]),
        "numbered above 0",
    ),
    "finalize without starting": (
        READY,
        FINALIZED[-1],
        "cannot finalize while the group is ready_to_finalize",
    ),
    "finalize an unsealed group": (
        [reserved(n=1)],
        FinalizationStarted(group_id="g", owner="f"),
        "while the group is generating",
    ),
    "finalize by another owner": (
        FINALIZING,
        msgspec.structs.replace(FINALIZED[-1], owner="other"),
        "owned by 'f', not 'other'",
    ),
    "wrong canonical rows": (
        FINALIZING,
        msgspec.structs.replace(FINALIZED[-1], canonical_row_ids=["g_g7"]),
        "canonical rows must be",
    ),
    "finalized as another prompt": (
        FINALIZING,
        msgspec.structs.replace(FINALIZED[-1], prompt_id="other"),
        "finalized as prompt 'other'",
    ),
    "finalized for another step": (
        FINALIZING,
        msgspec.structs.replace(FINALIZED[-1], target_step=5),
        "for step 5, but the group is",
    ),
    "receipt names a key another sibling owns": (
        [reserved(n=2), dispatched(ref(0), ref(1)), sealed(0)],
        sealed(1, keys=["g_g0/0"]),
        r"receipt names staging keys \['g_g0/0'\] that sibling 0 \('g_g0'\) owns",
    ),
    "receipt names keys of two siblings, the later one's first": (
        [
            reserved(n=3),
            dispatched(ref(0), ref(1), ref(2)),
            sealed(0, keys=["a"]),
            sealed(1, keys=["b"]),
        ],
        sealed(2, keys=["b", "a"]),
        r"receipt names staging keys \['a'\] that sibling 0 \('g_g0'\) owns",
    ),
    "group seal gives one key to two siblings": (
        [reserved(n=2, granularity="prompt_group"), dispatched(ref(0), ref(1))],
        GroupSealed(
            group_id="g",
            results=[
                msgspec.structs.replace(
                    result(i), receipt=Receipt(rollout_id=f"g_g{i}", staging_keys=["shared"])
                )
                for i in (0, 1)
            ],
        ),
        "staging key 'shared' is in the receipts of siblings 0 and 1",
    ),
    "finalized with weight versions of the wrong length": (
        FINALIZING,
        msgspec.structs.replace(FINALIZED[-1], weight_versions=[[0], [1]]),
        r"weight_versions must list one entry per sibling \(1\), found 2",
    ),
    "retryable while finalizing": (
        FINALIZING,
        FinalizationRetryable(group_id="g", owner="f", reason="rows missing"),
        "cannot make finalization retryable while the group is finalizing",
    ),
    "retryable by another owner": (
        [*FINALIZING, FinalizationUnknown(group_id="g", owner="f", error="timeout")],
        FinalizationRetryable(group_id="g", owner="other", reason="rows missing"),
        "owned by 'f', not 'other'",
    ),
    "finalized twice": (FINALIZED, FINALIZED[-1], "replay buffer owns it"),
    "discard with other keys": (
        READY,
        GroupDiscarded(group_id="g", reason="x", staging_keys=[]),
        "exactly the keys",
    ),
    "consume an unselected group": (
        FINALIZED,
        ReplayConsumed(group_ids=["g"], step=1),
        "while it is ready",
    ),
}


def _stream(event: Event) -> str:
    gid = getattr(event, "group_id", None)
    return group_stream(gid) if isinstance(gid, str) else REPLAY_STREAM


@pytest.mark.parametrize("name", sorted(CASES))
def test_fold_refuses_an_event_that_breaks_a_rule(name: str) -> None:
    """Event by event (`fold`, what a ledger command does)."""
    prefix, bad, match = CASES[name]
    state = LedgerState()
    for event in prefix:
        fold(state, event)
    before = state.copy()
    with pytest.raises(RuleViolation, match=match):
        fold(state, bad)
    assert state == before  # a refused event changes nothing


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_rebuild_refuses_the_same_event_with_the_same_words(name: str) -> None:
    """One `Folder` over the prefix and the bad event (what a rebuild does), remembering what
    each group's sealed siblings own: the same refusal as event by event, nothing changed."""
    prefix, bad, match = CASES[name]
    state = LedgerState()
    apply = Folder(state)
    for event in prefix:
        apply(event)
    before = state.copy()
    with pytest.raises(RuleViolation, match=match):
        apply(bad)
    assert state == before


def test_a_rebuild_sees_every_seal_before_it_in_the_same_rebuild() -> None:
    """Rows owned by siblings sealed earlier in one rebuild, the last one included, are
    refused to a later seal; the group is ready only once every sibling is sealed."""
    state = LedgerState()
    apply = Folder(state)
    # Sibling 2's dispatch comes between the seals: the rebuild sees sibling 0 sealed in a
    # group it has not sealed into yet, then sibling 1 sealed by itself.
    for event in [
        reserved(n=3),
        dispatched(ref(0), ref(1)),
        sealed(0),
        dispatched(ref(2)),
        sealed(1),
    ]:
        apply(event)
    before = state.groups["g"].status
    for owner in (0, 1):
        with pytest.raises(
            RuleViolation, match=rf"\['g_g{owner}/0'\] that sibling {owner} \('g_g{owner}'\) owns"
        ):
            apply(sealed(2, keys=["g_g2/0", f"g_g{owner}/0"]))
    apply(sealed(2))
    assert (before, state.groups["g"].status) == ("generating", "ready_to_finalize")


def test_a_rebuild_visits_a_groups_siblings_once_not_on_every_seal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What makes a rebuild's seals cheap: who owns which key is found by visiting the
    siblings once per group (then kept seal by seal), where one event folded alone (a
    ledger command) visits them on every seal."""
    import projections.siblings as siblings

    visits: list[str] = []

    class Counted(siblings._Owners):
        def __init__(self, group: siblings.GroupState) -> None:
            visits.append(group.group_id)
            super().__init__(group)

    monkeypatch.setattr(siblings, "_Owners", Counted)
    n = 16
    events: list[Event] = [reserved(n=n), dispatched(*(ref(i) for i in range(n)))]
    events += [sealed(i) for i in range(n)]
    folded = fold_all(LedgerState(), events)
    assert visits == ["g"]
    visits.clear()
    one_by_one = LedgerState()
    for event in events:
        fold(one_by_one, event)
    assert visits == ["g"] * n
    assert one_by_one == folded and folded.groups["g"].status == "ready_to_finalize"


def test_a_rebuild_reads_the_group_as_it_stands_when_something_else_replaced_it() -> None:
    """What the rebuild remembers of a group is used only while the group is the one it saw:
    a state whose group was put back by another writer (here: to before sibling 0's seal)
    is checked as it stands, so sibling 0's rows are free again."""
    state = LedgerState()
    apply = Folder(state)
    for event in [reserved(n=2), dispatched(ref(0), ref(1))]:
        apply(event)
    unsealed = state.groups["g"]
    apply(sealed(0))
    state.groups["g"] = unsealed
    apply(sealed(1, keys=["g_g0/0"]))
    assert state.groups["g"].siblings[1].current.staging_keys == ("g_g0/0",)


def test_a_rebuild_forgets_a_group_that_left_and_its_id_reserved_again_seals_afresh() -> None:
    """A discarded group's id can be reserved again: its new siblings own nothing yet, so
    they may seal the rows the old incarnation named. A rebuild holds nothing for groups no
    longer in the ledger (memory flat in log length)."""
    discarded = GroupDiscarded(group_id="g", reason="x", staging_keys=["g_g0/0", "g_g1/0"])
    first = [reserved(n=2), dispatched(ref(0), ref(1)), sealed(0), sealed(1), discarded]
    state = LedgerState()
    apply = Folder(state)
    for event in first:
        apply(event)
    assert "g" not in state.groups and len(apply) == 0
    for event in [reserved(n=2), dispatched(ref(0), ref(1)), sealed(1, keys=["g_g0/0"])]:
        apply(event)
    assert state.groups["g"].siblings[1].current.staging_keys == ("g_g0/0",)
    assert len(apply) == 1


@pytest.mark.parametrize("what", ["seal", "dispatch"])
def test_fold_refuses_a_negative_sibling_index_built_in_code(what: str) -> None:
    """An event built in code skips the decoder's `ge=0`; the fold's fast paths index the
    siblings by it, so -1 naming the last sibling's attempt must not seal or dispatch it."""
    prefix: list[Event] = [reserved(n=2)]
    last = ref(1)
    bad: Event
    if what == "seal":
        prefix.append(dispatched(ref(0), ref(1)))
        bad = msgspec.structs.replace(sealed(1), generation_index=-1)
    else:
        bad = dispatched(msgspec.structs.replace(last, generation_index=-1))
    state = fold_all(LedgerState(), prefix)
    before = state.copy()
    with pytest.raises(RuleViolation, match="sibling -1: no such sibling"):
        fold_all(state, [bad])
    assert state == before


def test_a_stale_result_is_a_typed_violation_naming_both_rollout_ids() -> None:
    prefix, bad, _ = CASES["seal names a superseded attempt"]
    state = fold_all(LedgerState(), prefix)
    with pytest.raises(StaleAttempt) as raised:
        fold_all(state, [bad])
    stale = raised.value
    assert (stale.group_id, stale.generation_index) == ("g", 0)
    assert (stale.rollout_id, stale.current_rollout_id) == ("g_g0", "g_g0-a1")


@pytest.mark.parametrize("name", sorted(CASES))
def test_reopening_a_log_with_a_rule_breaking_record_names_its_seq(
    name: str, log_target: str
) -> None:
    prefix, bad, match = CASES[name]
    with EventLog.open(log_target) as log:
        for event in prefix:
            log.append(_stream(event), [event], ANY)
        seq = log.append(_stream(bad), [bad], ANY).seqs[0]
        with pytest.raises(InvalidEventError, match=rf"seq {seq} \({type(bad).__name__}.*{match}"):
            RecoveryLedger.open(log, InMemoryDataPlane())


def _edit_payload(target: str, seq: int, edit: Callable[[dict[str, object]], None]) -> None:
    engine = sa.create_engine(resolve_url(target))
    try:
        with engine.begin() as db:
            drop_append_only(db)
            select = sa.text("SELECT payload FROM events WHERE seq = :seq")
            data = msgspec.msgpack.decode(db.execute(select, {"seq": seq}).scalar_one())
            edit(data)
            db.execute(
                sa.text("UPDATE events SET payload = :payload WHERE seq = :seq"),
                {"payload": msgspec.msgpack.encode(data), "seq": seq},
            )
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda d: d.pop("mask_sample"), "missing required field `mask_sample`"),
        (
            lambda d: d.update(mask_sample=None),
            r"Expected `bool`, got `None` - at `\$.mask_sample`",
        ),
        (lambda d: d.update(generation_index=-1), r"Expected `int` >= 0"),
        (lambda d: d.update(reward="high"), r"Expected `float`, got `str`"),
    ],
)
def test_a_hand_edited_seal_payload_fails_to_decode_naming_its_seq(
    log_target: str, edit: Callable[[dict[str, object]], None], match: str
) -> None:
    with EventLog.open(log_target) as log:
        for event in [reserved(), dispatched(ref(0))]:
            log.append(_stream(event), [event], ANY)
        seq = log.append(group_stream("g"), [sealed(0)], ANY).seqs[0]
    _edit_payload(log_target, seq, edit)
    with (
        EventLog.open(log_target) as log,
        pytest.raises(SchemaError, match=rf"seq {seq}: SiblingSealed.*{match}"),
    ):
        RecoveryLedger.open(log, InMemoryDataPlane())


def test_a_trial_takes_only_what_a_state_folded_from_a_copy_changed() -> None:
    """Trial.take (a restore adopts the state its restart events were folded into): a value
    identical to the live one is not written, a changed or new one is, a key the folded
    state lacks is deleted; adopting leaves the live state equal to the folded one."""
    from eventlog.recovery.trial import Trial

    live = fold_all(LedgerState(), [reserved("a"), reserved("b"), reserved("c")])
    folded = live.copy()
    del folded.groups["b"]  # as a discard folds it: the group and its admission leave
    del folded.admissions["b"]
    fold_all(folded, [dispatched(ref(0, gid="c"), ref(1, gid="c"), gid="c"), reserved("d")])
    trial = Trial(live)
    trial.take(folded)
    assert trial.touched() == {
        "group:b",
        "admission:b",
        "group:c",
        "group:d",
        "admission:d",
    }
    assert trial.materialize() == folded
    trial.adopt()
    assert live == folded
