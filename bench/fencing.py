"""What fencing costs a ledger command (issue 8): fenced and unfenced, interleaved in one run.

Fencing changes one thing on a command's path: its atomic `append_batch` carries one more
request, with no events, asserting the `controller/epoch` stream's version. Each cell appends
the same commands (one ledger event on one of 64 group streams, the stream's expected version
given) in blocks of one kind, with that request (F) or without it (U), on one log, in rounds
of four blocks in ABAB order: U F U F, the next round F U F U (the opening alternates, so a
steady drift of the machine cancels over two rounds). A block's figure is its median latency.

Per round the difference is (F + F' - U - U') / 2, and the same round gives its A-vs-A
contrast (U' - U + F - F') / 2: each kind against itself, with the same number of blocks and
signs, so it has the difference's own noise and no effect in it. The noise floor is the
median |A-vs-A| over the rounds. PASS when the fenced - unfenced difference (median over the
rounds) is within the noise floor, or below 1 % of a real `RecoveryLedger` command (reserve,
dispatch, fail; fold and fence included), timed beside it to put the difference in
proportion; the verdict says which.

`python -m bench fencing [--quick] [--backend sqlite|postgresql]`.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.common import (
    RESULTS_DIR,
    Results,
    column_table,
    machine,
    print_targets,
    scratch,
    verdict,
)
from bench.pg import PgUnavailable, pg_server
from eventlog import EventLog
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.records import NO_STREAM, AppendRequest
from eventlog.recovery.barrier import MutationBarrier
from eventlog.recovery.ledger import RecoveryLedger
from eventlog.recovery.vocabulary import EPOCH_STREAM, ControllerEpochStarted, PromptRef
from eventlog.recovery.vocabulary import StaleResultRejected as Command

BLOCK = 400
"""Commands per block (one kind)."""
QUICK_BLOCK = 100
ROUNDS = 8
"""Rounds of four blocks (U F U F or F U F U) per cell."""
QUICK_ROUNDS = 2
STREAMS = 64
THRESHOLD = 0.01
"""A difference above the noise floor still passes below 1 % of a ledger command: too small to
matter beside the command, though measurable."""


def command_event(i: int) -> Command:
    return Command(
        group_id=f"b{i % STREAMS}",
        generation_index=0,
        rollout_id=f"b{i % STREAMS}_g0",
        current_rollout_id=f"b{i % STREAMS}_g0-a1",
        reason="bench",
    )


Step = Callable[[int, bool], int]
"""One command: its number, and whether it carries what is measured (B) or not (A); returns
its latency in ns. Numbering the commands lets every block cycle through the same streams."""


def _block(step: Step, commands: int, b: bool, at: int) -> float:
    """Median latency (s) of `commands` commands, all of one kind."""
    return statistics.median(step(i, b) for i in range(at, at + commands)) / 1e9


def rounds_of(
    step: Step, block: int, rounds: int, labels: tuple[str, str] = ("U", "F")
) -> list[dict[str, float]]:
    """Each round's four block medians (s), keyed A, B, A2, B2 by `labels` (without, with),
    in ABAB order, the opening kind alternating per round."""
    a, b = labels
    at = 0
    for kind in (True, False):  # warm up both paths
        _block(step, min(block, 200), kind, at)
        at += min(block, 200)
    out: list[dict[str, float]] = []
    for r in range(rounds):
        first, second = (a, b) if r % 2 == 0 else (b, a)
        got: dict[str, float] = {}
        for name in (first, second, first + "2", second + "2"):
            got[name] = _block(step, block, name.startswith(b), at)
            at += block
        out.append(got)
    return out


def _fencing_step(log: EventLog) -> Step:
    """One one-event append, with the epoch assertion (fenced) or without it."""
    fence = [AppendRequest(EPOCH_STREAM, [], 0)]
    versions: dict[str, int] = {}

    def step(i: int, fenced: bool) -> int:
        stream = f"group/b{i % STREAMS}"
        known = versions.get(stream)
        request = AppendRequest(stream, [command_event(i)], NO_STREAM if known is None else known)
        started = time.perf_counter_ns()
        (*_, result) = log.append_batch([*fence, request] if fenced else [request])
        latency = time.perf_counter_ns() - started
        versions[stream] = result.versions[-1]
        return latency

    return step


def ledger_commands(log: EventLog, groups: int, offset: int) -> tuple[int, float]:
    """The real thing: reserve, dispatch and fail each group's sibling (fold, fence, append)."""
    ledger = RecoveryLedger.open(log, InMemoryDataPlane())
    barrier = MutationBarrier()

    async def go() -> int:
        n = 0
        for g in range(offset, offset + groups):
            gid = f"L{g}"
            prompt = {"prompt_id": f"p{g}", "task_name": "math"}
            async with barrier.mutation("bench") as cut:
                ledger.reserve(
                    cut,
                    group_id=gid,
                    prompt=prompt,
                    prompt_ref=PromptRef(sample_id=str(g), task_name="math"),
                    expected_generations=1,
                    start_weight_version=0,
                    admitted=True,
                    target_step=0,
                    granularity="sibling",
                )
                ledger.dispatch(cut, gid)
                ledger.fail_attempt(cut, gid, 0, rollout_id=f"{gid}_g0", error="bench")
            n += 3
        return n

    started = time.perf_counter()
    n = asyncio.run(go())
    return n, time.perf_counter() - started


