"""What the leak-free cleanup costs a command (issue 8): with and without, interleaved in one run.

Finalizing a group frees its siblings' staging rows, and the ledger records that: the
finalize's one record, GroupFinalized, lists them (which keys, staged by which attempt; why
is the finalization, the step its target step), and the rows are deleted right after it is
appended. Before issue 8 the controller deleted the same rows after finalizing, recording
nothing. Each cell times the same finalize append three ways, in the ABAB rounds, A-vs-A noise
floor and verdict of `bench/fencing.py`:

- clean: GroupFinalized listing the rows of 2 siblings x 2 calls, then their delete from an
  in-memory data plane (what `RecoveryLedger.finalize` does);
- untracked: GroupFinalized alone, then the same delete (the controller before issue 8): the
  verdict, clean against untracked, is what recording the cleanup adds to a command;
- keep: GroupFinalized alone and no delete in the timing (a ledger that leaks the rows): clean
  against keep is reported beside it, the whole cost of not leaking, the delete included.

The workers' put of the rows is outside the timing; a keep command's rows are deleted outside
it, so the plane does not grow. (Before 6a1e833 the clean-up was a second record,
StagingCleared, in the same append: bench/README.md "Cleanup" has that figure.)

The data plane is the in-memory one: a real TransferQueue's delete is a round trip to its
actors whose cost is TQ's, and which a leak-free run pays once per row whichever ledger
drives it (here it is what is *added* to the command that is measured).

Beside the verdict (per finalize command, against the fencing bench's ledger command), the
difference is put against two real figures timed on the same log: a real finalize command
(`RecoveryLedger.finalize`, its listed keys and delete included) and all the ledger commands
of one group's life (reserve, dispatch, a seal per sibling, start_finalization, finalize),
since the cleanup is paid once per group, not on every command.

`python -m bench cleanup [--quick] [--backend sqlite|postgresql]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from bench.common import RESULTS_DIR, Results, column_table
from bench.fencing import (
    STREAMS,
    Step,
    ab_row,
    ledger_commands,
    rounds_of,
    run_ab,
)
from bench.soak_ledger import stage_rows
from eventlog import EventLog
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.events import Event, event_type
from eventlog.records import NO_STREAM, AppendRequest
from eventlog.recovery.barrier import MutationBarrier
from eventlog.recovery.ledger import RecoveryLedger
from eventlog.recovery.vocabulary import (
    ClearedKey,
    GroupFinalized,
    PromptRef,
)

SIBLINGS = 2
CALLS = 2
STAGING = "rollout_staging"
LABELS = ("untracked", "clean")
"""The verdict's two kinds (without, with); "keep" is timed beside them (`KEEP_LABELS`)."""
KEEP_LABELS = ("keep", "clean")


@event_type
class BenchFinalized(GroupFinalized, frozen=True, kw_only=True):
    """GroupFinalized's fields and encoding under another type name: the ledger timed beside
    on the same log folds by exact type, so it skips these (a GroupFinalized of a group it
    never reserved would break its rules)."""


def finalized(i: int, keys: list[str]) -> list[Event]:
    """The finalize command's events for group `c{i}`: GroupFinalized, listing the staging
    rows it frees when `keys` are given (what RecoveryLedger.finalize appends), bare when
    not (what a leaking ledger would append)."""
    return [
        BenchFinalized(
            group_id=f"c{i}",
            owner="bench",
            prompt_id=f"p{i}",
            target_step=0,
            canonical_row_ids=[f"c{i}_g{s}" for s in range(SIBLINGS)],
            min_weight_version=0,
            weight_versions=[[0] for _ in range(SIBLINGS)],
            staging_partition=STAGING if keys else None,
            staging_cleared=[ClearedKey(key=k, rollout_id=k.split("/")[0]) for k in keys],
        )
    ]


