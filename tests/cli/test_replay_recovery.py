"""`eventlog replay` on a recovery run: rolled-back records marked, `--effective`, every
record about a group wherever it lives, and `--step` / `--checkpoint`.

Expected seqs are derived from the records themselves (read with the log's API), never from
the code under test.
"""

from __future__ import annotations

from typing import Any

import pytest

from eventlog.records import RecordedEvent
from eventlog.recovery.vocabulary import (
    CheckpointCommitted,
    RestoreCompleted,
    RestoreStarted,
    StagingCleared,
)
from tests.cli.audited_run import AuditedRun
from tests.cli.helpers import cli, json_lines


def replayed(path: str, *args: str) -> list[dict[str, Any]]:
    result = cli("replay", path, "--json", *args)
    assert result.exit_code == 0, result.stderr
    return json_lines(result.stdout)


def records(run: AuditedRun) -> list[RecordedEvent]:
    return list(run.h.log.read())


def rolled_back_range(run: AuditedRun) -> tuple[int, int, int]:
    """(first, last, restore seq): RestoreStarted's own fields say what it rolled back."""
    (restore,) = [r for r in records(run) if isinstance(r.event, RestoreStarted)]
    assert isinstance(restore.event, RestoreStarted)
    return restore.event.rolled_back_from_seq, restore.seq - 1, restore.seq


def test_replay_marks_every_rolled_back_record_with_the_restore_that_rolled_it_back(
    run: AuditedRun,
) -> None:
    low, high, restore = rolled_back_range(run)
    shown = replayed(run.path)
    assert [o["seq"] for o in shown] == [r.seq for r in records(run)]
    marked = [o for o in shown if o.get("rolled_back")]
    assert [o["seq"] for o in marked] == list(range(low, high + 1))
    assert {o["rolled_back_by"] for o in marked} == {restore}
    assert all("rolled_back" not in o for o in shown if not low <= o["seq"] <= high)


def test_replay_effective_hides_exactly_the_rolled_back_records(run: AuditedRun) -> None:
    low, high, _ = rolled_back_range(run)
    shown = [o["seq"] for o in replayed(run.path, "--effective")]
    assert shown == [r.seq for r in records(run) if not low <= r.seq <= high]


def test_replay_table_has_a_rolled_back_column_naming_the_restore(run: AuditedRun) -> None:
    low, _, restore = rolled_back_range(run)
    result = cli("replay", run.path)
    lines = result.stdout.splitlines()
    assert lines[0].split()[:6] == ["seq", "time", "(UTC)", "rolled", "back", "by"]
    (row,) = [line.split() for line in lines[1:] if line.split()[0] == str(low)]
    assert row[3] == str(restore)
    (effective_header, *_) = cli("replay", run.path, "--effective").stdout.splitlines()
    assert "rolled back" not in effective_header


def _about(rec: RecordedEvent, group_id: str, rollout_ids: set[str]) -> bool:
    """Is this record about the group? Decided from the event's own fields."""
    if rec.stream == f"group/{group_id}" or rec.stream.removeprefix("attempt/") in rollout_ids:
        return True
    if group_id in getattr(rec.event, "group_ids", ()):
        return True
    event = rec.event
    if isinstance(event, StagingCleared):
        return any(c.rollout_id in rollout_ids for c in event.of_attempts)
    return False


