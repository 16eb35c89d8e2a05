"""Every audit command answers as of one head: the head it read first. A writer may append
while it runs (a training run is audited live); what it appends after that read must change
nothing of the answer, neither records past the head nor the controller stream's rolled-back
ranges, restores and step ends read later.

The oracle: the same command on a copy of the log taken before the writer's appends."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlog.log import EventLog
from tests.cli.audited_run import build, train, work
from tests.cli.helpers import cli
from tests.fixtures.ledger import Harness, open_harness


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Harness]:
    """The audited run with step 3 in progress (group r0 reserved and dispatched)."""
    h = open_harness(tmp_path / "run.db")
    build(h)
    h.reserve("r0", n=2, agent="math_agent", task="math", target_step=3, weight=1)
    h.dispatch("r0")
    yield h
    h.log.close()


def _appends_meanwhile(h: Harness) -> None:
    """What the run does while the audit reads: a crash and a restore to checkpoint 2 roll r0
    back (records the audit's head holds); r0's prompt is reserved again as r0b, trained in
    step 3, checkpointed; step 4 reserves r1."""
    work(h, "r0", 0, weight=1)
    h.fresh_process()
    h.run(lambda cut: h.ledger.restore(cut, h.dataset), kind="recovery_restore")
    h.reserve("r0b", n=2, agent="math_agent", task="math", target_step=3, weight=1, sample_id="r0")
    h.dispatch("r0b")
    for index in (0, 1):
        work(h, "r0b", index, weight=1)
    train(h, "r0b", 3)
    h.checkpoint(3)
    h.reserve("r1", n=2, agent="math_agent", task="math", target_step=4, weight=1)
    # g3, rolled back by the audited run's restore, gets another incarnation
    h.reserve("g3c", n=2, agent="math_agent", task="math", target_step=4, weight=1, sample_id="g3")


def _copy(h: Harness, to: Path) -> str:
    with sqlite3.connect(h.path) as source, sqlite3.connect(to) as copy:
        source.backup(copy)
    return str(to)


COMMANDS = {
    "stats": ["stats", "{log}", "--json"],
    "tail": ["tail", "-n", "4", "--json", "{log}"],
    "replay --step": ["replay", "{log}", "--step", "3", "--json"],
    "replay --group": ["replay", "{log}", "--group", "r0", "--json"],
    "replay --checkpoint": ["replay", "{log}", "--checkpoint", "3", "--json"],
    "replay": ["replay", "{log}", "--json"],
    "inspect step": ["inspect", "step", "{log}", "3", "--json"],
    "inspect group": ["inspect", "group", "{log}", "r0", "--json"],
    "inspect group, its incarnations": ["inspect", "group", "{log}", "g3", "--json"],
    "inspect rollout": ["inspect", "rollout", "{log}", "r0_g0", "--json"],
    "state": ["state", "{log}", "--json"],
    "runs": ["runs", "{log}", "--json"],
    "diff": ["diff", "{log}", "checkpoint:2", "head", "--json"],
    "export": ["export", "{log}", "--format", "jsonl", "-o", "{out}"],
    "report": ["report", "{log}", "-o", "{out}/run.html"],
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_an_audit_reads_the_log_as_of_its_first_head(
    live: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    argv = COMMANDS[name]
    before = _copy(live, tmp_path / "before.db")
    expected_out, out = tmp_path / "expected", tmp_path / "out"
    expected_out.mkdir()
    out.mkdir()
    expected = cli(*[a.format(log=before, out=expected_out) for a in argv])
    assert expected.exit_code == (2 if name == "replay --checkpoint" else 0), expected.stderr

    head = EventLog.head
    calls: list[int] = []

    def head_then_the_run_goes_on(log: EventLog) -> int:
        found = head(log)
        if log is not live.log and not calls:  # the audit's log, its first head
            calls.append(found)
            _appends_meanwhile(live)
        return found

    monkeypatch.setattr(EventLog, "head", head_then_the_run_goes_on)
    raced = cli(*[a.format(log=live.path, out=out) for a in argv])
    monkeypatch.undo()
    assert raced.exit_code == expected.exit_code, raced.stderr
    assert calls and live.log.head() > calls[0]  # the run did go on meanwhile
    for said, oracle in ((raced.stdout, expected.stdout), (raced.stderr, expected.stderr)):
        shown = said.replace(str(live.path), before).replace(str(out), str(expected_out))
        assert shown == oracle
    for table in sorted(expected_out.iterdir()):
        written = (out / table.name).read_text().replace(str(live.path), before)
        assert written == table.read_text(), table.name
    if name == "stats":  # the audited run's own restore, not the one appended meanwhile
        assert json.loads(raced.stdout)["recovery"]["restores"] == 1
