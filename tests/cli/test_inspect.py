"""`eventlog inspect group|rollout|step` on a recovery run.

Expected answers are read off the records (which seal is effective, which restore rolled
back what, which step consumed the group), never from the code under test.
"""

from __future__ import annotations

import json
from typing import Any

from eventlog.records import RecordedEvent
from eventlog.recovery.vocabulary import (
    AttemptFailed,
    GenerationStarted,
    GroupFinalized,
    ReplayConsumed,
    RestoreStarted,
    SiblingSealed,
    StagingCleared,
    TokensStaged,
    UnsealedAbandoned,
)
from tests.cli.audited_run import AuditedRun, work
from tests.cli.helpers import cli, insert_raw, query, sql
from tests.fixtures.ledger import Harness


def inspect_json(run: AuditedRun, *args: str) -> dict[str, Any]:
    result = cli("inspect", *args[:1], run.path, *args[1:], "--json")
    assert result.exit_code == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    return out


class Facts:
    def __init__(self, run: AuditedRun) -> None:
        self.records: list[RecordedEvent] = list(run.h.log.read())
        (restore,) = [r for r in self.records if isinstance(r.event, RestoreStarted)]
        assert isinstance(restore.event, RestoreStarted)
        self.restore = restore.seq
        self.low, self.high = restore.event.rolled_back_from_seq, restore.seq - 1

    def effective(self, cls: type[Any]) -> list[tuple[int, Any]]:
        return [
            (r.seq, r.event)
            for r in self.records
            if isinstance(r.event, cls) and not self.low <= r.seq <= self.high
        ]


def test_inspect_group_names_per_sibling_the_attempt_that_counts_and_why_others_do_not(
    run: AuditedRun,
) -> None:
    facts = Facts(run)
    view = inspect_json(run, "group", "g1")["group"]
    counting = {a["generation_index"]: a for a in view["attempts"] if a["verdict"] == "counts"}
    effective_seals = {
        ev.generation_index: ev for _, ev in facts.effective(SiblingSealed) if ev.group_id == "g1"
    }
    assert {i: a["rollout_id"] for i, a in counting.items()} == {
        i: ev.rollout_id for i, ev in effective_seals.items()
    }
    started = {ev.rollout_id: ev for _, ev in facts.effective(GenerationStarted)}
    for i, a in counting.items():
        seal = effective_seals[i]
        assert (a["reward"], a["mask_sample"]) == (seal.reward, seal.mask_sample)
        assert a["worker"] == started[a["rollout_id"]].worker
        weights = {
            r.event.weight_version
            for r in facts.records
            if isinstance(r.event, GenerationStarted | TokensStaged)
            and r.event.rollout_id == a["rollout_id"]
        }
        assert a["weight_versions"] == sorted(weights)
        assert {row["fate"] for row in a["rows"]} == {"trained in step 2"}

    others = {a["rollout_id"]: a for a in view["attempts"] if a["verdict"] != "counts"}
    (failed,) = [ev for _, ev in facts.effective(AttemptFailed) if ev.group_id == "g1"]
    assert (others[failed.rollout_id]["verdict"], others[failed.rollout_id]["why"]) == (
        "failed",
        failed.error,
    )
    assert others[failed.rollout_id]["stale_rejections"] == 1
    abandoned = {
        ref.rollout_id: ev.reason
        for _, ev in facts.effective(UnsealedAbandoned)
        if ev.group_id == "g1"
        for ref in ev.attempts
    }
    for rid, reason in abandoned.items():
        assert (others[rid]["verdict"], others[rid]["why"]) == ("abandoned", reason)
    (clear_seq, clear) = next(
        (seq, ev)
        for seq, ev in facts.effective(StagingCleared)
        if any(c.rollout_id == failed.rollout_id for c in ev.of_attempts)
    )
    assert [row["fate"] for row in others[failed.rollout_id]["rows"]] == [
        f"cleared by seq {clear_seq}"
    ] * len(clear.of_attempts)

    (trained_at,) = [ev.step for _, ev in facts.effective(ReplayConsumed) if "g1" in ev.group_ids]
    assert (view["trained_step"], view["fate"]) == (trained_at, f"trained in step {trained_at}")
    assert view["restores"] == [facts.restore]
    timeline = inspect_json(run, "group", "g1")["timeline"]
    rolled = [t["seq"] for t in timeline if t["rolled_back"]]
    assert rolled and all(facts.low <= s <= facts.high for s in rolled)
    assert {t["rolled_back_by"] for t in timeline if t["rolled_back"]} == {facts.restore}


