"""A long simulated run leaks nothing (docs/design.md §7): thousands of groups, failures,
finalization outcomes, discards, trains, checkpoints and restores, on the in-memory data plane.

At every checkpoint the data plane holds exactly the rows the ledger references (staging rows
owned by sealed siblings or staged by live attempts, canonical rows owned by the replay
buffer), and its size does not grow with the number of steps. Every delete is checked, as it
happens, against the log: the keys were already named by a clearing record (log first).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from eventlog import EventLog
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.recovery.ledger import RecoveryLedger
from eventlog.recovery.vocabulary import (
    GroupDiscarded,
    GroupFinalized,
    RowsCleared,
    SiblingResult,
    StagingCleared,
)
from projections.reconcile import referenced_keys
from tests.fixtures.ledger import STAGING, Harness

MAX_ATTEMPTS = 3


class LoggedFirstDataPlane:
    """A data plane (in-memory or the real TQ) that asserts each delete was logged before it."""

    deletes = 0
    """Rows deleted through any instance (a restore starts a new one)."""

    def __init__(self, log: EventLog, inner: Any) -> None:
        self.inner = inner
        self.log = log
        self.seen = 0
        self.named: set[tuple[str, str]] = set()

    def delete_rows(self, partition: str, keys: Iterable[str]) -> None:
        keys = list(keys)
        for rec in self.log.read(from_seq=self.seen + 1):
            self.seen = rec.seq
            ev = rec.event
            if isinstance(ev, StagingCleared):
                self.named |= {(ev.partition, c.key) for c in ev.of_attempts}
                self.named |= {(ev.partition, k) for k in ev.never_staged}
            elif isinstance(ev, RowsCleared):
                self.named |= {(ev.partition, k) for k in ev.keys}
            elif isinstance(ev, GroupDiscarded):
                self.named |= {(STAGING, k) for k in ev.staging_keys}
            elif isinstance(ev, GroupFinalized) and ev.staging_partition is not None:
                self.named |= {(ev.staging_partition, c.key) for c in ev.staging_cleared}
        unlogged = [k for k in keys if (partition, k) not in self.named]
        assert not unlogged, f"deleted from {partition!r} before the log named them: {unlogged}"
        LoggedFirstDataPlane.deletes += len(keys)
        self.inner.delete_rows(partition, keys)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Run:
    def __init__(self, h: Harness, seed: int, groups_per_step: int) -> None:
        self.h = h
        self.groups_per_step = groups_per_step
        self.rng = random.Random(seed)
        self.sizes: list[int] = []

    @property
    def ledger(self) -> RecoveryLedger:
        return self.h.ledger

    def open_step(self, step: int) -> None:
        for j in range(self.groups_per_step):
            gid = f"s{step}-g{j}"
            granularity = "prompt_group" if j % 4 == 0 else "sibling"
            self.h.reserve(gid, n=2, granularity=granularity, target_step=step)
            self.h.dispatch(gid)

    def drive(self, gid: str, *, finish: bool) -> None:
        """Work one group forward: stage, fail or seal, retry; finish=False stages and stops."""
        h, ledger = self.h, self.ledger
        while gid in ledger.state.groups:
            group = ledger.group(gid)
            if group.status == "ready_to_finalize":
                if not finish:
                    return
                self.finalize(gid)
                return
            if group.status == "finalization_unknown":
                h.run(lambda cut: ledger.resolve_finalization_unknown(cut, gid))
                continue
            reserved = group.indices("reserved")
            if reserved:
                h.dispatch(gid, reserved)
                continue
            live = group.indices("dispatched")
            if not finish:
                for i in live:
                    h.stage(h.rollout_id(gid, i), calls=1)  # in flight at the checkpoint
                return
            results = []
            for i in live:
                rid = h.rollout_id(gid, i)
                receipt = h.stage(rid, calls=self.rng.randint(1, 2))
                if self.rng.random() < 0.15:
                    h.run(
                        partial(
                            ledger.fail_attempt,
                            group_id=gid,
                            generation_index=i,
                            rollout_id=rid,
                            error="oom",
                        )
                    )
                    self.after_failure(gid)
                    break
                mask = self.rng.random() < 0.2
                results.append(
                    SiblingResult(
                        generation_index=i,
                        rollout_id=rid,
                        receipt=receipt,
                        reward=1.0,
                        mask_sample=mask,
                    )
                )
            else:
                if group.granularity == "prompt_group":
                    h.run(partial(ledger.seal_group, group_id=gid, results=results))
                else:
                    for r in results:
                        h.run(
                            partial(
                                ledger.seal_sibling,
                                group_id=gid,
                                generation_index=r.generation_index,
                                rollout_id=r.rollout_id,
                                receipt=r.receipt,
                                reward=r.reward,
                                mask_sample=r.mask_sample,
                            )
                        )

    def after_failure(self, gid: str) -> None:
        h, ledger = self.h, self.ledger
        if ledger.group(gid).granularity == "prompt_group":
            h.run(lambda cut: ledger.abandon_unsealed(cut, gid, reason="sibling failed"))
        group = ledger.group(gid)
        if any(
            s.current.status in ("failed", "abandoned") and s.current.attempt + 1 >= MAX_ATTEMPTS
            for s in group.siblings
        ):
            h.run(lambda cut: ledger.discard(cut, gid, reason="attempts used up"))
            return
        h.run(lambda cut: ledger.prepare_retry(cut, gid))

    def finalize(self, gid: str) -> None:
        h, ledger = self.h, self.ledger
        outcome = self.rng.random()
        h.run(lambda cut: ledger.start_finalization(cut, gid, owner="f"))
        if outcome < 0.05:  # unknown, nothing written
            h.run(lambda cut: ledger.mark_finalization_unknown(cut, gid, owner="f", error="x"))
            return
        h.put_canonical_rows(gid)
        if outcome < 0.1:  # unknown, every row written
            h.run(lambda cut: ledger.mark_finalization_unknown(cut, gid, owner="f", error="x"))
            return
        h.run(lambda cut: ledger.finalize(cut, gid, owner="f", min_weight_version=0))

    def train(self, step: int) -> None:
        ledger = self.ledger
        ids = [e.group_id for e in ledger.replay.entries("ready") if e.target_step == step]
        if ids:
            self.h.run(lambda cut: ledger.replay.select(cut, ids, step=step))
            self.h.run(lambda cut: ledger.replay.consume(cut, ids, step=step))
        stale = [e.group_id for e in ledger.replay.entries("ready") if (e.target_step or 0) < step]
        if stale:
            self.h.run(lambda cut: ledger.replay.evict(cut, stale, reason="too stale"))

    def checkpoint(self, step: int) -> None:
        h, ledger = self.h, self.ledger
        for gid, group in list(ledger.state.groups.items()):  # no checkpoint while unknown
            if group.status == "finalization_unknown":
                h.run(partial(ledger.resolve_finalization_unknown, group_id=gid))
        h.run_checkpoint(lambda cut: ledger.clear_superseded_rows(cut, step=step))
        h.checkpoint(step)
        self.check_exact(step)

    def check_exact(self, step: int) -> None:
        state = self.ledger.state
        live = {
            s.current.rollout_id
            for g in state.groups.values()
            for s in g.siblings
            if s.current.status in ("reserved", "dispatched")
        }
        staging = self.h.data_plane.list_keys(STAGING)
        expected = set(referenced_keys(state)) | {
            k for k, tags in staging.items() if tags.get("rollout_id") in live
        }
        assert set(staging) == expected, (step, sorted(set(staging) ^ expected)[:5])
        canonical = {r for e in state.replay.values() for r in e.canonical_row_ids}
        assert set(self.h.data_plane.list_keys("training")) == canonical, step
        self.sizes.append(len(staging) + len(canonical))

    def crash_and_restore(self) -> None:
        h = self.h
        h.fresh_process()
        h.data_plane = LoggedFirstDataPlane(h.log, h.data_plane)  # type: ignore[assignment]
        h.ledger = RecoveryLedger(h.log, h.data_plane)
        h.run(lambda cut: h.ledger.restore(cut, h.dataset), kind="recovery_restore")


@pytest.mark.parametrize(
    ("plane", "steps", "groups", "every", "restore_every"),
    [
        ("memory", 50, 40, 5, 15),  # 2,000 groups, 10 checkpoints, 3 restores
        pytest.param(
            "transferqueue", 8, 4, 2, 4, marks=[pytest.mark.slow, pytest.mark.tq]
        ),  # the real TransferQueue: 32 groups, 4 checkpoints, 2 restores
    ],
)
def test_a_long_run_with_failures_and_restores_leaks_no_row(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    plane: str,
    steps: int,
    groups: int,
    every: int,
    restore_every: int,
) -> None:
    path = tmp_path / "run.db"
    log = EventLog.open(path, durability="normal")
    fresh: Any = InMemoryDataPlane
    if plane == "transferqueue":
        tq = request.getfixturevalue("tq_data_plane")

        def emptied() -> Any:  # a new process: the rows died with the old one
            tq.clear()
            return tq

        fresh = emptied
    LoggedFirstDataPlane.deletes = 0
    wrapped = LoggedFirstDataPlane(log, fresh())
    h = Harness(
        path=path,
        log=log,
        data_plane=wrapped,  # type: ignore[arg-type]
        ledger=RecoveryLedger.open(log, wrapped),
        durability="normal",
        fresh_data_plane=fresh,
    )
    run = Run(h, seed=8, groups_per_step=groups)
    try:
        run.open_step(1)
        for step in range(1, steps + 1):
            if step < steps:
                run.open_step(step + 1)
            for gid in [
                g for g, s in h.ledger.state.groups.items() if (s.target_step or 0) <= step
            ]:
                run.drive(gid, finish=True)
            for gid in [g for g, s in h.ledger.state.groups.items() if s.target_step == step + 1]:
                run.drive(gid, finish=False)
            run.train(step)
            if step % every == 0:
                run.checkpoint(step)
                if step % restore_every == 0:
                    run.crash_and_restore()
        # Every restore, discard, retry and finalization outcome happened; nothing leaked.
        assert len(run.sizes) == steps // every
        kinds = [r.type for r in h.log.read()]
        assert kinds.count("RestoreCompleted") == steps // restore_every
        if plane == "memory":
            for kind in ("GroupDiscarded", "FinalizationRetryable", "RowsCleared"):
                assert kind in kinds, kind
        assert LoggedFirstDataPlane.deletes > 0
        first, peak = run.sizes[0], max(run.sizes)
        # Bounded by one step in flight and one step waiting: not by the number of steps.
        assert peak <= 2 * groups * 2 * 2, run.sizes
        assert run.sizes[-1] <= 2 * first + groups, run.sizes
    finally:
        h.log.close()