def contrasts(
    rounds: Sequence[dict[str, float]], labels: tuple[str, str] = ("U", "F")
) -> tuple[list[float], list[float]]:
    """Per round: the fenced - unfenced difference (F + F' - U - U') / 2 and the A-vs-A
    contrast (U' - U + F - F') / 2, from its four block figures. A steady drift adds +-drift
    to the difference (the sign follows the round's opening, so it cancels over two rounds)
    and nothing to the A-vs-A contrast."""
    a, b = labels
    deltas = [(r[b] + r[b + "2"] - r[a] - r[a + "2"]) / 2 for r in rounds]
    aa = [(r[a + "2"] - r[a] + r[b] - r[b + "2"]) / 2 for r in rounds]
    return deltas, aa


def cell_target(
    r: dict[str, Any], what: str = "ledger command fenced vs unfenced"
) -> dict[str, Any]:
    """The cell's verdict: PASS when the difference is within the A-vs-A noise floor or below
    THRESHOLD of a ledger command, on the command-ratio scale (fenced / unfenced command)."""
    allowance = max(r["noise_floor_us"], THRESHOLD * r["ledger_us_per_command"])
    why = (
        "within the A-vs-A noise floor"
        if r["delta_us"] <= r["noise_floor_us"]
        else "above the noise floor, below 1 % of a command"
        if r["delta_us"] <= THRESHOLD * r["ledger_us_per_command"]
        else "above the noise floor and 1 % of a command"
    )
    need = 1 + allowance / r["ledger_us_per_command"]
    return (
        verdict(
            f"{what}, {r['backend']} {r['durability']} ({why})",
            1 + r["delta_us"] / r["ledger_us_per_command"],
            need,
            r["command_ratio_each"],
            at_most=True,
        )
        # the status compares the unrounded figures; these are for reading
        | {"need": round(need, 4), "ratio": r["command_ratio"]}
        | {"delta_us": r["delta_us"], "noise_floor_us": r["noise_floor_us"]}
    )


Cells = Callable[[str, str, str, int, int], list[dict[str, Any]]]
"""A benchmark's cells on one log: (target, backend, durability, block, rounds) -> rows."""


def ab_row(
    benchmark: str,
    got: Sequence[dict[str, float]],
    ledger_runs: Sequence[tuple[int, float]],
    labels: tuple[str, str],
    names: tuple[str, str],
    **cell: Any,
) -> dict[str, Any]:
    """One cell's row from its rounds (block medians in s, keyed by `labels`: without, with)
    and the real ledger commands timed beside them; `names` name the two kinds in the row."""
    us = [{k: v * 1e6 for k, v in r.items()} for r in got]
    deltas, aa = contrasts(us, labels)
    delta_us = round(statistics.median(deltas), 1)
    noise_us = round(statistics.median(abs(a) for a in aa), 1)
    ledger_us = statistics.median(s / n for n, s in ledger_runs) * 1e6
    per_kind = {
        f"{name}_us_per_command": round(
            statistics.median(x for r in us for x in (r[label], r[label + "2"])), 1
        )
        for name, label in zip(reversed(names), reversed(labels), strict=True)
    }
    return {
        "benchmark": benchmark,
        **cell,
        **per_kind,
        "blocks_us": [{k: round(v, 1) for k, v in r.items()} for r in us],
        "delta_us": delta_us,
        "delta_each_us": [round(d, 1) for d in deltas],
        "aa_each_us": [round(a, 1) for a in aa],
        "noise_floor_us": noise_us,
        "ledger_us_per_command": round(ledger_us, 1),
        "delta_share_of_ledger_command": round(delta_us / ledger_us, 4),
        "noise_share_of_ledger_command": round(noise_us / ledger_us, 4),
        "command_ratio": round(1 + delta_us / ledger_us, 4),
        "command_ratio_each": [round(1 + d / ledger_us, 4) for d in deltas],
        "within_noise": delta_us <= noise_us,
        "below_threshold": delta_us <= THRESHOLD * ledger_us,
    }