def test_inspect_group_links_the_incarnations_of_a_rolled_back_prompt(run: AuditedRun) -> None:
    g3 = inspect_json(run, "group", "g3")["group"]
    assert g3["fate"] == "rolled back"
    assert [(i["group_id"], i["rolled_back"]) for i in g3["later"]] == [("g3b", False)]
    g3b = inspect_json(run, "group", "g3b")["group"]
    assert [(i["group_id"], i["rolled_back"]) for i in g3b["earlier"]] == [("g3", True)]
    assert g3b["fate"] == "trained in step 2"

    lines = cli("inspect", "group", run.path, "g3").stdout.splitlines()
    assert lines[0] == (
        "group g3 · agent math_agent · task math · prompt g3 · granularity sibling · 2 siblings"
    )
    assert any(line.startswith("later incarnation of this prompt: group g3b") for line in lines)


def test_inspect_group_prints_header_attempts_and_a_marked_timeline(run: AuditedRun) -> None:
    facts = Facts(run)
    out = cli("inspect", "group", run.path, "g1").stdout.splitlines()
    assert out[1].startswith("trained in step 2 (target step 1) · ")
    assert out[1].endswith(f"rolled back by the restore at seq {facts.restore}")
    header = out[out.index("attempts") + 1].split()
    assert header[:5] == ["sibling", "attempt", "rollout", "id", "verdict"]
    timeline = out[out.index("timeline") + 2 :]
    marked = [line.split() for line in timeline if line.split()[3] == str(facts.restore)]
    assert marked and all(facts.low <= int(cells[0]) <= facts.high for cells in marked)


def test_inspect_rollout_shows_its_verdict_rows_and_records(run: AuditedRun) -> None:
    facts = Facts(run)
    shown = inspect_json(run, "rollout", "g1_g1")
    assert shown["group_id"] == "g1"
    attempt = shown["attempt"]
    assert (attempt["verdict"], attempt["why"], attempt["stale_rejections"]) == (
        "failed",
        "oom",
        1,
    )
    seqs = [t["seq"] for t in shown["timeline"]]
    own = [
        r.seq
        for r in facts.records
        if r.stream == "attempt/g1_g1" or getattr(r.event, "rollout_id", None) == "g1_g1"
    ]
    assert set(own) <= set(seqs)
    sealed_late = inspect_json(run, "rollout", "g1_g2")["attempt"]
    assert sealed_late["verdict"] == "abandoned"  # its seal was rolled back; the restore gave up


def test_inspect_rollout_lists_the_finalization_that_cleared_its_rows(run: AuditedRun) -> None:
    """A finalize records its clean-up in GroupFinalized itself (staging_cleared): the
    rollout whose staged rows it lists has that record in its timeline, as it had the
    StagingCleared of the two-record shape."""
    facts = Facts(run)
    listed = [
        (seq, c.rollout_id)
        for seq, ev in facts.effective(GroupFinalized)
        if ev.group_id == "g1"
        for c in ev.staging_cleared
    ]
    assert listed  # the run finalizes g1 with the one-record shape
    for seq, rollout_id in listed:
        timeline = inspect_json(run, "rollout", rollout_id)["timeline"]
        assert seq in [t["seq"] for t in timeline]


