"""What the leak-free cleanup costs a command (issue 8): with and without, interleaved in one run.

Finalizing a group frees its siblings' staging rows, and the ledger records that: the
`StagingCleared` event (which keys, which attempt, why, which step) rides in the finalize
command's own append, and the rows are deleted right after it. A leaking ledger would do
neither. Each cell times the same one-event command append without that (keep) and with it
(clean: the StagingCleared of 2 siblings x 2 calls in the same append, then the delete from
an in-memory data plane), in the ABAB rounds, A-vs-A noise floor and verdict of
`bench/fencing.py`. The worker's put of the rows is outside the timing in both kinds; a keep
command's rows are deleted outside it too, so the plane does not grow.

The data plane is the in-memory one: a real TransferQueue's delete is a round trip to its
actors whose cost is TQ's, and which a leak-free run pays once per row whichever ledger
drives it (here it is what is *added* to the command that is measured).

`python -m bench cleanup [--quick] [--backend sqlite|postgresql]`.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from bench.common import RESULTS_DIR, Results
from bench.fencing import (
    STREAMS,
    Step,
    ab_row,
    command_event,
    ledger_commands,
    rounds_of,
    run_ab,
)
from eventlog import EventLog
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.records import NO_STREAM, AppendRequest
from eventlog.recovery.vocabulary import ClearedKey, StagingCleared

SIBLINGS = 2
CALLS = 2
STAGING = "rollout_staging"
LABELS = ("keep", "clean")


def cleanup_step(log: EventLog, plane: InMemoryDataPlane) -> Step:
    """One finalize-sized append, with the StagingCleared and the delete (clean) or without."""
    versions: dict[str, int] = {}
    tokens = torch.arange(16)

    def step(i: int, clean: bool) -> int:
        stream = f"group/c{i % STREAMS}"
        keys = [f"c{i}_g{s}/call-{c}" for s in range(SIBLINGS) for c in range(CALLS)]
        plane.put_rows(STAGING, {k: {"token_ids": tokens} for k in keys})  # the workers'
        events: list[Any] = [command_event(i)]
        if clean:
            events.append(
                StagingCleared(
                    partition=STAGING,
                    of_attempts=[ClearedKey(key=k, rollout_id=k.split("/")[0]) for k in keys],
                    never_staged=[],
                    reason=f"group 'c{i}' finalized into canonical rows",
                    step=0,
                )
            )
        known = versions.get(stream)
        request = AppendRequest(stream, events, NO_STREAM if known is None else known)
        started = time.perf_counter_ns()
        (result,) = log.append_batch([request])
        if clean:
            plane.delete_rows(STAGING, keys)
        latency = time.perf_counter_ns() - started
        if not clean:
            plane.delete_rows(STAGING, keys)  # untimed: the same plane size for both kinds
        versions[stream] = result.versions[-1]
        return latency

    return step


def cells(
    target: str, backend: str, durability: str, block: int, rounds: int
) -> list[dict[str, Any]]:
    with EventLog.open(target, durability=durability) as log:  # type: ignore[arg-type]
        got = rounds_of(cleanup_step(log, InMemoryDataPlane()), block, rounds, LABELS)
        ledger_runs = [ledger_commands(log, max(block // 2, 20), r * 100_000) for r in range(3)]
    cell = {"backend": backend, "durability": durability, "block": block, "rounds": rounds}
    cell["rows_per_command"] = SIBLINGS * CALLS
    return [ab_row("cleanup", got, ledger_runs, LABELS, LABELS, **cell)]


def run(**options: Any) -> Results:
    """Interleave clean and keep blocks on each backend; write <out_dir>/cleanup.json."""
    return run_ab(
        "cleanup",
        cells,
        title="cleanup: cost per finalize command (median µs)",
        names=LABELS,
        what="finalize command with vs without cleanup",
        **options,
    )


if __name__ == "__main__":
    run(out_dir=RESULTS_DIR)