def cells(
    target: str, backend: str, durability: str, block: int, rounds: int
) -> list[dict[str, Any]]:
    with EventLog.open(target, durability=durability) as log:  # type: ignore[arg-type]
        if log.stream_version(EPOCH_STREAM) is None:
            log.append(EPOCH_STREAM, [ControllerEpochStarted(epoch=1, reason="bench")], NO_STREAM)
        got = rounds_of(_fencing_step(log), block, rounds)
        # the real ledger keeps its own epoch: it takes one when it opens (after the above)
        ledger_runs = [ledger_commands(log, max(block // 2, 20), r * 100_000) for r in range(3)]
    cell = {"backend": backend, "durability": durability, "block": block, "rounds": rounds}
    return [ab_row("fencing", got, ledger_runs, ("U", "F"), ("unfenced", "fenced"), **cell)]


def ab_table(title: str, names: tuple[str, str], rows: Sequence[dict[str, Any]]) -> Table:
    """The cells as a table; `names` (without, with) name the two per-kind columns."""
    without, with_ = names
    out = column_table(
        title,
        (
            "backend",
            "durability",
            f"{with_} µs",
            f"{without} µs",
            "Δ µs (per round)",
            "A-vs-A noise µs",
            "ledger command µs",
            "Δ share of command",
        ),
        left={"backend"},
    )
    for r in rows:
        out.add_row(
            r["backend"],
            r["durability"],
            f"{r[with_ + '_us_per_command']:,.1f}",
            f"{r[without + '_us_per_command']:,.1f}",
            f"{r['delta_us']:+.1f} ({min(r['delta_each_us']):+.1f}…{max(r['delta_each_us']):+.1f})",
            f"{r['noise_floor_us']:.1f}",
            f"{r['ledger_us_per_command']:,.1f}",
            f"{r['delta_share_of_ledger_command']:+.2%}",
        )
    return out


def run_ab(
    benchmark: str,
    cells: Cells,
    *,
    title: str,
    names: tuple[str, str],
    what: str,
    quick: bool = False,
    repeats: int | None = None,
    scale: float | None = None,
    backends: Sequence[str] = ("sqlite", "postgresql"),
    out_dir: Path | None = None,
    workdir: Path | None = None,
    console: Console | None = None,
) -> Results:
    """Run `cells` on SQLite FULL and NORMAL and PostgreSQL; write <out_dir>/<benchmark>.json.

    `repeats` is the number of rounds; `scale` scales the block size."""
    console = console or Console()
    rounds = repeats if repeats is not None else (QUICK_ROUNDS if quick else ROUNDS)
    block = max(int((QUICK_BLOCK if quick else BLOCK) * (scale or 1.0)), 10)
    with scratch(workdir, f"eventlog-bench-{benchmark}-") as work:
        results = Results(benchmark, machine(work, {"rounds": rounds, "block": block}))
        rows: list[dict[str, Any]] = []
        if "sqlite" in backends:
            for durability in ("full", "normal"):
                target = str(work / f"{benchmark}-{durability}.db")
                rows += cells(target, "sqlite", durability, block, rounds)
        if "postgresql" in backends:
            try:
                with pg_server() as server:
                    rows += cells(server.url(), "postgresql", "full", block, rounds)
            except PgUnavailable as exc:
                console.print(f"[yellow]PostgreSQL skipped: {exc}[/]")
    results.rows = rows
    results.targets = [cell_target(r, what) for r in rows]
    console.print(ab_table(title, names, rows))
    print_targets(console, results.targets, ".4f")
    results.save(out_dir, console)
    return results


def run(**options: Any) -> Results:
    """Interleave fenced and unfenced blocks on each backend; write <out_dir>/fencing.json."""
    return run_ab(
        "fencing",
        cells,
        title="fencing: cost per command (median µs)",
        names=("unfenced", "fenced"),
        what="ledger command fenced vs unfenced",
        **options,
    )


if __name__ == "__main__":
    run(out_dir=RESULTS_DIR)
