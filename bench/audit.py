"""The audit commands on a run log: wall time and peak memory of each, as an auditor runs them.

On the realistic run log of `bench.runlog` (10^6 records, and 10^5 beside it to show memory
stays flat in log length; 3·10^4 and 10^4 with `--quick`), each command runs as its own
`eventlog` process, its output thrown away, and is timed from start to exit; its peak resident
memory is that child's own `ru_maxrss` (os.wait4), so nothing of this process leaks in, and
its CPU time (user + system, its waited-for workers included) is reported beside the wall time:

- `replay --json`: every record as JSON lines (records/s over the whole log);
- `inspect group G`: a group admitted halfway through the log;
- `state --at SEQ`: the ledger at the middle seq;
- `stats`, `export --format parquet`, `report -o run.html`.

Targets (issue 10): replay ≥ 100k records/s, inspect and state under 1 s, stats, export and
report within a few seconds (5 s here), and each command's peak memory on the larger log at
most 1.5× that on the smaller one. Each figure is the median of `repeats` runs.

The project's modules are compiled to bytecode first (`cache_bytecode`), as `pip install`
compiles an installed package: a checkout installed in editable mode, run with
PYTHONDONTWRITEBYTECODE set, would otherwise compile them from source in every child.

`python -m bench.audit [--quick] [--out DIR]`, or `python -m bench audit`.
"""

from __future__ import annotations

import argparse
import compileall
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

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
from bench.runlog import CACHE_DIR, REPO, RunLog, run_log

SIZES = (1_000_000, 100_000)
QUICK_SIZES = (30_000, 10_000)
"""The larger size comes first: the targets are read on it."""

COMMANDS = (
    "replay --json",
    "replay --json --jobs 1",
    "inspect group",
    "state --at",
    "stats",
    "export",
    "export --jobs 1",
    "report",
    "report --jobs 1",
)
"""`replay --json`, `export` and `report` as run by default (worker processes, one per CPU up
to 8 for the first two, two painters for `report`, on logs of 250,000 records or more), each
followed by the same in one process."""
REPLAY_RECORDS_PER_S = 100_000
INTERACTIVE_S = 1.0
BATCH_S = 5.0
RSS_GROWTH = 1.5


def eventlog_command() -> list[str]:
    """The installed `eventlog` script beside this interpreter, else the same entry point."""
    script = Path(sys.executable).with_name("eventlog")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from eventlog.cli.main import main; main()"]


