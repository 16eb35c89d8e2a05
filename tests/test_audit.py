"""The audit folds (projections.audit) over hand-built records: timelines and recovery figures.

Each scenario writes out, record by record, what a controller and its workers would have
recorded, with seqs and recorded_at chosen by hand so every expected number can be checked
by counting the lines of the scenario.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from eventlog.events import Event
from eventlog.recovery.vocabulary import (
    CONTROLLER_STREAM,
    AttemptFailed,
    AttemptRef,
    CheckpointCommitted,
    FinalizationStarted,
    GenerationFinished,
    GenerationStarted,
    GroupAbandoned,
    GroupDiscarded,
    GroupFinalized,
    GroupReserved,
    GroupSealed,
    PromptRef,
    Receipt,
    RestoreCompleted,
    RestoreStarted,
    RetryPrepared,
    SealResult,
    SiblingsDispatched,
    SiblingSealed,
    StaleResultRejected,
    TokensStaged,
    UnsealedAbandoned,
    attempt_stream,
    group_stream,
    rollout_id_for,
)
from projections.audit import group_of_rollout
from projections.audit_stats import AuditState, KeyReport, audit, fold_audit, report
from projections.history import RolledBack

MS = 1_000_000


class Rec(msgspec.Struct, frozen=True):
    seq: int
    stream: str
    recorded_at: int
    event: Event


class Log:
    """Builds records in seq order; `at` is the recorded_at (ns) of the next record."""

    def __init__(self) -> None:
        self.records: list[Rec] = []
        self.at = 0

    def add(self, stream: str, *events: Event, at_ms: float | None = None) -> int:
        if at_ms is not None:
            self.at = int(at_ms * MS)
        for event in events:
            self.records.append(Rec(len(self.records) + 1, stream, self.at, event))
        return len(self.records)

    def group(self, gid: str, *events: Event, at_ms: float | None = None) -> int:
        return self.add(group_stream(gid), *events, at_ms=at_ms)

    # -- what the controller records ---------------------------------------------------------

    def reserve(
        self, gid: str, n: int, *, agent: str | None, task: str | None, granularity: str = "sibling"
    ) -> int:
        return self.group(
            gid,
            GroupReserved(
                group_id=gid,
                admission_id=gid,
                prompt_ref=PromptRef(sample_id=gid, task_name=task),
                prompt_id=gid,
                prompt_hash=None,
                agent_name=agent,
                granularity=granularity,  # type: ignore[arg-type]
                expected_generations=n,
                target_step=0,
                start_weight_version=0,
                admitted=True,
            ),
        )

    def dispatch(self, gid: str, *pairs: tuple[int, int]) -> int:
        return self.group(gid, SiblingsDispatched(group_id=gid, attempts=refs(gid, *pairs)))

    def retry(self, gid: str, *pairs: tuple[int, int]) -> int:
        return self.group(gid, RetryPrepared(group_id=gid, attempts=refs(gid, *pairs)))

    def seal(self, gid: str, i: int, attempt: int = 0, *, reward: float = 1.0) -> int:
        rid = rollout_id_for(gid, i, attempt)
        return self.group(
            gid,
            SiblingSealed(
                group_id=gid,
                generation_index=i,
                attempt=attempt,
                rollout_id=rid,
                receipt=Receipt(rollout_id=rid, staging_keys=[f"{rid}/c0", f"{rid}/c1"]),
                reward=reward,
                mask_sample=False,
            ),
        )

    def fail(self, gid: str, i: int, attempt: int = 0) -> int:
        rid = rollout_id_for(gid, i, attempt)
        return self.group(
            gid,
            AttemptFailed(
                group_id=gid, generation_index=i, attempt=attempt, rollout_id=rid, error="oom"
            ),
        )

    def finalize(self, gid: str, n: int) -> int:
        return self.group(
            gid,
            FinalizationStarted(group_id=gid, owner="f"),
            GroupFinalized(
                group_id=gid,
                owner="f",
                prompt_id=gid,
                target_step=0,
                canonical_row_ids=[f"{gid}_g{i}" for i in range(n)],
                min_weight_version=0,
            ),
        )

    # -- what a worker records ---------------------------------------------------------------

    def run(
        self,
        gid: str,
        i: int,
        attempt: int = 0,
        *,
        tokens: tuple[int, ...] = (10, 20),
        start_ms: float | None = None,
        end_ms: float | None = None,
        finish: bool = True,
    ) -> None:
        """GenerationStarted, one TokensStaged per entry of `tokens`, GenerationFinished."""
        rid = rollout_id_for(gid, i, attempt)
        stream = attempt_stream(rid)
        self.add(
            stream,
            GenerationStarted(
                rollout_id=rid,
                group_id=gid,
                generation_index=i,
                attempt=attempt,
                worker="w",
                model="m",
                weight_version=0,
            ),
            at_ms=start_ms,
        )
        for c, count in enumerate(tokens):
            self.add(
                stream,
                TokensStaged(
                    rollout_id=rid,
                    partition="staging",
                    staging_key=f"{rid}/c{c}",
                    token_count=count,
                    weight_version=0,
                ),
            )
        if finish:
            self.add(
                stream,
                GenerationFinished(
                    rollout_id=rid,
                    finish_reason="stop",
                    token_count=sum(tokens),
                    reward=None,
                    staging_keys=[f"{rid}/c{c}" for c in range(len(tokens))],
                ),
                at_ms=end_ms,
            )

    def __iter__(self) -> Iterator[Rec]:
        return iter(self.records)


def refs(gid: str, *pairs: tuple[int, int]) -> list[AttemptRef]:
    return [
        AttemptRef(generation_index=i, attempt=a, rollout_id=rollout_id_for(gid, i, a))
        for i, a in pairs
    ]


def row(rep: list[KeyReport], agent: str | None, task: str | None) -> KeyReport:
    (found,) = [r for r in rep if (r.agent_name, r.task_name) == (agent, task)]
    return found


# -- timelines ------------------------------------------------------------------------------


def test_attempts_retries_failures_and_stale_results_are_counted_per_agent_and_task() -> None:
    log = Log()
    log.reserve("a", 2, agent="math_agent", task="math")
    log.reserve("b", 1, agent=None, task="code", granularity="prompt_group")
    log.dispatch("a", (0, 0), (1, 0))
    log.dispatch("b", (0, 0))
    log.fail("a", 1)
    log.retry("a", (1, 1))
    log.dispatch("a", (1, 1))
    log.fail("a", 1, 1)
    log.retry("a", (1, 2))
    log.dispatch("a", (1, 2))
    log.group(
        "a",
        StaleResultRejected(
            group_id="a",
            generation_index=1,
            rollout_id="a_g1",
            current_rollout_id="a_g1-a2",
            reason="superseded",
        ),
    )
    log.fail("b", 0)
    log.group("b", GroupAbandoned(group_id="b", attempts=refs("b", (0, 0)), reason="x"))
    log.retry("b", (0, 1))

    rep = audit(log, RolledBack())
    a, b = row(rep.by_agent_task, "math_agent", "math"), row(rep.by_agent_task, None, "code")

    assert (a.groups, a.dispatched, a.retries, a.failed, a.abandoned, a.stale_rejected) == (
        1,
        4,
        2,
        2,
        0,
        1,
    )
    assert (b.groups, b.dispatched, b.retries, b.failed, b.abandoned, b.stale_rejected) == (
        1,
        1,
        1,
        1,
        1,
        0,
    )
    assert rep.total.dispatched == 5 and rep.total.retries == 3 and rep.total.groups == 2
    assert rep.records == len(log.records) and rep.restores == 0


def test_rows_of_sealed_attempts_are_kept_and_rows_of_failed_ones_discarded() -> None:
    log = Log()
    log.reserve("g", 2, agent="x", task="t")
    log.dispatch("g", (0, 0), (1, 0))
    log.run("g", 0, tokens=(10, 20))
    log.seal("g", 0)
    log.run("g", 1, tokens=(5,), finish=False)
    log.fail("g", 1)
    log.retry("g", (1, 1))
    log.dispatch("g", (1, 1))
    log.run("g", 1, 1, tokens=(100, 200))
    log.seal("g", 1, 1)
    log.finalize("g", 2)

    (r,) = audit(log, RolledBack()).by_agent_task

    assert (r.rows_staged, r.tokens_staged) == (5, 335)
    assert (r.rows_kept, r.tokens_kept) == (4, 330)
    assert (r.rows_discarded, r.tokens_discarded) == (1, 5)
    assert (r.rows_open, r.finalized) == (0, 1)


def test_a_discarded_group_discards_the_rows_its_seals_owned() -> None:
    log = Log()
    log.reserve("g", 1, agent=None, task=None)
    log.dispatch("g", (0, 0))
    log.run("g", 0, tokens=(3, 4))
    log.seal("g", 0)
    log.group(
        "g", GroupDiscarded(group_id="g", reason="stale", staging_keys=["g_g0/c0", "g_g0/c1"])
    )

    (r,) = audit(log, RolledBack()).by_agent_task
    assert (r.discarded, r.rows_kept, r.rows_discarded, r.tokens_discarded) == (1, 0, 2, 7)


def test_rows_staged_after_the_group_left_are_discarded() -> None:
    log = Log()
    log.reserve("g", 1, agent=None, task=None)
    log.dispatch("g", (0, 0))
    log.run("g", 0, tokens=(1,))
    log.seal("g", 0)
    log.finalize("g", 1)
    log.add(
        attempt_stream("g_g0"),
        TokensStaged(
            rollout_id="g_g0",
            partition="s",
            staging_key="g_g0/late",
            token_count=9,
            weight_version=0,
        ),
    )
    (r,) = audit(log, RolledBack()).by_agent_task
    assert (r.rows_staged, r.rows_kept, r.rows_discarded, r.tokens_discarded) == (2, 1, 1, 9)


def test_rows_of_attempts_still_running_at_the_end_are_open_and_sealed_ones_kept() -> None:
    log = Log()
    log.reserve("g", 3, agent=None, task=None)
    log.dispatch("g", (0, 0), (1, 0), (2, 0))
    log.run("g", 0, tokens=(10,))
    log.seal("g", 0)
    log.run("g", 1, tokens=(20, 30), finish=False)  # still generating
    log.run("g", 2, tokens=(40,), finish=False)
    log.fail("g", 2)  # failed, not yet retried

    state = AuditState()
    for rec in log:
        fold_audit(state, rec)
    first = report(state)
    (r,) = first.by_agent_task
    assert (r.rows_kept, r.rows_open, r.tokens_open, r.rows_discarded) == (1, 2, 50, 1)
    assert report(state) == first  # reporting leaves the state as it was


def test_a_restore_counts_sealed_siblings_reused_and_attempts_it_reruns() -> None:
    log = Log()
    log.reserve("g", 3, agent="math_agent", task="math")
    log.reserve("h", 2, agent="code_agent", task="code")
    log.dispatch("g", (0, 0), (1, 0), (2, 0))
    log.dispatch("h", (0, 0), (1, 0))
    log.run("g", 0, tokens=(10, 10))
    log.seal("g", 0)
    log.run("h", 0, tokens=(1,))
    log.seal("h", 0)
    log.run("h", 1, tokens=(2,))
    checkpoint = log.seal("h", 1)
    log.add(
        CONTROLLER_STREAM,
        CheckpointCommitted(
            step=1,
            data_plane_ref="/dp",
            inventory_digest="d",
            row_count=4,
            ledger_digest="l",
            group_count=2,
            covers_seq=checkpoint,
            chain="",
        ),
    )
    checkpoint += 1
    log.run("g", 1, tokens=(5, 6))
    log.seal("g", 1)  # rolled back: sibling 1 reruns, its rows are discarded
    log.run("g", 2, tokens=(7,), finish=False)
    started = log.add(
        CONTROLLER_STREAM,
        RestoreStarted(
            checkpoint_step=1, checkpoint_seq=checkpoint, rolled_back_from_seq=checkpoint + 1
        ),
    )
    log.group("g", UnsealedAbandoned(group_id="g", attempts=refs("g", (1, 0), (2, 0)), reason="r"))
    log.retry("g", (1, 1), (2, 1))
    log.add(
        CONTROLLER_STREAM,
        RestoreCompleted(
            checkpoint_step=1,
            checkpoint_seq=checkpoint,
            rolled_back_from_seq=checkpoint + 1,
            rolled_back_until_seq=started - 1,
            groups_restored=2,
            siblings_reused=3,
            siblings_redispatched=2,
            rows_cleared=3,
        ),
    )
    log.retry("g", (1, 2))  # an ordinary retry after the restore: not the restore's

    rep = audit(log, RolledBack([(checkpoint + 1, started - 1)]))
    g, h = (
        row(rep.by_agent_task, "math_agent", "math"),
        row(rep.by_agent_task, "code_agent", "code"),
    )

    assert (rep.restores, rep.checkpoints, rep.rolled_back_records) == (
        1,
        1,
        started - 1 - checkpoint,
    )
    assert (g.reused_after_restore, g.redispatched_after_restore) == (1, 2)
    assert (h.reused_after_restore, h.redispatched_after_restore) == (2, 0)
    assert g.retries == 3 and g.abandoned == 2
    # g_g0's rows are owned by its seal; g_g1's seal was rolled back and g_g2 was abandoned
    assert (g.rows_staged, g.rows_kept, g.rows_discarded, g.tokens_discarded) == (5, 2, 3, 18)
    assert (h.rows_kept, h.rows_discarded) == (2, 0)


def test_a_group_id_freed_by_a_rolled_back_reservation_starts_afresh() -> None:
    log = Log()
    checkpoint = log.reserve("other", 1, agent=None, task=None)
    log.reserve("g", 1, agent="x", task="t")  # rolled back below
    log.dispatch("g", (0, 0))
    log.run("g", 0, tokens=(4,))
    started = log.add(
        CONTROLLER_STREAM,
        RestoreStarted(
            checkpoint_step=0, checkpoint_seq=checkpoint, rolled_back_from_seq=checkpoint + 1
        ),
    )
    log.reserve("g", 1, agent="x", task="t")
    log.dispatch("g", (0, 0))
    log.run("g", 0, tokens=(6,))
    log.seal("g", 0)
    log.finalize("g", 1)

    rep = audit(log, RolledBack([(checkpoint + 1, started - 1)]))
    r = row(rep.by_agent_task, "x", "t")
    assert (r.groups, r.dispatched, r.finalized) == (1, 2, 1)
    assert (r.rows_staged, r.rows_kept, r.tokens_kept, r.rows_discarded) == (2, 1, 6, 1)


def test_generation_latency_comes_from_recorded_at_of_start_and_finish() -> None:
    log = Log()
    log.reserve("g", 10, agent=None, task=None)
    log.dispatch("g", *((i, 0) for i in range(10)))
    for i in range(10):  # latencies 10, 20, ..., 100 ms
        log.run("g", i, tokens=(1,), start_ms=1000 * i, end_ms=1000 * i + 10 * (i + 1))
    log.run("g", 0, 1, tokens=(1,), start_ms=50_000, finish=False)  # no finish: no latency

    latency = audit(log, RolledBack()).total.generation_latency
    assert (latency.count, latency.p50_ms, latency.p90_ms, latency.max_ms) == (10, 50, 90, 100)


def test_a_group_sealed_whole_keeps_the_rows_of_every_result() -> None:
    log = Log()
    log.reserve("p", 2, agent=None, task=None, granularity="prompt_group")
    log.dispatch("p", (0, 0), (1, 0))
    log.run("p", 0, tokens=(1, 2))
    log.run("p", 1, tokens=(3,))
    log.group(
        "p",
        GroupSealed(
            group_id="p",
            results=[
                SealResult(
                    generation_index=i,
                    attempt=0,
                    rollout_id=f"p_g{i}",
                    receipt=None,
                    reward=0.0,
                    mask_sample=False,
                )
                for i in range(2)
            ],
        ),
    )
    log.finalize("p", 2)
    (r,) = audit(log, RolledBack()).by_agent_task
    assert (r.rows_kept, r.tokens_kept, r.rows_discarded) == (3, 6, 0)


def test_rollout_ids_name_their_group() -> None:
    assert group_of_rollout("grp-1_x_g3") == "grp-1_x"
    assert group_of_rollout("g_g12-a4") == "g"
    assert group_of_rollout("no-sibling-suffix") is None
