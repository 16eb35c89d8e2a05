"""`eventlog diff`: what changed between two points, read off the records in between."""

from __future__ import annotations

import json
from typing import Any

from eventlog.recovery.vocabulary import ReplayConsumed, RestoreStarted, SiblingSealed
from tests.cli.audited_run import AuditedRun
from tests.cli.helpers import cli


def diff_json(run: AuditedRun, a: str, b: str) -> dict[str, Any]:
    result = cli("diff", run.path, a, b, "--json")
    assert result.exit_code == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def test_diff_between_checkpoints_lists_what_the_step_did(run: AuditedRun) -> None:
    records = list(run.h.log.read())
    (restore,) = [r for r in records if isinstance(r.event, RestoreStarted)]
    assert isinstance(restore.event, RestoreStarted)
    low, high = restore.event.rolled_back_from_seq, restore.seq - 1
    found = diff_json(run, "checkpoint:1", "checkpoint:2")
    assert found["from_seq"] == run.checkpoint_1
    assert found["restores"] == [restore.seq]
    assert found["reserved"] == ["g3b"]  # g3's reservation was rolled back
    sealed = [
        f"{r.event.group_id}:{r.event.generation_index}"
        for r in records
        if isinstance(r.event, SiblingSealed)
        and r.seq > run.checkpoint_1
        and not low <= r.seq <= high
    ]
    assert found["sealed"] == sealed
    trained = [
        g
        for r in records
        if isinstance(r.event, ReplayConsumed) and r.event.step == 2
        for g in r.event.group_ids
    ]
    assert found["trained"] == {"2": trained}
    assert found["gone"] == ["g1"]  # in the ledger at checkpoint 1, trained since
    assert found["groups_before"] == 1 and found["groups_after"] == 0


def test_diff_across_a_restore_shows_the_groups_it_took_away(run: AuditedRun) -> None:
    records = list(run.h.log.read())
    (restore,) = [r for r in records if isinstance(r.event, RestoreStarted)]
    found = diff_json(run, str(restore.seq - 1), str(restore.seq))
    assert found["gone"] == ["g3"]
    assert found["restores"] == [restore.seq]


def test_diff_prints_one_line_per_kind_of_change(run: AuditedRun) -> None:
    lines = cli("diff", run.path, "checkpoint:1", "head").stdout.splitlines()
    assert lines[0].endswith("groups in the ledger 1 -> 0")
    assert "reserved (1): g3b" in lines
    assert "trained in step 2 (2): g1 g3b" in lines


def test_diff_of_points_in_the_wrong_order_or_unknown_is_one_line(run: AuditedRun) -> None:
    for args, expected in [
        (
            ["head", "1"],
            f"error: head (seq {run.h.log.head()}) comes after 1 (seq 1): give A first",
        ),
        (["step:9", "head"], "error: step 9: not in the log (nearest: 1, 2)"),
        (
            ["yesterday", "head"],
            "error: point 'yesterday': expected a seq, step:N, checkpoint:N or head",
        ),
    ]:
        result = cli("diff", run.path, *args)
        assert result.exit_code == 2, args
        assert result.stderr.splitlines() == [expected]


def test_diff_counts_the_staging_rows_a_finalize_lists_and_the_clean_ups_beside_it(
    run: AuditedRun,
) -> None:
    """rows_cleared: a finalize's own record lists its staging rows (GroupFinalized), the
    checkpoints' and restores' clean-ups are StagingCleared records; both are counted."""
    from eventlog.recovery.vocabulary import GroupFinalized, StagingCleared

    head = run.h.log.head()
    listed = 0
    for r in run.h.log.read():
        if isinstance(r.event, GroupFinalized):
            listed += len(r.event.staging_cleared)
        elif isinstance(r.event, StagingCleared):
            listed += len(r.event.of_attempts) + len(r.event.never_staged)
    assert any(
        isinstance(r.event, GroupFinalized) and r.event.staging_cleared for r in run.h.log.read()
    )
    assert diff_json(run, "0", str(head))["rows_cleared"] == listed
