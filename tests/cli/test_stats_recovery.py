"""`eventlog stats` on a recovery run: every figure agrees with the log.

The expected figures are derived here from the records themselves (simple sums over the
events, the rolled-back range read off the RestoreStarted record), never from the code
under test.
"""

from __future__ import annotations

import gc
import json
from collections import Counter
from typing import Any

import pytest

from eventlog import EventLog
from eventlog.records import RecordedEvent
from eventlog.recovery.vocabulary import (
    AttemptFailed,
    CheckpointCommitted,
    GenerationStarted,
    GroupFinalized,
    GroupReserved,
    ReplayConsumed,
    RestoreCompleted,
    RestoreStarted,
    RetryPrepared,
    SiblingsDispatched,
    SiblingSealed,
    TokensStaged,
)
from tests.cli.audited_run import AuditedRun
from tests.cli.helpers import cli, collector_states_at_fold


def stats_json(path: str) -> dict[str, Any]:
    result = cli("stats", path, "--json")
    assert result.exit_code == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    return out


class Derived:
    """Figures read straight off the records."""

    def __init__(self, records: list[RecordedEvent]) -> None:
        self.records = records
        (restore,) = [r for r in records if isinstance(r.event, RestoreStarted)]
        assert isinstance(restore.event, RestoreStarted)
        self.low, self.high = restore.event.rolled_back_from_seq, restore.seq - 1
        self.effective = [r for r in records if not self.low <= r.seq <= self.high]
        self.checkpoints = sorted(
            (r.seq, r.event.step)
            for r in self.effective
            if isinstance(r.event, CheckpointCommitted)
        )

    def events(self, cls: type[Any], *, effective: bool = False) -> list[Any]:
        return [
            r.event
            for r in (self.effective if effective else self.records)
            if isinstance(r.event, cls)
        ]

    def step_of(self, seq: int) -> int:
        return next(step for at, step in self.checkpoints if seq <= at)

    def kept_keys(self) -> dict[str, str]:
        """Staging key -> group, for the effective seals of finalized groups."""
        finalized = {e.group_id for e in self.events(GroupFinalized, effective=True)}
        return {
            key: e.group_id
            for e in self.events(SiblingSealed, effective=True)
            if e.group_id in finalized and e.receipt is not None
            for key in e.receipt.staging_keys
        }


def test_stats_counts_agree_with_the_records(run: AuditedRun) -> None:
    d = Derived(list(run.h.log.read()))
    recovery = stats_json(run.path)["recovery"]
    total = recovery["total"]

    assert recovery["rolled_back_records"] == d.high - d.low + 1
    assert recovery["restores"] == len(d.events(RestoreStarted))
    assert total["dispatched"] == sum(len(e.attempts) for e in d.events(SiblingsDispatched))
    assert total["started"] == len(d.events(GenerationStarted))
    assert total["retries"] == sum(len(e.attempts) for e in d.events(RetryPrepared))
    assert total["failed"] == len(d.events(AttemptFailed))
    assert total["groups"] == len(d.events(GroupReserved, effective=True))
    assert total["finalized"] == len(d.events(GroupFinalized, effective=True))
    staged = d.events(TokensStaged)
    kept = d.kept_keys()
    assert total["tokens_staged"] == sum(e.token_count for e in staged)
    assert total["tokens_kept"] == sum(e.token_count for e in staged if e.staging_key in kept)
    assert total["tokens_discarded"] == sum(
        e.token_count for e in staged if e.staging_key not in kept
    )
    per_key = {(r["agent_name"], r["task_name"]): r for r in recovery["by_agent_task"]}
    reserved = d.events(GroupReserved, effective=True)
    for (agent, task), row in per_key.items():
        mine = [e for e in reserved if (e.agent_name, e.prompt_ref.task_name) == (agent, task)]
        assert row["groups"] == len(mine)


