"""A controller process for the outbox kill tests (tests/test_outbox.py), run as
`python -m tests.outbox_child DB RECEIVER run|restart`.

`run` seals two results, checkpoints, then records and delivers their acknowledgements,
printing a marker and waiting for a line on stdin at each point the test may SIGKILL it:
`sealed` (sealed, nothing pending yet), `sent` (after each send, before its delivery record),
`delivered`. `restart` is the next controller: restore to the checkpoint, record what the
crash left out, deliver what is not recorded as delivered.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from eventlog import EventLog
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.recovery.ledger import RecoveryLedger
from eventlog.recovery.outbox import Outbox
from eventlog.recovery.vocabulary import AcknowledgementPending
from tests.fixtures.ledger import Harness, ListDataset, make_prompt


def pause(marker: str) -> None:
    print(marker, flush=True)
    sys.stdin.readline()


class FileReceiver:
    """The agent environment: applies each key once, and keeps every send it was made (one
    JSON line each, fsynced) so the test can count sends and applications."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def acknowledge(self, key: str, ack: AcknowledgementPending) -> None:
        seen = self.path.exists() and any(
            json.loads(line)["key"] == key for line in self.path.read_text().splitlines()
        )
        with self.path.open("a") as out:
            out.write(json.dumps({"key": key, "rollout_id": ack.rollout_id, "applied": not seen}))
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())


class PausingReceiver(FileReceiver):
    def acknowledge(self, key: str, ack: AcknowledgementPending) -> None:
        super().acknowledge(key, ack)
        pause("sent")


def run(db: Path, receiver: Path) -> None:
    log = EventLog.open(db)
    plane = InMemoryDataPlane()
    h = Harness(path=db, log=log, data_plane=plane, ledger=RecoveryLedger.open(log, plane))
    h.reserve("g1", n=2)
    h.dispatch("g1")
    h.seal("g1", 0)
    h.seal("g1", 1)
    h.checkpoint(1)
    pause("sealed")
    outbox = Outbox(log, PausingReceiver(receiver))
    outbox.record_seals()
    outbox.deliver()
    pause("delivered")
    log.close()


def restart(db: Path, receiver: Path) -> None:
    log = EventLog.open(db)
    plane = InMemoryDataPlane()
    h = Harness(path=db, log=log, data_plane=plane, ledger=RecoveryLedger(log, plane))
    dataset = ListDataset({"g1": make_prompt("g1")})
    h.run(lambda cut: h.ledger.restore(cut, dataset), kind="recovery_restore")
    outbox = Outbox(log, FileReceiver(receiver))
    outbox.record_seals()
    print(json.dumps(outbox.deliver()), flush=True)
    log.close()


if __name__ == "__main__":
    db_path, receiver_path, phase = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    (run if phase == "run" else restart)(db_path, receiver_path)
