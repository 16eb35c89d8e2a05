"""GenerationProgress is a new tag every reader accepts: the audits fold a log holding it to
the same answers as without it, and `tail` shows it (a slow attempt's sign of life)."""

from __future__ import annotations

import json
from typing import Any

from eventlog.records import ANY
from eventlog.recovery.vocabulary import GenerationProgress, attempt_stream
from tests.cli.audited_run import AuditedRun
from tests.cli.helpers import cli


def _answers(run: AuditedRun) -> tuple[Any, ...]:
    """What the folds answer; record counts aside (one more record is one more record)."""
    stats = json.loads(cli("stats", run.path, "--json").stdout)["recovery"]
    state = json.loads(cli("state", run.path, "--json").stdout)
    group = json.loads(cli("inspect", "group", run.path, "g1", "--json").stdout)["group"]
    stats.pop("records")
    group.pop("records")
    return stats, state["digest"], state["groups"], group


def test_progress_records_change_no_folds_answer_and_show_in_tail(run: AuditedRun) -> None:
    before = _answers(run)
    run.h.log.append(
        attempt_stream("g1_g2"),
        [GenerationProgress(rollout_id="g1_g2", call=0, token_count=12, weight_version=1)],
        ANY,
    )
    assert _answers(run) == before
    shown = cli("tail", run.path, "-n", "1").stdout
    assert "GenerationProgress" in shown and "token_count=12" in shown
