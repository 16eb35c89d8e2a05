"""What every benchmark shares: timing samples, medians and spread, the machine, the output."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console, JustifyMethod
from rich.table import Table

RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass
class Sample:
    """One timed repeat of one cell."""

    events: int
    seconds: float
    latencies_ns: list[int]
    """Wall time of every append call, as its caller saw it."""
    commits: int | None = None
    cpu_seconds: float = 0.0
    """CPU time of this process (all its threads) during the repeat: steadier than wall time
    on a shared machine, and it shows what an implementation costs beside waiting for fsync."""

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def percentile_ms(self, q: float) -> float:
        return percentile(self.latencies_ns, q) / 1e6


def remove_database(path: Path | str) -> None:
    """An SQLite file and its WAL files."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def percentile(values: Sequence[int], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return float(ordered[rank - 1])


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(samples: Sequence[Sample]) -> dict[str, Any]:
    """Median of the repeats for each figure, with min and max as the spread."""
    rate = spread([s.events_per_s for s in samples])
    p50 = spread([s.percentile_ms(50) for s in samples])
    p99 = spread([s.percentile_ms(99) for s in samples])
    per_commit = [s.events / s.commits for s in samples if s.commits]
    cpu = spread([s.cpu_seconds / s.events * 1e6 for s in samples])
    return {
        "events_per_s": round(rate["median"], 1),
        "events_per_s_min": round(rate["min"], 1),
        "events_per_s_max": round(rate["max"], 1),
        "p50_ms": round(p50["median"], 4),
        "p50_ms_min": round(p50["min"], 4),
        "p50_ms_max": round(p50["max"], 4),
        "p99_ms": round(p99["median"], 4),
        "p99_ms_min": round(p99["min"], 4),
        "p99_ms_max": round(p99["max"], 4),
        "cpu_us_per_event": round(cpu["median"], 2),
        "cpu_us_per_event_min": round(cpu["min"], 2),
        "cpu_us_per_event_max": round(cpu["max"], 2),
        "events_per_s_each": [round(s.events_per_s, 1) for s in samples],
        "cpu_us_per_event_each": [round(s.cpu_seconds / s.events * 1e6, 2) for s in samples],
        "events": samples[0].events,
        "repeats": len(samples),
        "events_per_commit": round(statistics.median(per_commit), 2) if per_commit else None,
    }


def filesystem_of(path: Path) -> str:
    """The mount's filesystem type (fsync on tmpfs is free, so it matters)."""
    best, kind = "", "unknown"
    target = str(path.resolve())
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    for line in mounts:
        parts = line.split()
        if len(parts) >= 3 and target.startswith(parts[1]) and len(parts[1]) > len(best):
            best, kind = parts[1], parts[2]
    return kind


def machine(workdir: Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The header every result file carries: hardware, versions, fsync setup, load."""
    import msgspec
    import sqlalchemy

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "sqlite_version": sqlite3.sqlite_version,
        "sqlalchemy": sqlalchemy.__version__,
        "msgspec": msgspec.__version__,
        "sqlite_journal_mode": "WAL",
        "fsync": "sqlite synchronous=FULL (fsync per commit) or NORMAL (fsync at checkpoint)",
        "workdir": str(workdir),
        "workdir_filesystem": filesystem_of(workdir),
        "load_average_start": list(os.getloadavg()),
    }
    for dist in ("psycopg", "eventsourcing"):
        try:
            info[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            info[dist] = None
    info.update(extra or {})
    return info


@contextmanager
def scratch(workdir: Path | None, prefix: str) -> Iterator[Path]:
    """The caller's workdir (kept), or a temporary one removed when the run ends."""
    made = workdir is None
    work = Path(tempfile.mkdtemp(prefix=prefix)) if workdir is None else workdir
    work.mkdir(parents=True, exist_ok=True)
    try:
        yield work
    finally:
        if made:
            shutil.rmtree(work, ignore_errors=True)


def print_targets(console: Console, targets: Sequence[dict[str, Any]], fmt: str) -> None:
    """Each target's verdict line: its ratio and the per-repeat range, in `fmt`."""
    for t in targets:
        style = "green" if t["status"] == "PASS" else "bold red"
        need = f"{'≤' if t.get('at_most') else '≥'} {t['need']:,}"
        console.print(
            f"[{style}]{t['status']}[/] {t['target']}: {t['ratio']:{fmt}} (need {need}; "
            f"per repeat {t['paired_min']:{fmt}}–{t['paired_max']:{fmt}})",
            highlight=False,
        )


@dataclass
class Results:
    """Rows plus header, written as <name>.json (rows) and <name>.machine.json (header)."""

    name: str
    header: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    targets: list[dict[str, Any]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def write(self, out_dir: Path) -> list[Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.header["load_average_end"] = list(os.getloadavg())
        self.header["wall_s"] = round(time.monotonic() - self.started, 1)
        self.header["targets"] = self.targets
        rows_path = out_dir / f"{self.name}.json"
        header_path = out_dir / f"{self.name}.machine.json"
        rows_path.write_text(json.dumps(self.rows, indent=1) + "\n")
        header_path.write_text(json.dumps(self.header, indent=1) + "\n")
        return [rows_path, header_path]

    def save(self, out_dir: Path | None, console: Console) -> None:
        """Write the results (unless `out_dir` is None: a run that keeps nothing) and say where."""
        if out_dir is not None:
            for path in self.write(out_dir):
                console.print(f"wrote {path}")


def column_table(
    title: str,
    columns: Sequence[str],
    *,
    left: Collection[str],
    title_justify: JustifyMethod = "left",
) -> Table:
    """A table whose `left` columns (names, labels) are left-justified and the figures right."""
    out = Table(title=title, title_justify=title_justify)
    for name in columns:
        out.add_column(name, justify="left" if name in left else "right")
    return out


def verdict(
    name: str, ratio: float, need: float, paired: Sequence[float], *, at_most: bool = False
) -> dict[str, Any]:
    """One PASS/MISS verdict: the ratio of medians against `need`, with the paired ratios' range."""
    passed = ratio <= need if at_most else ratio >= need
    return {
        "target": name,
        "need": need,
        "at_most": at_most,
        "status": "PASS" if passed else "MISS",
        "ratio": round(ratio, 3),
        "paired_min": round(min(paired), 3),
        "paired_max": round(max(paired), 3),
    }
