"""A run written by the real RecoveryLedger for the audit commands to read: two steps, a
failure and a retry, a late result, a clean-up of superseded rows, a checkpoint, a crash, a
restore that rolls back a reservation and a seal, the rolled-back group's prompt reserved
again under a new id,
and training after the restore.

    step 1: g1 (math_agent/math, 3 siblings), g2 (code_agent/code, 2 siblings)
            g1_g1 stages a row and fails; retry g1_g1-a1; g1_g1's late result is rejected;
            g2 sealed, finalized, trained in step 1; the failed attempt's row is cleared
            checkpoint 1
    then    g1_g2 sealed; g3 reserved and dispatched; g1_g1-a1 finished (not sealed)
            crash, restore to checkpoint 1: all of that rolled back
    step 2: g3's prompt reserved again as g3b; g1 and g3b sealed, finalized, trained in
            step 2; checkpoint 2
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from eventlog.records import ANY
from eventlog.recovery.errors import StaleAttemptError
from eventlog.recovery.restore import RestorePlan
from eventlog.recovery.vocabulary import (
    GenerationFinished,
    GenerationStarted,
    Receipt,
    attempt_stream,
)
from tests.fixtures.ledger import Harness


def start(h: Harness, rid: str, group_id: str, index: int, attempt: int, weight: int = 0) -> None:
    h.log.append(
        attempt_stream(rid),
        [
            GenerationStarted(
                rollout_id=rid,
                group_id=group_id,
                generation_index=index,
                attempt=attempt,
                worker=f"w{index % 2}",
                model="tiny",
                weight_version=weight,
            )
        ],
        ANY,
    )


def work(h: Harness, group_id: str, index: int, *, seal: bool = True, weight: int = 0) -> Receipt:
    """A worker runs the current attempt (start, two staged rows, finish); the controller seals."""
    current = h.ledger.group(group_id).siblings[index].current
    rid = current.rollout_id
    start(h, rid, group_id, index, current.attempt, weight)
    receipt = h.stage(rid)  # two rows of 3 tokens
    h.log.append(
        attempt_stream(rid),
        [
            GenerationFinished(
                rollout_id=rid,
                finish_reason="stop",
                token_count=6,
                reward=0.5,
                staging_keys=list(receipt.staging_keys),
            )
        ],
        ANY,
    )
    if seal:
        h.run(
            lambda cut: h.ledger.seal_sibling(
                cut,
                group_id,
                index,
                rollout_id=rid,
                receipt=receipt,
                reward=0.25 * (index + 1),
                mask_sample=index == 1,
            )
        )
    return receipt


def train(h: Harness, group_id: str, step: int) -> None:
    """Finalize a fully sealed group, then the trainer selects and consumes it at `step`."""
    h.finalize(group_id)
    h.run(lambda cut: h.ledger.replay.select(cut, [group_id], step=step))
    h.run(lambda cut: h.ledger.replay.consume(cut, [group_id], step=step))


@dataclass
class AuditedRun:
    h: Harness
    plan: RestorePlan
    checkpoint_1: int
    """Seq of step 1's CheckpointCommitted."""
    restore_seq: int
    """Seq of the RestoreStarted."""

    @property
    def path(self) -> str:
        return str(self.h.path)


def build(h: Harness) -> AuditedRun:
    h.reserve("g1", n=3, agent="math_agent", task="math", target_step=1)
    h.reserve("g2", n=2, agent="code_agent", task="code", target_step=1)
    h.dispatch("g1")
    h.dispatch("g2")
    work(h, "g1", 0)
    start(h, "g1_g1", "g1", 1, 0)
    h.stage("g1_g1", calls=1)
    h.run(lambda cut: h.ledger.fail_attempt(cut, "g1", 1, rollout_id="g1_g1", error="oom"))
    h.run(lambda cut: h.ledger.prepare_retry(cut, "g1"))
    h.dispatch("g1", [1])
    with pytest.raises(StaleAttemptError) as late:  # g1_g1's result arrives after all
        h.run(
            lambda cut: h.ledger.seal_sibling(
                cut, "g1", 1, rollout_id="g1_g1", receipt=None, reward=1.0, mask_sample=False
            )
        )
    h.run(lambda cut: h.ledger.record_rejected_result(cut, late.value))
    for i in range(2):
        work(h, "g2", i)
    train(h, "g2", 1)
    h.run(lambda cut: h.ledger.clear_superseded_rows(cut))
    h.checkpoint(1)
    checkpoint_1 = h.log.head()
    work(h, "g1", 2)  # sealed after the checkpoint: rolled back by the restore
    h.reserve("g3", n=2, agent="math_agent", task="math", target_step=2)  # rolled back too
    h.dispatch("g3")
    work(h, "g1", 1, seal=False)  # g1_g1-a1 finished, not yet sealed at the crash

    h.fresh_process()
    plan = h.run(lambda cut: h.ledger.restore(cut, h.dataset), kind="recovery_restore")
    (restore_seq,) = [r.seq for r in h.records("controller") if r.type == "RestoreStarted"]
    h.reserve("g3b", n=2, agent="math_agent", task="math", target_step=2, weight=1, sample_id="g3")
    h.dispatch("g1")
    h.dispatch("g3b")
    for index in (1, 2):
        work(h, "g1", index, weight=1)
    for index in (0, 1):
        work(h, "g3b", index, weight=1)
    train(h, "g1", 2)
    train(h, "g3b", 2)
    h.checkpoint(2)
    return AuditedRun(h=h, plan=plan, checkpoint_1=checkpoint_1, restore_seq=restore_seq)


@pytest.fixture(name="run")
def run_fixture(harness: Harness) -> AuditedRun:
    return build(harness)
