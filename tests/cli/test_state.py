"""`eventlog state`: the ledger as a restore would rebuild it at a seq, a step or a checkpoint.

Checked against what the ledger itself recorded when it wrote the log: every
CheckpointCommitted carries the digest of the ledger state at that point.
"""

from __future__ import annotations

import json
from typing import Any

from eventlog.recovery.vocabulary import CheckpointCommitted, GroupReserved, RestoreStarted
from tests.cli.audited_run import AuditedRun
from tests.cli.helpers import cli


def state_json(run: AuditedRun, *args: str) -> dict[str, Any]:
    result = cli("state", run.path, *args, "--json")
    assert result.exit_code == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def test_state_at_each_checkpoint_has_the_digest_the_ledger_recorded_there(
    run: AuditedRun,
) -> None:
    checkpoints = [
        (r.seq, r.event) for r in run.h.log.read() if isinstance(r.event, CheckpointCommitted)
    ]
    assert len(checkpoints) == 2
    for seq, event in checkpoints:
        by_checkpoint = state_json(run, "--checkpoint", str(event.step))
        assert (by_checkpoint["seq"], by_checkpoint["digest"]) == (seq, event.ledger_digest)
        assert len(by_checkpoint["groups"]) == event.group_count
        assert state_json(run, "--at", str(seq))["digest"] == event.ledger_digest
        assert state_json(run, "--step", str(event.step))["digest"] == event.ledger_digest


def test_state_skips_only_what_was_rolled_back_as_of_that_point(run: AuditedRun) -> None:
    records = list(run.h.log.read())
    (restore,) = [r for r in records if isinstance(r.event, RestoreStarted)]
    (g3,) = [r for r in records if isinstance(r.event, GroupReserved) and r.event.group_id == "g3"]
    before = state_json(run, "--at", str(restore.seq - 1))  # the restore did not exist yet
    assert "g3" in [g["group_id"] for g in before["groups"]]
    g1 = {g["group_id"]: g for g in before["groups"]}["g1"]
    assert [s["status"] for s in g1["siblings"]] == ["sealed", "dispatched", "sealed"]

    after = state_json(run, "--at", str(restore.seq))
    assert "g3" not in [g["group_id"] for g in after["groups"]]  # rolled back by it
    g1 = {g["group_id"]: g for g in after["groups"]}["g1"]
    assert (g1["sealed"], g1["missing"]) == (1, 2)
    assert state_json(run, "--at", str(g3.seq - 1))["groups_by_status"] == before[
        "groups_by_status"
    ] | {"generating": before["groups_by_status"]["generating"] - 1}


def test_state_prints_groups_by_status_for_people(run: AuditedRun) -> None:
    lines = cli("state", run.path, "--checkpoint", "1").stdout.splitlines()
    assert lines[0].startswith("ledger at seq ")
    assert lines[0].endswith("1 groups (1 generating)")
    assert lines[1] == "replay buffer: empty"
    row = next(line.split() for line in lines if line.startswith("g1 "))
    assert row[:6] == ["g1", "generating", "admitted", "1", "1", "2"]


def test_state_refuses_two_points_and_unknown_ones_in_one_line(run: AuditedRun) -> None:
    for args, expected in [
        (
            ["--at", "1", "--step", "1"],
            "error: give one of --at, --step, --checkpoint (got --at, --step)",
        ),
        (["--at", "100000"], f"error: seq 100000: not in the log (valid: 0..{run.h.log.head()})"),
        (
            ["--checkpoint", "3"],
            "error: checkpoint 3: the log has no effective checkpoint of step 3 (nearest: 1, 2)",
        ),
    ]:
        result = cli("state", run.path, *args)
        assert result.exit_code == 2, args
        assert result.stderr.splitlines() == [expected]
