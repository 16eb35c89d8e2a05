"""The audit commands read a run the same way on every backend: the audited run's records,
copied in seq order into a fresh log on SQLite and on PostgreSQL, give the same answers."""

from __future__ import annotations

import json
from typing import Any

from eventlog import EventLog
from eventlog.records import ANY
from eventlog.recovery.vocabulary import CheckpointCommitted
from tests.cli.audited_run import AuditedRun
from tests.cli.helpers import cli


def answers(target: str) -> dict[str, Any]:
    def run(*args: str) -> Any:
        result = cli(*args, "--json")
        assert result.exit_code == 0, (args, result.stderr)
        lines = result.stdout.splitlines()
        return [json.loads(line) for line in lines] if args[0] == "replay" else json.loads(lines[0])

    replayed = run("replay", target, "--group", "g1")
    counted = run("stats", target)
    stats = counted["recovery"]
    for row in [*stats["by_agent_task"], stats["total"]]:
        del row["generation_latency"]  # from recorded_at: the copy was written later
    diff = run("diff", target, "checkpoint:1", "head")
    del diff["target"]
    return {
        "replay": [(o["seq"], o.get("rolled_back_by")) for o in replayed],
        "group": run("inspect", "group", target, "g1")["group"],
        "stats": stats,
        "counts": [  # counted by the database: the same figures in the same order
            list(counted["types"].items()),
            list(counted["stream_prefixes"].items()),
            counted["records"],
        ],
        "state": run("state", target, "--checkpoint", "1")["digest"],
        "diff": diff,
    }


def test_audit_answers_are_the_same_on_every_backend(run: AuditedRun, log_target: str) -> None:
    records = list(run.h.log.read())
    with EventLog.open(log_target) as copy:
        for rec in records:
            result = copy.append(rec.stream, [rec.event], ANY)
            assert result.seqs == [rec.seq]
    here, there = answers(run.path), answers(log_target)
    assert there == here
    (checkpoint,) = [
        r.event for r in records if isinstance(r.event, CheckpointCommitted) and r.event.step == 1
    ]
    assert there["state"] == checkpoint.ledger_digest
