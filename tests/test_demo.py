"""`eventlog demo` end to end: a real controller process SIGKILLed mid-step and restarted.

One run of the installed command with small settings (two controller processes, each with its
own vLLM engine, one after the other), then the log is read back here, independently of the
demo's own checks: the restore's counts equal what was sealed at its checkpoint, every sealed
sibling is kept, exactly the missing ones are dispatched again, nothing trains twice.

This module must run before anything starts the session's vLLM engine (`vllm_session`), so
that two engines never run at once: it sorts before the other vLLM test modules, and it does
not use that fixture.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from eventlog import EventLog
from eventlog.records import RecordedEvent
from eventlog.recovery.vocabulary import (
    CONTROLLER_STREAM,
    GroupFinalized,
    GroupSealed,
    ReplayConsumed,
    RestoreCompleted,
    RestoreStarted,
    SiblingsDispatched,
    SiblingSealed,
)
from projections.history import rebuild, rolled_back
from tests.fixtures.vllm import _unavailable

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

EVENTLOG = Path(sys.executable).with_name("eventlog")
REPO = Path(__file__).resolve().parents[1]
STEPS, GROUPS, SIBLINGS = 3, 2, 3
# Slots scarcer than attempts: step 2's echo group is caught half-sealed by step 1's
# checkpoint (its sibling 0 runs while step 1's arithmetic group reruns, twice as long).
ARGS = [
    "--steps", str(STEPS), "--groups", str(GROUPS), "--siblings", str(SIBLINGS),
    "--max-tokens", "8", "--slots", "4", "--kill-after-seals", "1",
]  # fmt: skip


@dataclass
class DemoResult:
    process: subprocess.CompletedProcess[str]
    records: list[RecordedEvent]
    db: Path


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    try:
        import vllm  # noqa: F401
    except Exception as exc:
        _unavailable(f"import vllm failed: {type(exc).__name__}: {exc}")
    run_dir = tmp_path_factory.mktemp("demo")
    env = {
        **os.environ,
        "EVENTLOG_TINY_MODEL_DIR": os.environ.get(
            "EVENTLOG_TINY_MODEL_DIR", str(REPO / ".cache" / "tiny-model")
        ),
        "TORCHINDUCTOR_CACHE_DIR": os.environ.get(
            "TORCHINDUCTOR_CACHE_DIR", str(REPO / ".cache" / "torchinductor")
        ),
    }
    process = subprocess.run(
        [str(EVENTLOG), "demo", "--run-dir", str(run_dir), *ARGS],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=REPO,
    )
    db = run_dir / "run.db"
    with EventLog.open(db) as log:
        records = list(log.read())
    return DemoResult(process, records, db)


def _controller(records: list[RecordedEvent]) -> list[RecordedEvent]:
    return [r for r in records if r.stream == CONTROLLER_STREAM]


def test_demo_exits_zero_and_prints_its_summary_and_replay_commands(demo: DemoResult) -> None:
    out = demo.process.stdout
    assert demo.process.returncode == 0, demo.process.stderr[-3000:] + out
    assert "eventlog demo passed" in out
    assert f"eventlog replay {demo.db} --type RestoreStarted" in out
    assert "SIGKILLed at seq" in out


def test_demo_restore_counts_equal_what_the_log_sealed_at_the_checkpoint(
    demo: DemoResult,
) -> None:
    records = demo.records
    (completed,) = [r for r in records if isinstance(r.event, RestoreCompleted)]
    (started,) = [r for r in records if isinstance(r.event, RestoreStarted)]
    event = completed.event
    assert isinstance(event, RestoreCompleted)
    assert event.checkpoint_step >= 1
    # The state at the checkpoint, folded here from the raw records.
    at_checkpoint = rebuild([r for r in records if r.seq <= event.checkpoint_seq], rolled_back([]))
    sealed = {
        (g.group_id, i)
        for g in at_checkpoint.groups.values()
        for i in g.indices("sealed")
        if g.granularity == "sibling" or g.status != "generating"
    }
    every = {(g.group_id, i) for g in at_checkpoint.groups.values() for i in range(SIBLINGS)}
    assert event.groups_restored == len(at_checkpoint.groups)
    assert event.siblings_reused == len(sealed) > 0
    assert event.siblings_redispatched == len(every - sealed) > 0
    # The rolled-back range is what the killed controller wrote after the checkpoint.
    assert (event.rolled_back_from_seq, event.rolled_back_until_seq) == (
        event.checkpoint_seq + 1,
        started.seq - 1,
    )
    assert any(
        isinstance(r.event, SiblingSealed | GroupSealed)
        for r in records
        if event.rolled_back_from_seq <= r.seq <= event.rolled_back_until_seq
    )


def test_demo_keeps_every_sealed_sibling_and_redispatches_exactly_the_missing_ones(
    demo: DemoResult,
) -> None:
    records = demo.records
    (completed,) = [r for r in records if isinstance(r.event, RestoreCompleted)]
    event = completed.event
    assert isinstance(event, RestoreCompleted)
    at_checkpoint = rebuild([r for r in records if r.seq <= event.checkpoint_seq], rolled_back([]))
    after = [r for r in records if r.seq > completed.seq]
    for group in at_checkpoint.groups.values():
        kept = set(group.indices("sealed"))
        missing = set(range(group.expected_generations)) - kept
        dispatched = [
            {a.generation_index for a in r.event.attempts}
            for r in after
            if isinstance(r.event, SiblingsDispatched) and r.event.group_id == group.group_id
        ]
        assert (dispatched[0] if dispatched else set()) == missing, group.group_id
        assert not any(d & kept for d in dispatched), group.group_id
        resealed = [
            r.event.generation_index
            for r in after
            if isinstance(r.event, SiblingSealed)
            and r.event.group_id == group.group_id
            and r.event.generation_index in kept
        ]
        assert resealed == [], group.group_id
        assert any(
            isinstance(r.event, GroupFinalized) and r.event.group_id == group.group_id
            for r in after
        ), f"{group.group_id} was never finalized after the restore"


def test_demo_finalizes_and_trains_every_group_exactly_once(demo: DemoResult) -> None:
    records = demo.records
    skipped = rolled_back(_controller(records))
    effective = [r for r in records if r.seq not in skipped]
    finalized = Counter(r.event.group_id for r in effective if isinstance(r.event, GroupFinalized))
    trained = Counter(
        gid for r in effective if isinstance(r.event, ReplayConsumed) for gid in r.event.group_ids
    )
    assert set(finalized.values()) == {1}
    assert set(trained.values()) == {1}
    assert len(trained) == STEPS * GROUPS
    assert set(trained) == set(finalized)


def test_the_demos_log_verifies(demo: DemoResult) -> None:
    result = subprocess.run(
        [str(EVENTLOG), "verify", str(demo.db)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f"ok: {len(demo.records)} records")
