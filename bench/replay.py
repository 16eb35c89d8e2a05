"""Replay throughput and restore time: what reading a run back costs (docs/design.md §9).

On a realistic run log of 10^6 records (`bench.runlog`, generated once and cached; 10^5 with
`--quick`), SQLite file, measured:

- `read`: records/s streamed from the file as stored (`EventLog.read_records`, no decode);
- `decode`: records/s read and decoded into events (`EventLog.read`);
- `fold`: the log's records/s folded into the sibling projection by the rebuild's own loop
  (`eventlog.recovery.checkpoint.fold_records` from seq 1 into one LedgerState: it reads and
  decodes only the types `projections.siblings.fold` handles, `FOLDED_TYPES`);
- `fold_every_record`: every record read, decoded and passed to `fold` (the rebuild before
  it read only the fold's types), for comparison;
- `restore`: `RecoveryLedger.restore` to the latest checkpoint, with the projection snapshot
  stored at the checkpoint, and without it (a copy of the log whose snapshots are gone, as a
  crash right after the CheckpointCommitted append leaves it: the fold starts at seq 1);
- `open`: `RecoveryLedger.open` (continue after a controller restart that kept its data
  plane): the latest snapshot plus the records after it, and without snapshots;
- `restore_other_version`: the restore with its snapshots rewritten as of another projection
  version (what the first restore after a code change that reshaped the ledger state meets):
  not trusted, so it folds from seq 1; reported beside the same-version restore.

Each restore/open runs in a fresh child process on a private copy of the log (a restore
appends to it), so its peak resident memory (`ru_maxrss`) is its own; the child also times the
phases of a restore. Everything is repeated `repeats` times; figures are medians with their
spread.

`python -m bench.replay [--quick] [--records N]`, or `python -m bench replay`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
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
    remove_database,
    scratch,
    verdict,
)
from bench.runlog import CACHE_DIR, REPO, RunLog, copy_log, run_log

RECORDS = 1_000_000
QUICK_RECORDS = 100_000
SNAPSHOT_SPEEDUP_TARGET = 10.0
"""Restoring a 10^6-record log from its snapshot should be at least this much faster than
folding it from seq 1: otherwise restore still costs O(log), which at 10^8–10^9 records a run
cannot afford."""
RESTORE_SECONDS_TARGET = 0.5
"""Issue 11: a restore from its snapshot takes < 0.5 s on a 10^6-record log ..."""
RESTORE_FLAT_TARGET = 1.5
"""... and stays flat in log length: the largest log's restore within 1.5× the smallest's."""
FOLD_TARGET = 300_000
"""Records/s folded into the sibling projection (read and decode included)."""
READ_VS_RAW_TARGET = 0.5
"""`EventLog.read` (decoded) ≥ half the raw driver's scan + msgspec decode."""
SIZES = (100_000, 2_000_000)
"""Log sizes restored beside the main one (with their snapshot), for flatness."""
QUICK_SIZES = (30_000, 300_000)


# -- child process: one restore or open, timed by phase ---------------------------------------


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _timed(owner: Any, name: str, phases: dict[str, float], label: str) -> None:
    """Replace `owner.name` with a wrapper that adds its wall time to phases[label]."""
    original: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            phases[label] = phases.get(label, 0.0) + time.perf_counter() - started

    setattr(owner, name, wrapper)