def test_replay_group_includes_every_record_about_the_group_wherever_it_lives(
    run: AuditedRun,
) -> None:
    low, high, restore = rolled_back_range(run)
    everything = records(run)
    rollout_ids = {
        ref.rollout_id
        for r in everything
        if r.stream == "group/g1"
        for ref in getattr(r.event, "attempts", [])
    } | {"g1_g0", "g1_g1", "g1_g2"}
    own = [r.seq for r in everything if _about(r, "g1", rollout_ids)]
    restores = [
        r.seq
        for r in everything
        if isinstance(r.event, RestoreStarted | RestoreCompleted)
        and r.event.rolled_back_from_seq == low
    ]
    assert any(low <= seq <= high for seq in own)  # g1 had records rolled back
    shown = [o["seq"] for o in replayed(run.path, "--group", "g1")]
    assert shown == sorted({*own, *restores})
    assert restore in shown

    trained = replayed(run.path, "--group", "g1", "--type", "ReplayConsumed")
    assert [(o["data"]["step"], "g1" in o["data"]["group_ids"]) for o in trained] == [(2, True)]
    cleared = replayed(run.path, "--group", "g1", "--type", "StagingCleared")
    by_stream = {
        o["stream"]: sorted({c["rollout_id"] for c in o["data"]["of_attempts"]}) for o in cleared
    }
    # The failed attempt's rows at the checkpoint; the sealed ones' when g1 was finalized,
    # listed by its GroupFinalized (the fact and its clean-up are one record).
    assert by_stream == {"controller": ["g1_g1"]}
    (finalized,) = replayed(run.path, "--group", "g1", "--type", "GroupFinalized")
    assert finalized["stream"] == "group/g1"
    assert sorted({c["rollout_id"] for c in finalized["data"]["staging_cleared"]}) == [
        "g1_g0",
        "g1_g1-a2",
        "g1_g2-a1",
    ]

    # g2 trained before the checkpoint: no restore touched it, so none is shown
    g2 = replayed(run.path, "--group", "g2")
    assert not any(o["type"].startswith("Restore") for o in g2)
    assert [o["type"] for o in g2 if o["stream"] == "replay"] == [
        "ReplaySelected",
        "ReplayConsumed",
        "RowsCleared",  # its canonical rows, trained: one append with the consume
    ]


def test_replay_step_and_checkpoint_select_by_the_effective_checkpoints(
    run: AuditedRun,
) -> None:
    checkpoints = {
        r.event.step: r.seq for r in records(run) if isinstance(r.event, CheckpointCommitted)
    }
    head = run.h.log.head()
    assert [o["seq"] for o in replayed(run.path, "--step", "1")] == list(
        range(1, checkpoints[1] + 1)
    )
    assert [o["seq"] for o in replayed(run.path, "--step", "2")] == list(
        range(checkpoints[1] + 1, checkpoints[2] + 1)
    )
    assert [o["seq"] for o in replayed(run.path, "--checkpoint", "1")] == list(
        range(1, checkpoints[1] + 1)
    )
    # g2's staging rows were cleared when it was finalized, in step 1: nothing left for later.
    assert replayed(run.path, "--step", "2", "--group", "g2") == []
    both = replayed(run.path, "--step", "1", "--group", "g2", "--type", "GroupFinalized")
    assert [(o["stream"], o["data"]["target_step"]) for o in both] == [("group/g2", 1)]
    assert both[0]["data"]["staging_cleared"]
    assert checkpoints[2] == head


def test_an_unknown_step_group_or_checkpoint_is_one_line_naming_it_and_the_nearest(
    run: AuditedRun,
) -> None:
    for args, expected in [
        (["--step", "7"], "error: step 7: not in the log (nearest: 1, 2)"),
        (
            ["--checkpoint", "0"],
            "error: checkpoint 0: the log has no effective checkpoint of step 0 (nearest: 1, 2)",
        ),
        (
            ["--group", "g4"],
            "error: group 'g4': the log has no stream 'group/g4' (nearest: g1, g2, g3)",
        ),
    ]:
        result = cli("replay", run.path, *args)
        assert result.exit_code == 2, args
        assert result.stderr.splitlines()[0] == expected
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize("option", ["--step", "--checkpoint"])
def test_two_steps_or_checkpoints_are_refused_not_narrowed_to_nothing(
    run: AuditedRun, option: str
) -> None:
    """Ranges narrow: `--step 1 --step 2` printed nothing, exit 0."""
    result = cli("replay", run.path, option, "1", option, "2")
    assert result.exit_code == 2
    assert "give one (got 1, 2)" in result.output and "--from-seq" in result.output
