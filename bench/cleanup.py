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

import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from bench.common import RESULTS_DIR, Results, machine, print_targets, scratch
from bench.fencing import (
    STREAMS,
    Step,
    cell_target,
    command_event,
    contrasts,
    ledger_commands,
    rounds_of,
)
from bench.pg import PgUnavailable, pg_server
from eventlog import EventLog
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.records import NO_STREAM, AppendRequest
from eventlog.recovery.vocabulary import ClearedKey, StagingCleared

BLOCK = 400
QUICK_BLOCK = 100
ROUNDS = 8
QUICK_ROUNDS = 2
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
    us = [{k: v * 1e6 for k, v in r.items()} for r in got]
    deltas, aa = contrasts(us, LABELS)
    delta_us = round(statistics.median(deltas), 1)
    noise_us = round(statistics.median(abs(a) for a in aa), 1)
    ledger_us = statistics.median(s / n for n, s in ledger_runs) * 1e6
    keep, clean = LABELS
    return [
        {
            "benchmark": "cleanup",
            "backend": backend,
            "durability": durability,
            "block": block,
            "rounds": rounds,
            "rows_per_command": SIBLINGS * CALLS,
            "clean_us_per_command": round(
                statistics.median(x for r in us for x in (r[clean], r[clean + "2"])), 1
            ),
            "keep_us_per_command": round(
                statistics.median(x for r in us for x in (r[keep], r[keep + "2"])), 1
            ),
            "blocks_us": [{k: round(v, 1) for k, v in r.items()} for r in us],
            "delta_us": delta_us,
            "delta_each_us": [round(d, 1) for d in deltas],
            "aa_each_us": [round(a, 1) for a in aa],
            "noise_floor_us": noise_us,
            "ledger_us_per_command": round(ledger_us, 1),
            "delta_share_of_ledger_command": round(delta_us / ledger_us, 4),
            "command_ratio": round(1 + delta_us / ledger_us, 4),
            "command_ratio_each": [round(1 + d / ledger_us, 4) for d in deltas],
        }
    ]


def table(rows: Sequence[dict[str, Any]]) -> Table:
    out = Table(title="cleanup: cost per finalize command (median µs)", title_justify="left")
    for name in (
        "backend",
        "durability",
        "clean µs",
        "keep µs",
        "Δ µs (per round)",
        "A-vs-A noise µs",
        "ledger command µs",
        "Δ share of command",
    ):
        out.add_column(name, justify="left" if name == "backend" else "right")
    for r in rows:
        out.add_row(
            r["backend"],
            r["durability"],
            f"{r['clean_us_per_command']:,.1f}",
            f"{r['keep_us_per_command']:,.1f}",
            f"{r['delta_us']:+.1f} ({min(r['delta_each_us']):+.1f}…{max(r['delta_each_us']):+.1f})",
            f"{r['noise_floor_us']:.1f}",
            f"{r['ledger_us_per_command']:,.1f}",
            f"{r['delta_share_of_ledger_command']:+.2%}",
        )
    return out


def run(
    *,
    quick: bool = False,
    repeats: int | None = None,
    scale: float | None = None,
    backends: Sequence[str] = ("sqlite", "postgresql"),
    out_dir: Path | None = None,
    workdir: Path | None = None,
    console: Console | None = None,
    **_: Any,
) -> Results:
    """Interleave clean and keep blocks on each backend; write <out_dir>/cleanup.json.

    `repeats` is the number of rounds; `scale` scales the block size."""
    console = console or Console()
    rounds = repeats if repeats is not None else (QUICK_ROUNDS if quick else ROUNDS)
    block = max(int((QUICK_BLOCK if quick else BLOCK) * (scale or 1.0)), 10)
    with scratch(workdir, "eventlog-bench-cleanup-") as work:
        results = Results("cleanup", machine(work, {"rounds": rounds, "block": block}))
        rows: list[dict[str, Any]] = []
        if "sqlite" in backends:
            for durability in ("full", "normal"):
                target = str(work / f"cleanup-{durability}.db")
                rows += cells(target, "sqlite", durability, block, rounds)
        if "postgresql" in backends:
            try:
                with pg_server() as server:
                    rows += cells(server.url(), "postgresql", "full", block, rounds)
            except PgUnavailable as exc:
                console.print(f"[yellow]PostgreSQL skipped: {exc}[/]")
    results.rows = rows
    results.targets = [cell_target(r, "finalize command with vs without cleanup") for r in rows]
    console.print(table(rows))
    print_targets(console, results.targets, ".4f")
    if out_dir is not None:
        for path in results.write(out_dir):
            console.print(f"wrote {path}")
    return results


if __name__ == "__main__":
    run(out_dir=RESULTS_DIR)
