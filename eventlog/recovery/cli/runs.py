"""`eventlog runs` with rollout recovery's columns: each run's last effective checkpoint and
its state (running, restoring, restored), read from its controller stream."""

from __future__ import annotations

from eventlog.cli.runs import make_runs
from eventlog.log import EventLog
from eventlog.recovery.cli.runlog import RunLog
from eventlog.recovery.vocabulary import RestoreCompleted, RestoreStarted


def recovery_columns(log: EventLog, head: int) -> dict[str, str]:
    """The last checkpoint that counts (not rolled back) and what the controller did last,
    as of the row's head."""
    run = RunLog(log, until_seq=head)
    if run.checkpoints:
        seq, last = run.checkpoints[-1]
        checkpoint = f"step {last.step} (seq {seq})"
    else:
        checkpoint = "-"
    restores = [r for r in run.controller if isinstance(r.event, RestoreStarted | RestoreCompleted)]
    if not run.controller:
        state = "empty" if run.head == 0 else "no controller records"
    elif restores and isinstance(restores[-1].event, RestoreStarted):
        state = f"restoring to step {restores[-1].event.checkpoint_step} (not completed)"
    elif restores and restores[-1].seq == run.controller[-1].seq:
        assert isinstance(restores[-1].event, RestoreCompleted)
        state = f"restored to step {restores[-1].event.checkpoint_step}"
    else:
        state = "running"
    return {"last_checkpoint": checkpoint, "state": state}


runs = make_runs([recovery_columns], ["last_checkpoint", "state"])