def child(what: str, log_path: str) -> dict[str, Any]:
    """Run one restore (or open) on `log_path` and return its figures (in a fresh process)."""
    import eventlog.recovery.ledger
    import eventlog.recovery.restore
    from bench.runlog import RunDataset
    from eventlog import EventLog
    from eventlog.dataplane.memory import InMemoryDataPlane
    from eventlog.recovery.barrier import MutationBarrier
    from eventlog.recovery.ledger import RecoveryLedger

    phases: dict[str, float] = {}
    # Phase timers: module-level names the restore calls once each (the per-group stream reads
    # happen inside attempts_used, the TokensStaged scan inside staged_by).
    _timed(eventlog.recovery.restore, "fold_from_snapshot", phases, "fold_s")
    _timed(eventlog.recovery.ledger, "fold_until", phases, "fold_s")
    _timed(eventlog.recovery.restore, "staged_by", phases, "tokens_staged_scan_s")
    _timed(eventlog.recovery.restore, "attempt_histories", phases, "group_streams_s")
    _timed(eventlog.recovery.restore, "_rehydrate", phases, "rehydrate_s")
    _timed(InMemoryDataPlane, "load_checkpoint", phases, "data_plane_load_s")

    baseline = _maxrss_mb()
    with EventLog.open(log_path) as log:
        data_plane = InMemoryDataPlane()
        cpu = time.process_time()
        started = time.perf_counter()
        counts: dict[str, int] = {}
        if what == "restore":
            ledger = RecoveryLedger(log, data_plane)

            async def section() -> None:
                async with MutationBarrier().mutation("recovery_restore") as cut:
                    plan = ledger.restore(cut, RunDataset())
                counts.update(plan.counts)

            asyncio.run(section())
        else:
            ledger = RecoveryLedger.open(log, data_plane)
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu
        groups = len(ledger.state.groups)
        done = [r.event for r in log.read(types=["RestoreCompleted"])]
        untrusted = getattr(done[-1], "snapshots_untrusted", 0) if done else 0
    phases["other_s"] = max(0.0, seconds - sum(phases.values()))
    return {
        "seconds": seconds,
        "cpu_s": cpu,
        "phases": phases,
        "groups": groups,
        "counts": counts,
        "snapshots_untrusted": untrusted,
        "maxrss_mb": _maxrss_mb(),
        "baseline_maxrss_mb": baseline,
    }


def _run_child(what: str, log_path: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-m", "bench.replay", "--child", what, str(log_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench child {what} {log_path} failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- the parent -------------------------------------------------------------------------------


def _spread(values: Sequence[float], digits: int = 3) -> dict[str, Any]:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "each": [round(v, digits) for v in values],
    }


def _scan(run: RunLog, mode: str) -> tuple[int, float, float]:
    """One pass over the whole log: (records, wall seconds, CPU seconds)."""
    from eventlog import EventLog
    from eventlog.recovery.checkpoint import fold_records
    from projections.history import RolledBack
    from projections.siblings import LedgerState, fold

    count = 0
    with EventLog.open(run.path, create=False) as log:
        cpu = time.process_time()
        started = time.perf_counter()
        if mode == "raw_decode":
            from bench.impls import raw_read_decode

            count = raw_read_decode(run.path)
        elif mode == "read":
            for _ in log.read_records():
                count += 1
        elif mode == "decode":
            for _ in log.read():
                count += 1
        elif mode == "fold_every_record":
            state = LedgerState()
            for rec in log.read():
                fold(state, rec.event)
                count += 1
        else:
            # What every rebuild runs (ledger open, restore without a usable snapshot,
            # `state --at`): only the records of the types the fold handles are read and
            # decoded; the rate is the log's records covered per second.
            count = log.head()
            fold_records(log, LedgerState(), 1, count, RolledBack())
        return count, time.perf_counter() - started, time.process_time() - cpu


def scan_rows(
    run: RunLog, repeats: int, on_row: Callable[[dict[str, Any]], None]
) -> list[dict[str, Any]]:
    """read / decode / fold throughput over the whole log, modes interleaved per repeat."""
    modes = ("raw_decode", "read", "decode", "fold", "fold_every_record")
    samples: dict[str, list[tuple[int, float, float]]] = {m: [] for m in modes}
    for _ in range(repeats):
        for mode in modes:
            samples[mode].append(_scan(run, mode))
    rows = []
    for mode in modes:
        seconds = _spread([s[1] for s in samples[mode]])
        rates = _spread([s[0] / s[1] for s in samples[mode]], 1)
        row = {
            "benchmark": mode,
            "records": samples[mode][0][0],
            "seconds": seconds["median"],
            "seconds_min": seconds["min"],
            "seconds_max": seconds["max"],
            "records_per_s": rates["median"],
            "records_per_s_min": rates["min"],
            "records_per_s_max": rates["max"],
            "records_per_s_each": rates["each"],
            "cpu_us_per_record": round(
                statistics.median(s[2] / s[0] * 1e6 for s in samples[mode]), 2
            ),
            "snapshot": False,
            "repeats": repeats,
        }
        on_row(row)
        rows.append(row)
    return rows