def test_inspect_step_lists_what_the_step_trained_and_its_restore(run: AuditedRun) -> None:
    facts = Facts(run)
    step2 = inspect_json(run, "step", "2")
    trained = [g for _, ev in facts.effective(ReplayConsumed) if ev.step == 2 for g in ev.group_ids]
    assert step2["groups_trained"] == trained
    assert [r["seq"] for r in step2["restores"]] == [facts.restore]
    assert step2["rolled_back_records"] == facts.high - facts.low + 1
    step1 = inspect_json(run, "step", "1")
    assert step1["groups_trained"] == ["g2"] and step1["restores"] == []
    assert sorted(step1["groups_reserved"]) == ["g1", "g2"]


def test_inspect_of_unknown_things_is_one_line_naming_it_and_the_nearest(
    run: AuditedRun,
) -> None:
    for args, expected in [
        (
            ["group", run.path, "g9"],
            "error: group 'g9': the log has no stream 'group/g9' (nearest: g1, g2, g3)",
        ),
        (
            ["rollout", run.path, "g1_g7"],
            "error: rollout 'g1_g7': group 'g1' has no such attempt (nearest: g1_g0, g1_g1, g1_g2)",
        ),
        (["step", run.path, "5"], "error: step 5: not in the log (nearest: 1, 2)"),
    ]:
        result = cli("inspect", *args)
        assert result.exit_code == 2, args
        assert result.stderr.splitlines()[0] == expected
        assert "Traceback" not in result.stderr


def test_a_rolled_back_finalization_names_the_seq_that_cleared_the_rows(harness: Harness) -> None:
    """A finalize deletes its rows after its GroupFinalized (which lists them); a restore to
    a checkpoint before it rolls the seal and the finalize back, but the rows are gone: the
    attempt's rows were cleared by that record, as with the two-record shape's StagingCleared."""
    h = harness
    h.reserve("g1", n=1, agent="math_agent", task="math", target_step=1)
    h.dispatch("g1")
    h.checkpoint(1)
    receipt = work(h, "g1", 0)  # sealed after the checkpoint
    rid = h.ledger.group("g1").siblings[0].current.rollout_id
    h.finalize("g1")
    (finalized,) = [r.seq for r in h.log.read() if isinstance(r.event, GroupFinalized)]
    h.fresh_process()
    h.run(lambda cut: h.ledger.restore(cut, h.dataset), kind="recovery_restore")
    result = cli("inspect", "rollout", str(h.path), rid, "--json")
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)["attempt"]["rows"]
    assert [row["key"] for row in rows] == list(receipt.staging_keys)
    assert {row["fate"] for row in rows} == {f"cleared by seq {finalized}"}


def test_a_record_of_the_group_that_does_not_decode_fails_closed_naming_its_seq(
    run: AuditedRun,
) -> None:
    """Skipped, it left the group view without its reservation (agent, prompt, siblings all
    unknown) at exit 0; records of unknown types or newer schemas are still passed over."""
    run.h.log.close()
    ((seq,),) = query(
        run.path, "SELECT seq FROM events WHERE stream = 'group/g1' AND type = 'GroupReserved'"
    )
    sql(run.path, ("UPDATE events SET payload = ? WHERE seq = ?", (b"\xc1junk", seq)))
    result = cli("inspect", "group", run.path, "g1")
    assert result.exit_code == 3, result.stdout
    assert f"seq {seq}" in result.stderr and "GroupReserved" in result.stderr


def test_inspect_step_counts_records_of_types_it_does_not_know(run: AuditedRun) -> None:
    """They were left out of the count: a step of them only was "0 records", exit 0."""
    run.h.log.close()
    insert_raw(run.path, "other/x", "NewerThing", 1, {"x": 1})  # opens step 3 (after 1, 2)
    view = inspect_json(run, "step", "3")
    assert (view["records"], view["unread_records"], view["last_seq"]) == (1, 1, None)
    shown = cli("inspect", "step", run.path, "3")
    assert "1 records, 1 of types this eventlog does not know (not read)" in shown.stdout
