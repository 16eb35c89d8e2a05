"""Smoke run of bench/scale.py at toy sizes on the session's Ray + TransferQueue.

Pins that the benchmark runs end to end (two controllers, a restore between them, actors in
their own processes) and that its read-back check finds nothing lost or duplicated, on
SQLite (forwarded) and PostgreSQL (direct). Figures are never asserted here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import scale

pytestmark = [pytest.mark.slow, pytest.mark.tq]

# Three steps: the run is stopped once checkpoint 1 is committed and a sibling sealed after
# it; with two, the lookahead step could seal all its siblings before checkpoint 1 landed
# (seen since training no longer blocks the loop), the first controller finished the run, and
# the second had nothing to redo.
TOY = scale.Shape(
    groups=6, siblings=2, steps=3, actors=2, slots=4, max_tokens=4, tokens_per_s=400.0
)


def test_quick_scale_bench_writes_results_with_nothing_lost_or_duplicated(
    tq_runtime: object, tmp_path: Path
) -> None:
    scale.run(
        quick=True,
        out_dir=tmp_path / "out",
        workdir=tmp_path / "work",
        configs=[("sqlite", "forwarded")],
        shape=TOY,
    )

    (row,) = json.loads((tmp_path / "out" / "scale.json").read_text())
    assert (row["backend"], row["route"]) == ("sqlite", "forwarded")
    assert row["lost_or_duplicated"] == 0, row["problems"]
    assert row["groups_finalized"] == TOY.groups
    assert row["live_seals"] == TOY.groups * TOY.siblings
    assert row["restore_plan"] is not None  # the second controller restored
    assert row["phase2_attempt_records"] == row["phase2_actor_events"] > 0
    header = json.loads((tmp_path / "out" / "scale.machine.json").read_text())
    assert [t["status"] for t in header["targets"] if "lost" in t["target"]] == ["PASS"]


@pytest.mark.postgres
def test_direct_actors_on_postgresql_lose_and_duplicate_nothing(
    tq_runtime: object, fresh_postgres_url: str, tmp_path: Path
) -> None:
    row = scale.run_config("postgresql", "direct", fresh_postgres_url, TOY, tmp_path)

    assert row["lost_or_duplicated"] == 0, row["problems"]
    assert row["live_seals"] == TOY.groups * TOY.siblings
    assert row["commits"] > 0 and row["events_per_commit"] is not None