def _seconds_columns(seconds: dict[str, Any]) -> dict[str, Any]:
    """A cell's repeats as its row's seconds columns (median first, as the table reads it)."""
    return {
        "seconds": seconds["median"],
        "seconds_min": seconds["min"],
        "seconds_max": seconds["max"],
        "seconds_each": seconds["each"],
    }


def _child_columns(got: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What the child processes of one cell reported, as its row's columns: medians, and the
    worst peak RSS (memory is bounded by the worst repeat, not the typical one)."""
    return {
        "cpu_s": round(statistics.median(g["cpu_s"] for g in got), 3),
        "phases_s": {
            p: round(statistics.median(g["phases"].get(p, 0.0) for g in got), 3)
            for p in sorted({p for g in got for p in g["phases"]})
        },
        "maxrss_mb": round(max(g["maxrss_mb"] for g in got), 1),
        "baseline_maxrss_mb": round(statistics.median(g["baseline_maxrss_mb"] for g in got), 1),
        "groups": got[0]["groups"],
        "counts": got[0]["counts"],
    }


def _log_columns(run: RunLog) -> dict[str, int]:
    """What a restore of this log starts from: its newest checkpoint, the records after it
    (what the restore rolls back) and the groups in flight."""
    newest = run.manifest["checkpoints"][-1]["seq"]
    return {
        "checkpoint_seq": newest,
        "tail_records": run.manifest["head"] - newest,
        "in_flight": run.manifest["in_flight"],
    }


def recovery_rows(
    run: RunLog, repeats: int, work: Path, on_row: Callable[[dict[str, Any]], None]
) -> list[dict[str, Any]]:
    """restore with and without snapshots, and open with them, each in its own child process.

    `open` without snapshots is left out: it is the same fold from seq 1 that a restore
    without snapshots times in its `fold_s` phase (plus the tail after the newest checkpoint).
    """
    last_ckpt = run.manifest["checkpoints"][-1]["seq"]
    cells = [("restore", True), ("restore", False), ("open", True)]
    samples: dict[tuple[str, bool], list[dict[str, Any]]] = {c: [] for c in cells}
    for repeat in range(repeats):
        for snapshot in (True, False):
            copy = copy_log(run, work / f"r{repeat}-{snapshot}.db", keep_snapshots=snapshot)
            try:
                if ("open", snapshot) in samples:  # open does not write: before the restore
                    samples[("open", snapshot)].append(_run_child("open", copy))
                samples[("restore", snapshot)].append(_run_child("restore", copy))
            finally:
                remove_database(copy)
    rows = []
    for what, snapshot in cells:
        got = samples[(what, snapshot)]
        seconds = _spread([g["seconds"] for g in got])
        if what == "restore":
            folded = 0 if snapshot else last_ckpt
        else:
            folded = run.records - last_ckpt if snapshot else run.records
        row = {
            "benchmark": what,
            "records": run.records,
            "snapshot": snapshot,
            **_seconds_columns(seconds),
            "records_per_s": round(run.records / seconds["median"], 1),
            "folded_records": folded,
            **_log_columns(run),
            **_child_columns(got),
            "snapshots_untrusted": got[0]["snapshots_untrusted"],
            "repeats": repeats,
        }
        on_row(row)
        rows.append(row)
    by = {(r["benchmark"], r["snapshot"]): r for r in rows}
    with_s, without_s = by[("restore", True)]["seconds"], by[("restore", False)]["seconds"]
    by[("restore", True)]["speedup_vs_no_snapshot"] = round(without_s / with_s, 2)
    return rows


def _as_other_projection_version(path: Path) -> None:
    """Rewrite every snapshot of the copy as if another projection version had written it."""
    import msgspec

    with sqlite3.connect(path) as conn:
        for name, seq, payload in conn.execute(
            "SELECT name, seq, payload FROM snapshots"
        ).fetchall():
            snapshot = msgspec.msgpack.decode(payload)
            snapshot["projection_version"] = "0.another-version"
            conn.execute(
                "UPDATE snapshots SET payload = ? WHERE name = ? AND seq = ?",
                (msgspec.msgpack.encode(snapshot), name, seq),
            )
    conn.close()


def other_version_rows(
    run: RunLog,
    repeats: int,
    work: Path,
    on_row: Callable[[dict[str, Any]], None],
    same_version: Sequence[dict[str, Any]],
) -> list[dict[str, Any]]:
    """The restore whose snapshots are of another projection version, beside the same-version
    restore of the same log (`same_version`: recovery_rows' rows)."""
    got = []
    for repeat in range(repeats):
        copy = copy_log(run, work / f"other-version-r{repeat}.db", keep_snapshots=True)
        try:
            _as_other_projection_version(copy)
            got.append(_run_child("restore", copy))
        finally:
            remove_database(copy)
    seconds = _spread([g["seconds"] for g in got])
    same = next(r for r in same_version if r["benchmark"] == "restore" and r["snapshot"])
    row = {
        "benchmark": "restore_other_version",
        "records": run.records,
        "snapshot": True,
        **_seconds_columns(seconds),
        "records_per_s": round(run.records / seconds["median"], 1),
        "folded_records": run.manifest["checkpoints"][-1]["seq"],
        **_child_columns(got),
        "snapshots_untrusted": got[0]["snapshots_untrusted"],
        "same_version_seconds": same["seconds"],
        "vs_same_version": round(seconds["median"] / same["seconds"], 2),
        "repeats": repeats,
    }
    on_row(row)
    return [row]


def _append_reference(out_dir: Path | None) -> dict[str, Any] | None:
    """eventlog's SQLite NORMAL batch-1000 append row, from the latest append results."""
    for folder in (out_dir, RESULTS_DIR):
        path = None if folder is None else folder / "append.json"
        if path is None or not path.is_file():
            continue
        for row in json.loads(path.read_text()):
            if (row["backend"], row["impl"], row["mode"], row["batch"], row["durability"]) == (
                "sqlite",
                "eventlog",
                "batch",
                1000,
                "normal",
            ):
                return dict(row)
    return None


def evaluate_targets(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {(r["benchmark"], r["snapshot"], r["records"]): r for r in rows}
    scans = {r["benchmark"]: r for r in rows if "records_per_s_each" in r}
    targets = []
    if "decode" in scans and "raw_decode" in scans:
        ours, raw = scans["decode"], scans["raw_decode"]
        paired = [
            a / b
            for a, b in zip(ours["records_per_s_each"], raw["records_per_s_each"], strict=True)
        ]
        targets.append(
            verdict(
                "EventLog.read (decoded) vs raw sqlite3 scan + msgspec decode",
                ours["records_per_s"] / raw["records_per_s"],
                READ_VS_RAW_TARGET,
                paired,
            )
        )
    if "fold" in scans:
        fold = scans["fold"]
        targets.append(
            verdict(
                "fold into the sibling projection, records/s",
                fold["records_per_s"],
                FOLD_TARGET,
                fold["records_per_s_each"],
            )
        )
    restores = sorted(
        (r for (what, snap, _), r in by.items() if what == "restore" and snap),
        key=lambda r: r["records"],
    )
    main = max(restores, key=lambda r: r.get("main", False), default=None)
    if main is not None:
        targets.append(
            verdict(
                f"restore of {main['records']:,} records from its snapshot, seconds",
                main["seconds"],
                RESTORE_SECONDS_TARGET,
                main["seconds_each"],
                at_most=True,
            )
        )
    if len(restores) > 1:
        small, large = restores[0], restores[-1]
        targets.append(
            verdict(
                f"restore from snapshot flat in log length: {large['records']:,} vs "
                f"{small['records']:,} records (tails {large['tail_records']:,} and "
                f"{small['tail_records']:,})",
                large["seconds"] / small["seconds"],
                RESTORE_FLAT_TARGET,
                [
                    large["seconds_min"] / small["seconds_max"],
                    large["seconds_max"] / small["seconds_min"],
                ],
                at_most=True,
            )
        )
    with_snapshot = main
    without = None if main is None else by.get(("restore", False, main["records"]))
    if with_snapshot is not None and without is not None:
        ratio = without["seconds"] / with_snapshot["seconds"]
        paired = [
            b / a
            for a, b in zip(with_snapshot["seconds_each"], without["seconds_each"], strict=True)
        ]
        targets.append(
            verdict(
                f"restore of {with_snapshot['records']:,} records: from its snapshot vs "
                "folding from seq 1",
                ratio,
                SNAPSHOT_SPEEDUP_TARGET,
                paired,
            )
        )
    return targets


def size_rows(
    sizes: Sequence[int],
    repeats: int,
    work: Path,
    cache_dir: Path,
    on_row: Callable[[dict[str, Any]], None],
) -> list[dict[str, Any]]:
    """Restore from the snapshot on logs of other sizes (generated once and cached)."""
    rows = []
    for size in sizes:
        run_info, _ = run_log(size, cache_dir=cache_dir)
        got = []
        for repeat in range(repeats):
            copy = copy_log(run_info, work / f"size{size}-r{repeat}.db", keep_snapshots=True)
            try:
                got.append(_run_child("restore", copy))
            finally:
                remove_database(copy)
        seconds = _spread([g["seconds"] for g in got])
        row = {
            "benchmark": "restore",
            "records": run_info.records,
            "snapshot": True,
            **_seconds_columns(seconds),
            "records_per_s": round(run_info.records / seconds["median"], 1),
            "folded_records": 0,
            **_log_columns(run_info),
            **_child_columns(got),
            "repeats": repeats,
        }
        on_row(row)
        rows.append(row)
    return rows


def table(rows: Sequence[dict[str, Any]]) -> Table:
    out = column_table(
        "replay and restore",
        (
            "benchmark",
            "snapshot",
            "records",
            "records/s",
            "range",
            "seconds",
            "CPU µs/rec",
            "folded",
            "peak RSS MB",
            "× no snapshot",
        ),
        left={"benchmark"},
    )
    for r in rows:
        if "records_per_s_min" in r:
            spread = f"{r['records_per_s_min']:,.0f}–{r['records_per_s_max']:,.0f}"
        else:
            spread = f"{r['seconds_min']:.2f}–{r['seconds_max']:.2f} s"
        out.add_row(
            r["benchmark"],
            "yes" if r["snapshot"] else "no",
            f"{r['records']:,}",
            f"{r['records_per_s']:,.0f}",
            spread,
            f"{r['seconds']:.2f}",
            f"{r['cpu_us_per_record']:.1f}" if "cpu_us_per_record" in r else "—",
            f"{r['folded_records']:,}" if "folded_records" in r else f"{r['records']:,}",
            f"{r['maxrss_mb']:,.0f}" if "maxrss_mb" in r else "—",
            f"{r['speedup_vs_no_snapshot']:.1f}" if "speedup_vs_no_snapshot" in r else "—",
        )
    return out


def run(
    *,
    quick: bool = False,
    repeats: int | None = None,
    scale: float | None = None,
    records: int | None = None,
    backends: Sequence[str] = ("sqlite",),
    out_dir: Path | None = None,
    workdir: Path | None = None,
    cache_dir: Path | None = None,
    sizes: Sequence[int] | None = None,
    console: Console | None = None,
    **_: Any,
) -> Results:
    """Generate (or reuse) the run log, time replay and restore, write <out_dir>/replay.json."""
    console = console or Console()
    repeats = repeats if repeats is not None else (1 if quick else 3)
    if records is None:
        records = int((QUICK_RECORDS if quick else RECORDS) * (scale or 1.0))
    with scratch(workdir, "eventlog-bench-replay-") as work:
        results = Results("replay", machine(work, {"repeats": repeats, "records": records}))
        if "sqlite" not in backends:
            console.print("[yellow]replay runs on SQLite only; skipped[/]")
            return results

        def on_row(row: dict[str, Any]) -> None:
            extra = ""
            if "maxrss_mb" in row:
                phases = " · ".join(
                    f"{name.removesuffix('_s').replace('_', ' ')} {seconds:.2f}"
                    for name, seconds in sorted(row["phases_s"].items(), key=lambda kv: -kv[1])
                    if seconds >= 0.005
                )
                extra = (
                    f"  peak RSS {row['maxrss_mb']:,.0f} MB "
                    f"({row['baseline_maxrss_mb']:,.0f} after imports); {phases} s"
                )
            console.print(
                f"  {row['benchmark']:<8} snapshot {'yes' if row['snapshot'] else 'no ':<3} "
                f"{row['records']:>10,} records  {row['seconds']:>8.2f} s  "
                f"{row['records_per_s']:>10,.0f} rec/s{extra}",
                highlight=False,
            )

        started = time.perf_counter()
        run_info, cached = run_log(records, cache_dir=cache_dir or CACHE_DIR)
        manifest = run_info.manifest
        results.header["run_log"] = {k: v for k, v in manifest.items() if k != "checkpoints"} | {
            "path": str(run_info.path),
            "cached": cached,
            "checkpoints": len(manifest["checkpoints"]),
        }
        results.header["checkpoint"] = manifest["checkpoints"][-1]
        console.print(
            f"run log: {run_info.records:,} records, {manifest['groups']:,} groups "
            f"({manifest['in_flight']} in flight), {len(manifest['checkpoints'])} checkpoints, "
            f"{manifest['file_bytes'] / 2**20:,.0f} MiB; "
            + ("cached" if cached else f"generated in {time.perf_counter() - started:.1f} s"),
            highlight=False,
        )
        rows = scan_rows(run_info, repeats, on_row)
        main_rows = recovery_rows(run_info, repeats, work, on_row)
        for row in main_rows:
            row["main"] = True
        rows += main_rows
        rows += other_version_rows(run_info, repeats, work, on_row, main_rows)
        if sizes is None:
            sizes = QUICK_SIZES if quick else SIZES
        rows += size_rows(
            [n for n in sizes if n != records], repeats, work, cache_dir or CACHE_DIR, on_row
        )
    results.rows = rows
    results.targets = evaluate_targets(rows)
    console.print(table(rows))
    reference = _append_reference(out_dir)
    fold_row = next(r for r in rows if r["benchmark"] == "fold")
    if reference is not None:
        results.header["append_reference"] = {
            k: reference[k] for k in ("backend", "impl", "batch", "durability", "events_per_s")
        }
        console.print(
            f"fold reads back {fold_row['records_per_s'] / reference['events_per_s']:.1f}× as "
            f"fast as eventlog appends (SQLite NORMAL, batch 1000: "
            f"{reference['events_per_s']:,.0f} ev/s)",
            highlight=False,
        )
    print_targets(console, results.targets, ",.2f")
    results.save(out_dir, console)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="10^5 records, one repeat")
    parser.add_argument("--records", type=int, help="log size (default 10^6, quick 10^5)")
    parser.add_argument("--repeats", type=int)
    parser.add_argument(
        "--sizes", type=int, nargs="*", help="other log sizes to restore (default 10^5, 2·10^6)"
    )
    parser.add_argument("--out", type=Path, help="results folder (default bench/results)")
    parser.add_argument("--child", nargs=2, metavar=("WHAT", "LOG"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1])))
        return 0
    out = args.out
    if out is None:
        out = Path(tempfile.mkdtemp(prefix="eventlog-bench-quick-")) if args.quick else RESULTS_DIR
    run(quick=args.quick, records=args.records, repeats=args.repeats, out_dir=out, sizes=args.sizes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
