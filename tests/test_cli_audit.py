"""`eventlog inspect group` and the recovery part of `eventlog stats`, on a log written by the
real RecoveryLedger (SQLite file, in-memory data plane, real barrier) through a checkpoint, a
crash and a restore.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner, Result

from eventlog.cli.main import main
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


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def start(h: Harness, rid: str, group_id: str, index: int, attempt: int) -> None:
    h.log.append(
        attempt_stream(rid),
        [
            GenerationStarted(
                rollout_id=rid,
                group_id=group_id,
                generation_index=index,
                attempt=attempt,
                worker="w0",
                model="tiny",
                weight_version=0,
            )
        ],
        ANY,
    )


def work(h: Harness, group_id: str, index: int, *, seal: bool = True) -> Receipt:
    """A worker runs the current attempt (start, two staged rows, finish); the controller seals."""
    current = h.ledger.group(group_id).siblings[index].current
    rid = current.rollout_id
    start(h, rid, group_id, index, current.attempt)
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
                mask_sample=False,
            )
        )
    return receipt


@pytest.fixture(name="restored")
def restored_fixture(harness: Harness) -> tuple[Harness, RestorePlan]:
    """g1 (math_agent/math, 3 siblings) and g2 (code_agent/code, 2 siblings, finalized);
    a checkpoint; more work on g1; a crash; a restore to the checkpoint."""
    h = harness
    h.reserve("g1", n=3, agent="math_agent", task="math")
    h.reserve("g2", n=2, agent="code_agent", task="code")
    h.dispatch("g1")
    h.dispatch("g2")
    work(h, "g1", 0)
    start(h, "g1_g1", "g1", 1, 0)
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
    h.run(lambda cut: h.ledger.start_finalization(cut, "g2", owner="f"))
    h.run(lambda cut: h.ledger.finalize(cut, "g2", owner="f", min_weight_version=0))
    h.checkpoint(1)
    work(h, "g1", 2)  # sealed after the checkpoint: rolled back by the restore
    work(h, "g1", 1, seal=False)  # g1_g1-a1 finished, not yet sealed at the crash

    h.fresh_process()
    plan = h.run(lambda cut: h.ledger.restore(cut, h.dataset), kind="recovery_restore")
    return h, plan


def test_inspect_group_shows_its_streams_in_seq_order_with_rolled_back_records_marked(
    restored: tuple[Harness, RestorePlan],
) -> None:
    h, plan = restored
    low, high = plan.rolled_back
    result = cli("inspect", "group", str(h.path), "g1", "--json")
    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)

    timeline = shown["timeline"]
    assert set(timeline[0]) == {
        "seq",
        "stream",
        "version",
        "event_id",
        "type",
        "recorded_at",
        "data",
        "rolled_back",
    }
    seqs = [r["seq"] for r in timeline]
    assert seqs == sorted(set(seqs))
    expected = sorted(
        r.seq
        for r in h.log.read()
        if r.stream == "group/g1"
        or r.stream.startswith("attempt/g1_")
        or r.type in ("RestoreStarted", "RestoreCompleted")  # it rolled back g1's records
    )
    assert seqs == expected  # every record about g1, nothing of g2
    rolled = [r["seq"] for r in timeline if r["rolled_back"]]
    assert rolled == [s for s in seqs if low <= s <= high] and len(rolled) == 9
    sealed_after_checkpoint = [
        r for r in timeline if r["type"] == "SiblingSealed" and r["data"]["generation_index"] == 2
    ]
    assert [r["rolled_back"] for r in sealed_after_checkpoint] == [True]

    group = shown["group"]
    assert (group["agent_name"], group["task_name"], group["fate"]) == (
        "math_agent",
        "math",
        "in the ledger",
    )
    assert group["rolled_back_records"] == 9
    attempts = {a["rollout_id"]: (a["verdict"], a["worker"]) for a in group["attempts"]}
    assert attempts == {
        "g1_g0": ("sealed", "finished"),
        "g1_g1": ("failed", "running"),
        "g1_g1-a1": ("abandoned", "finished"),
        "g1_g1-a2": ("reserved", "not started"),
        "g1_g2": ("abandoned", "finished"),
        "g1_g2-a1": ("reserved", "not started"),
    }
    stale = {a["rollout_id"]: a["stale_rejections"] for a in group["attempts"]}
    assert stale["g1_g1"] == 1


def test_inspect_group_prints_a_header_attempts_and_a_marked_timeline(
    restored: tuple[Harness, RestorePlan],
) -> None:
    h, _ = restored
    result = cli("inspect", "group", str(h.path), "g2")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert out.splitlines()[0] == (
        "group g2 · agent code_agent · task code · granularity sibling · 2 siblings · finalized"
    )
    assert "rolled back" not in out  # g2 finalized before the checkpoint

    marked = cli("inspect", "group", str(h.path), "g1").stdout.splitlines()
    assert marked[1].endswith(" records, 9 rolled back by a restore")
    timeline = marked[marked.index("timeline") + 2 :]
    seqs = [int(line.split()[0]) for line in timeline]
    assert seqs == sorted(seqs) and len(seqs) == int(marked[1].split()[0])
    rolled = [line for line in timeline if line.split()[3:5] == ["rolled", "back"]]
    assert len(rolled) == 9
    assert any("SiblingSealed" in line and "generation_index=2" in line for line in rolled)


def test_inspect_of_an_unknown_group_is_a_usage_error_naming_it(
    restored: tuple[Harness, RestorePlan],
) -> None:
    h, _ = restored
    result = cli("inspect", "group", str(h.path), "nope")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: group 'nope': the log has no stream 'group/nope'\n")
    assert "hint:" in result.stderr