def test_stats_per_step_reports_training_staleness_waste_retries_and_restore_cost(
    run: AuditedRun,
) -> None:
    d = Derived(list(run.h.log.read()))
    by_step = {s["step"]: s for s in stats_json(run.path)["recovery"]["by_step"]}
    assert sorted(by_step) == [step for _, step in d.checkpoints]

    sizes = {e.group_id: e.expected_generations for e in d.events(GroupReserved, effective=True)}
    weight = {e.rollout_id: e.weight_version for e in d.events(GenerationStarted)}
    tokens_of_key = {e.staging_key: e.token_count for e in d.events(TokensStaged)}
    seals = d.events(SiblingSealed, effective=True)
    kept = d.kept_keys()
    trained: dict[int, list[str]] = {}
    for consumed in d.events(ReplayConsumed, effective=True):
        trained.setdefault(consumed.step, []).extend(consumed.group_ids)
    assert trained  # the scenario trains
    for n, groups in trained.items():
        mine = [s for s in seals if s.group_id in groups]
        assert by_step[n]["groups_trained"] == len(groups)
        assert by_step[n]["siblings_trained"] == sum(sizes[g] for g in groups)
        assert by_step[n]["staleness"] == {
            str(lag): count
            for lag, count in sorted(Counter(n - weight[s.rollout_id] for s in mine).items())
        }
        assert by_step[n]["tokens_trained"] == sum(
            tokens_of_key[k] for s in mine if s.receipt for k in s.receipt.staging_keys
        )
    thrown: Counter[int] = Counter()
    retries: Counter[int] = Counter()
    for r in d.records:
        if isinstance(r.event, TokensStaged) and r.event.staging_key not in kept:
            thrown[d.step_of(r.seq)] += r.event.token_count
        if isinstance(r.event, RetryPrepared):
            retries[d.step_of(r.seq)] += len(r.event.attempts)
    for n, step in by_step.items():
        assert step["tokens_thrown_away"] == thrown[n], n
        assert step["retries"] == retries[n], n
    (completed,) = d.events(RestoreCompleted)
    assert by_step[2]["restores"] == 1
    assert by_step[2]["rolled_back_records"] == d.high - d.low + 1
    assert by_step[2]["siblings_redispatched"] == completed.siblings_redispatched
    assert by_step[2]["rows_cleared"] == completed.rows_cleared
    assert by_step[1]["restores"] == 0


def test_stats_prints_the_per_step_table_for_people(run: AuditedRun) -> None:
    result = cli("stats", run.path)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    at = lines.index("per step (staleness: trained step - weight version, siblings)")
    header = lines[at + 1].split()
    assert header[:3] == ["step", "groups", "trained"]
    rows = {line.split()[0]: line.split() for line in lines[at + 2 :]}
    assert set(rows) == {"1", "2"}
    assert rows["2"][1] == "2"  # g1 and g3b trained in step 2


def test_stats_prints_the_recovery_table_for_people(run: AuditedRun) -> None:
    d = Derived(list(run.h.log.read()))
    lines = cli("stats", run.path).stdout.splitlines()
    assert (
        f"rollout recovery: 1 restore(s), 2 checkpoint(s), {d.high - d.low + 1} "
        "rolled-back record(s)" in lines
    )
    (header,) = [line.split() for line in lines if line.startswith("agent ")]
    assert header[:6] == ["agent", "task", "groups", "finalized", "dispatched", "started"]


def test_stats_of_a_log_without_recovery_events_has_no_recovery_part(tmp_path: Any) -> None:
    path = str(tmp_path / "plain.db")
    with EventLog.open(path) as log:
        log.append(
            "attempt/x_g0",
            [
                TokensStaged(
                    rollout_id="x_g0",
                    partition="p",
                    staging_key="k",
                    token_count=1,
                    weight_version=0,
                )
            ],
        )
    stats = stats_json(path)
    assert stats["records"] == 1 and "recovery" not in stats
    assert "rollout recovery" not in cli("stats", path).stdout


def test_the_recovery_pass_runs_with_the_cyclic_collector_paused(
    run: AuditedRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pass keeps an object per attempt alive; collections meanwhile only rescanned them.
    The collector is on again afterwards."""
    seen = collector_states_at_fold(monkeypatch)
    assert gc.isenabled()
    assert stats_json(run.path)["recovery"]["total"]["groups"] > 0
    assert seen == [False]
    assert gc.isenabled()