def cleanup_step(
    log: EventLog, plane: InMemoryDataPlane, *, delete_timed: bool = True, streams: str = "c"
) -> Step:
    """One finalize append, listing the staging rows (clean) or not; the rows are deleted
    after it, inside the timing unless a bare command's delete is untimed (`delete_timed`
    False: the keep kind, a ledger that leaks them). Appends go to `group/<streams><n>`."""
    versions: dict[str, int] = {}
    tokens = torch.arange(16)

    def step(i: int, clean: bool) -> int:
        stream = f"group/{streams}{i % STREAMS}"
        keys = [f"c{i}_g{s}/call-{c}" for s in range(SIBLINGS) for c in range(CALLS)]
        plane.put_rows(STAGING, {k: {"token_ids": tokens} for k in keys})  # the workers'
        events = finalized(i, keys if clean else [])
        known = versions.get(stream)
        request = AppendRequest(stream, events, NO_STREAM if known is None else known)
        timed = clean or delete_timed
        started = time.perf_counter_ns()
        (result,) = log.append_batch([request])
        if timed:
            plane.delete_rows(STAGING, keys)
        latency = time.perf_counter_ns() - started
        if not timed:
            plane.delete_rows(STAGING, keys)  # untimed: the same plane size for both kinds
        versions[stream] = result.versions[-1]
        return latency

    return step


LIFECYCLE = ("reserve", "dispatch", *(["seal"] * SIBLINGS), "start_finalization", "finalize")
"""The ledger commands of one group's life, in the shape the clean kind clears (SIBLINGS
siblings, CALLS staged calls each)."""


def lifecycle_commands(log: EventLog, groups: int, offset: int) -> dict[str, float]:
    """Whole group lifecycles on a real `RecoveryLedger` (its fold, fence and append, the
    finalize's StagingCleared and delete included): seconds per command, of a finalize
    command, and of all of one group's commands. Only the ledger calls are timed; the
    workers' staging (rows put, TokensStaged appended) and the finalizer's canonical rows
    are outside, as is the barrier."""
    plane = InMemoryDataPlane()
    ledger = RecoveryLedger.open(log, plane, staging_partition=STAGING)
    barrier = MutationBarrier()
    tokens = torch.arange(16)
    spent = {"all": 0.0, "finalize": 0.0}

    @contextlib.contextmanager
    def timed(kind: str) -> Iterator[None]:
        started = time.perf_counter_ns()
        yield
        took = (time.perf_counter_ns() - started) / 1e9
        spent["all"] += took
        if kind == "finalize":
            spent["finalize"] += took

    async def go() -> None:
        for g in range(offset, offset + groups):
            gid = f"life{g}"
            async with barrier.mutation("bench") as cut:
                with timed("reserve"):
                    ledger.reserve(
                        cut,
                        group_id=gid,
                        prompt={"prompt_id": f"p{g}", "task_name": "math"},
                        prompt_ref=PromptRef(sample_id=str(g), task_name="math"),
                        expected_generations=SIBLINGS,
                        start_weight_version=0,
                        admitted=True,
                        target_step=0,
                        granularity="sibling",
                    )
                with timed("dispatch"):
                    ledger.dispatch(cut, gid)
                for index in range(SIBLINGS):
                    rid = ledger.group(gid).siblings[index].current.rollout_id
                    receipt = stage_rows(ledger, log, rid, CALLS, tokens=16)  # the worker's
                    with timed("seal"):
                        ledger.seal_sibling(
                            cut,
                            gid,
                            index,
                            rollout_id=rid,
                            receipt=receipt,
                            reward=1.0,
                            mask_sample=False,
                        )
                with timed("start_finalization"):
                    ledger.start_finalization(cut, gid, owner="bench")
                rows = ledger.group(gid).canonical_row_ids()
                plane.put_rows(ledger.training_partition, {r: {"token_ids": tokens} for r in rows})
                with timed("finalize"):
                    ledger.finalize(cut, gid, owner="bench", min_weight_version=0)
                plane.delete_rows(ledger.training_partition, rows)  # the plane does not grow

    asyncio.run(go())
    return {
        "command": spent["all"] / (groups * len(LIFECYCLE)),
        "finalize": spent["finalize"] / groups,
        "group": spent["all"] / groups,
    }