def middle_group(path: Path, head: int) -> str:
    """The first group reserved after the log's middle seq (read-only: the log is not touched)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = conn.execute(
            "SELECT stream FROM events WHERE seq >= ? AND type = 'GroupReserved' "
            "ORDER BY seq LIMIT 1",
            (head // 2,),
        ).fetchone()
    finally:
        conn.close()
    if row is None:
        raise RuntimeError(f"no GroupReserved after seq {head // 2} in {path}")
    return str(row[0]).removeprefix("group/")


def arguments(command: str, run: RunLog, group: str, work: Path) -> list[str]:
    target = str(run.path)
    return {
        "replay --json": ["replay", target, "--json"],
        "replay --json --jobs 1": ["replay", target, "--json", "--jobs", "1"],
        "inspect group": ["inspect", "group", target, group],
        "state --at": ["state", target, "--at", str(run.records // 2)],
        "stats": ["stats", target],
        "export": ["export", target, "--format", "parquet", "-o", str(work / "export")],
        "export --jobs 1": [
            *("export", target, "--format", "parquet", "-o", str(work / "export-1")),
            *("--jobs", "1"),
        ],
        "report": ["report", target, "-o", str(work / "run.html")],
        "report --jobs 1": ["report", target, "-o", str(work / "run-1.html"), "--jobs", "1"],
    }[command]


LAUNCHER = """
import json, os, subprocess, sys, time
started = time.perf_counter()
child = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(child.pid, 0)
seconds = time.perf_counter() - started
child.returncode = os.waitstatus_to_exitcode(status)
cpu = usage.ru_utime + usage.ru_stime
print(json.dumps([seconds, usage.ru_maxrss, child.returncode, cpu]))
"""
"""Starts the command from a small process: on Linux a child's ru_maxrss includes the memory
of the process it was forked from, so a child of this process (which holds the run-log
generator's imports) would report this process's size instead of its own."""


class Timed(NamedTuple):
    seconds: float
    """Wall time."""
    maxrss_mb: float
    """The command's peak RSS."""
    cpu_s: float
    """CPU time (user + system) of the command and of the worker processes it waited for:
    beside the wall time, it tells a slower machine (both grow) from waiting (wall alone)."""


def timed_child(argv: Sequence[str]) -> Timed:
    """Run `argv` with its output discarded, and measure it."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", LAUNCHER, *argv],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"launcher for {' '.join(argv)} failed:\n{done.stderr[-4000:]}")
    seconds, maxrss_kib, code, cpu = json.loads(done.stdout.strip().splitlines()[-1])
    if code != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {code}:\n{done.stderr[-4000:]}")
    return Timed(float(seconds), maxrss_kib / 1024, float(cpu))  # ru_maxrss: KiB on Linux


PACKAGES = ("eventlog", "projections")
"""The project's packages (what an editable install leaves without cached bytecode)."""


def cache_bytecode() -> bool:
    """Write the bytecode cache of the project's modules, as installing the package does;
    False when some could not be written (a read-only checkout)."""
    return all([compileall.compile_dir(REPO / package, quiet=2) for package in PACKAGES])


def command_rows(run: RunLog, repeats: int, work: Path, console: Console) -> list[dict[str, Any]]:
    work.mkdir(parents=True, exist_ok=True)
    group = middle_group(run.path, run.records)
    rows = []
    for command in COMMANDS:
        argv = eventlog_command() + arguments(command, run, group, work)
        samples = [timed_child(argv) for _ in range(repeats)]
        seconds = [s.seconds for s in samples]
        rss = [s.maxrss_mb for s in samples]
        cpu = [s.cpu_s for s in samples]
        median = statistics.median(seconds)
        row = {
            "command": command,
            "records": run.records,
            "argv": argv[len(eventlog_command()) :],
            "seconds": round(median, 3),
            "seconds_each": [round(s, 3) for s in seconds],
            "records_per_s": round(run.records / median, 1),
            "records_per_s_each": [round(run.records / s, 1) for s in seconds],
            "maxrss_mb": round(max(rss), 1),
            "maxrss_mb_each": [round(m, 1) for m in rss],
            "cpu_s": round(statistics.median(cpu), 3),
            "cpu_s_each": [round(c, 3) for c in cpu],
        }
        rows.append(row)
        console.print(
            f"  {run.records:>10,} records  {command:<14} {median:>7.2f} s  "
            f"CPU {row['cpu_s']:>6.2f} s  "
            f"{row['records_per_s']:>12,.0f} rec/s  peak RSS {row['maxrss_mb']:>7,.0f} MB",
            highlight=False,
        )
    return rows


def evaluate_targets(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Speed targets on the largest log; memory: larger log's peak RSS over the smaller's."""
    largest = max(r["records"] for r in rows)
    smallest = min(r["records"] for r in rows)
    on = {r["command"]: r for r in rows if r["records"] == largest}
    targets = []
    for command in COMMANDS:
        row = on[command]
        if command.startswith("replay --json"):
            targets.append(
                verdict(
                    f"{command} records/s ({largest:,} records)",
                    row["records_per_s"],
                    REPLAY_RECORDS_PER_S,
                    row["records_per_s_each"],
                    at_most=False,
                )
            )
            continue
        need = INTERACTIVE_S if command in ("inspect group", "state --at") else BATCH_S
        targets.append(
            verdict(f"{command} seconds", row["seconds"], need, row["seconds_each"], at_most=True)
        )
    if largest != smallest:
        small = {r["command"]: r for r in rows if r["records"] == smallest}
        for command in COMMANDS:
            ratios = [
                big / low
                for big, low in zip(
                    on[command]["maxrss_mb_each"], small[command]["maxrss_mb_each"], strict=True
                )
            ]
            targets.append(
                verdict(
                    f"{command} peak RSS {largest:,} / {smallest:,} records",
                    on[command]["maxrss_mb"] / small[command]["maxrss_mb"],
                    RSS_GROWTH,
                    ratios,
                    at_most=True,
                )
            )
    return targets


def table(rows: Sequence[dict[str, Any]]) -> Table:
    out = column_table(
        "audit commands (one eventlog process each, output discarded)",
        ("records", "command", "seconds", "records/s", "peak RSS MB"),
        left={"command"},
        title_justify="center",
    )
    for r in rows:
        out.add_row(
            f"{r['records']:,}",
            r["command"],
            f"{r['seconds']:.2f}",
            f"{r['records_per_s']:,.0f}",
            f"{r['maxrss_mb']:,.0f}",
        )
    return out


def run(
    *,
    quick: bool = False,
    repeats: int | None = None,
    sizes: Sequence[int] | None = None,
    out_dir: Path | None = None,
    workdir: Path | None = None,
    cache_dir: Path | None = None,
    console: Console | None = None,
    **_: Any,
) -> Results:
    """Time every audit command on the run log at each size; write <out_dir>/audit.json."""
    console = console or Console()
    repeats = repeats if repeats is not None else (1 if quick else 3)
    sizes = sorted(sizes or (QUICK_SIZES if quick else SIZES), reverse=True)
    with scratch(workdir, "eventlog-bench-audit-") as work:
        results = Results("audit", machine(work, {"repeats": repeats, "sizes": list(sizes)}))
        results.header["eventlog_command"] = eventlog_command()
        rows: list[dict[str, Any]] = []
        if not cache_bytecode():
            console.print(
                "warning: the project's bytecode could not be cached; each command's time "
                "includes compiling its modules",
                highlight=False,
            )
        for size in sizes:
            started = time.perf_counter()
            log, cached = run_log(size, cache_dir=cache_dir or CACHE_DIR)
            console.print(
                f"run log: {log.records:,} records, {log.manifest['file_bytes'] / 2**20:,.0f} MiB; "
                + ("cached" if cached else f"generated in {time.perf_counter() - started:.1f} s"),
                highlight=False,
            )
            rows += command_rows(log, repeats, work / f"out-{size}", console)
    results.rows = rows
    results.targets = evaluate_targets(rows)
    console.print(table(rows))
    print_targets(console, results.targets, ",.2f")
    results.save(out_dir, console)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.audit", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3·10^4 and 10^4 records, one repeat")
    parser.add_argument("--sizes", type=int, nargs="*", help="log sizes (default 10^6 and 10^5)")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--out", type=Path, help="results folder (default bench/results)")
    args = parser.parse_args(argv)
    out = args.out
    if out is None:
        out = Path(tempfile.mkdtemp(prefix="eventlog-bench-quick-")) if args.quick else RESULTS_DIR
    run(quick=args.quick, sizes=args.sizes, repeats=args.repeats, out_dir=out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
