"""Exactly-once acknowledgement: every sealed result is acknowledged to the agent environment
once, across a controller SIGKILLed between the seal, the send and the delivery record, and
across restores (a real child process, a real SQLite log)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from eventlog import EventLog
from eventlog.recovery.outbox import Outbox
from eventlog.recovery.vocabulary import (
    OUTBOX_STREAM,
    AcknowledgementDelivered,
    AcknowledgementPending,
)
from tests.fixtures.ledger import Harness

REPO = Path(__file__).resolve().parents[1]


def _child(db: Path, receiver: Path, phase: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.outbox_child", str(db), str(receiver), phase],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def _received(receiver: Path) -> list[dict[str, object]]:
    if not receiver.exists():
        return []
    return [json.loads(line) for line in receiver.read_text().splitlines()]


@pytest.mark.parametrize(
    ("kill_at", "sends"),
    [
        ("sealed", {"g1_g0": 1, "g1_g1": 1}),  # nothing pending yet: the restart records it
        ("sent", {"g1_g0": 2, "g1_g1": 1}),  # sent, not recorded: re-sent once, applied once
        ("delivered", {"g1_g0": 1, "g1_g1": 1}),  # recorded: never sent again
    ],
)
def test_each_result_is_acknowledged_once_when_the_controller_is_killed(
    tmp_path: Path, kill_at: str, sends: dict[str, int]
) -> None:
    db, receiver = tmp_path / "run.db", tmp_path / "receiver.jsonl"
    proc = _child(db, receiver, "run")
    assert proc.stdin is not None and proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == kill_at:
            proc.send_signal(signal.SIGKILL)
            break
        proc.stdin.write("\n")
        proc.stdin.flush()
    assert proc.wait(timeout=60) == -signal.SIGKILL
    restarted = _child(db, receiver, "restart")
    out, _ = restarted.communicate(timeout=120)
    assert restarted.returncode == 0, out
    got = _received(receiver)
    assert Counter(str(r["rollout_id"]) for r in got) == sends
    applied = [str(r["rollout_id"]) for r in got if r["applied"]]
    assert sorted(applied) == ["g1_g0", "g1_g1"]  # each result applied exactly once
    with EventLog.open(db) as log:
        outbox = [r.event for r in log.read_stream(OUTBOX_STREAM)]
    delivered = [e.key for e in outbox if isinstance(e, AcknowledgementDelivered)]
    pending = [e.key for e in outbox if isinstance(e, AcknowledgementPending)]
    assert len(pending) == len(set(pending)) == 2 and sorted(delivered) == sorted(pending)
    assert {str(r["key"]) for r in got} == set(pending)  # the receiver was told the key


class Refusing:
    """A receiver that accepts some rollout ids and fails for the others."""

    def __init__(self, refuse: set[str]) -> None:
        self.refuse = refuse
        self.accepted: list[str] = []

    def acknowledge(self, key: str, ack: AcknowledgementPending) -> None:
        if ack.rollout_id in self.refuse:
            raise ConnectionError(f"environment unreachable for {key}")
        self.accepted.append(ack.rollout_id)


def test_a_restore_never_resends_a_delivery_nor_sends_a_rolled_back_seal(
    harness: Harness,
) -> None:
    h = harness
    h.reserve("g1", n=1)
    h.dispatch("g1")
    h.seal("g1", 0)
    h.checkpoint(1)
    h.reserve("g2", n=1)
    h.dispatch("g2")
    h.seal("g2", 0)  # after the checkpoint: the restore rolls it back
    receiver = Refusing({"g2_g0"})
    outbox = Outbox(h.log, receiver)
    assert [p.rollout_id for p in outbox.record_seals()] == ["g1_g0", "g2_g0"]
    assert outbox.record_seals() == []  # recorded once
    with pytest.raises(ConnectionError):
        outbox.deliver()  # g1_g0 delivered (recorded after the checkpoint), g2_g0 not
    assert [p.rollout_id for p in outbox.pending()] == ["g2_g0"]
    h.fresh_process()
    h.run(lambda cut: h.ledger.restore(cut, h.dataset), kind="recovery_restore")
    after = Outbox(h.log, receiver)
    assert after.record_seals() == [] and after.pending() == [] and after.deliver() == []
    assert receiver.accepted == ["g1_g0"]