def lifecycle_figures(delta_us: float, runs: list[dict[str, float]]) -> dict[str, Any]:
    """The cleanup's difference against a real finalize command and spread over the group's
    whole life (medians over the runs); information beside the verdict, which stays per
    finalize command against the fencing bench's ledger command."""
    finalize_us = statistics.median(r["finalize"] for r in runs) * 1e6
    group_us = statistics.median(r["group"] for r in runs) * 1e6
    return {
        "lifecycle_commands": list(LIFECYCLE),
        "lifecycle_us_per_command": round(statistics.median(r["command"] for r in runs) * 1e6, 1),
        "finalize_us_per_command": round(finalize_us, 1),
        "lifecycle_us_per_group": round(group_us, 1),
        "delta_share_of_finalize_command": round(delta_us / finalize_us, 4),
        "delta_share_of_lifecycle": round(delta_us / group_us, 4),
    }


KEEP_FIGURES = (
    "delta_us",
    "delta_each_us",
    "noise_floor_us",
    "delta_share_of_ledger_command",
)
"""What the clean kind costs against a leaking ledger (keep), reported beside the verdict."""


def cells(
    target: str, backend: str, durability: str, block: int, rounds: int
) -> list[dict[str, Any]]:
    with EventLog.open(target, durability=durability) as log:  # type: ignore[arg-type]
        plane = InMemoryDataPlane()
        got = rounds_of(cleanup_step(log, plane), block, rounds, LABELS)
        kept = rounds_of(
            cleanup_step(log, plane, delete_timed=False, streams="k"), block, rounds, KEEP_LABELS
        )
        ledger_runs = [ledger_commands(log, max(block // 2, 20), r * 100_000) for r in range(3)]
        life = [lifecycle_commands(log, max(block // 8, 5), r * 100_000) for r in range(3)]
    cell = {"backend": backend, "durability": durability, "block": block, "rounds": rounds}
    cell["rows_per_command"] = SIBLINGS * CALLS
    row = ab_row("cleanup", got, ledger_runs, LABELS, LABELS, **cell)
    keep = ab_row("cleanup", kept, ledger_runs, KEEP_LABELS, KEEP_LABELS, **cell)
    beside = {"keep_us_per_command": keep["keep_us_per_command"]}
    beside.update((f"keep_{name}", keep[name]) for name in KEEP_FIGURES)
    return [row | beside | lifecycle_figures(row["delta_us"], life)]


def lifecycle_table(rows: list[dict[str, Any]]) -> Table:
    """The difference beside a real finalize command and a group's whole ledger life."""
    out = column_table(
        f"cleanup against a group's life ({' '.join(LIFECYCLE)}) and a leaking ledger (keep);"
        " median µs",
        (
            "backend",
            "durability",
            "Δ µs",
            "finalize command µs",
            "Δ share of finalize",
            "group's commands µs",
            "Δ share of the group's commands",
            "Δ vs keep µs (noise)",
            "Δ vs keep share of command",
        ),
        left={"backend"},
    )
    for r in rows:
        out.add_row(
            r["backend"],
            r["durability"],
            f"{r['delta_us']:+.1f}",
            f"{r['finalize_us_per_command']:,.1f}",
            f"{r['delta_share_of_finalize_command']:+.2%}",
            f"{r['lifecycle_us_per_group']:,.1f}",
            f"{r['delta_share_of_lifecycle']:+.2%}",
            f"{r['keep_delta_us']:+.1f} ({r['keep_noise_floor_us']:.1f})",
            f"{r['keep_delta_share_of_ledger_command']:+.2%}",
        )
    return out


def run(**options: Any) -> Results:
    """Interleave clean blocks with untracked ones, then with keep ones, on each backend;
    write <out_dir>/cleanup.json."""
    results = run_ab(
        "cleanup",
        cells,
        title="cleanup: cost per finalize command (median µs)",
        names=LABELS,
        what="finalize command recording its cleanup vs deleting untracked",
        **options,
    )
    (options.get("console") or Console()).print(lifecycle_table(results.rows))
    return results


if __name__ == "__main__":
    run(out_dir=RESULTS_DIR)
