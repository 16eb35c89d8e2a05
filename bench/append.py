"""Append throughput and latency: eventlog beside the raw driver and the eventsourcing library.

The matrix (docs/design.md §9): SQLite with synchronous FULL and NORMAL, PostgreSQL with full
durability; one writer with batches of 1/10/100/1000 events, and 16/64 concurrent appenders
of one event each (threads; also asyncio tasks for eventlog). Every cell runs the same plan
for every implementation, on a fresh store, `repeats` times, implementations interleaved
so that load from other users of the machine falls on all of them alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import sqlite3
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from bench import impls
from bench.common import Results, Sample, machine, remove_database, scratch, summarize, verdict
from bench.impls import Appender
from bench.pg import PgServer, PgUnavailable, pg_server
from bench.workload import Call, batch_plan, count_events, writers_plan
from eventlog import EventLog
from eventlog.log import Durability

BATCHES = (1, 10, 100, 1000)
WRITERS = (16, 64)
ASYNC_WRITERS = (64,)
IMPLS = ("eventlog", "raw", "eventsourcing")
GUARANTEES = ("validation", "id_minting", "chain", "id_index")

# Events per repeat, sized so the full matrix stays within ~5 minutes on 2 cores: cells bound
# by one fsync per commit (~400/s on this machine's disk) get few events, CPU-bound ones more.
_BATCH_EVENTS: dict[tuple[str, int], int] = {
    ("sqlite/full", 1): 500,
    ("sqlite/full", 10): 1500,
    ("sqlite/full", 100): 10_000,
    ("sqlite/full", 1000): 20_000,
    ("sqlite/normal", 1): 2000,
    ("sqlite/normal", 10): 5000,
    ("sqlite/normal", 100): 10_000,
    ("sqlite/normal", 1000): 20_000,
    ("postgresql/full", 1): 500,
    ("postgresql/full", 10): 2000,
    ("postgresql/full", 100): 10_000,
    ("postgresql/full", 1000): 20_000,
}
_CONCURRENT_EVENTS = {"sqlite/full": 1280, "sqlite/normal": 3200, "postgresql/full": 1280}


@dataclass(frozen=True)
class Cell:
    """One figure of the matrix (its implementations are compared on the same plan)."""

    backend: str
    impl: str
    mode: str
    """`batch` (one writer), `threads` or `asyncio` (concurrent single-event appenders)."""
    batch: int
    writers: int
    durability: str


@dataclass(frozen=True)
class Setting:
    backend: str
    durability: Durability
    mode: str
    batch: int
    writers: int

    def events(self, scale: float) -> int:
        key = f"{self.backend}/{self.durability}"
        if self.mode == "batch":
            base = _BATCH_EVENTS[(key, self.batch)]
            return max(self.batch, int(base * scale))
        return max(self.writers, int(_CONCURRENT_EVENTS[key] * scale))

    def impls(self, wanted: Sequence[str]) -> list[str]:
        if self.mode == "asyncio":
            return [i for i in wanted if i == "eventlog"]
        return list(wanted)


def settings(backend: str, durability: Durability) -> list[Setting]:
    out = [Setting(backend, durability, "batch", b, 1) for b in BATCHES]
    out += [Setting(backend, durability, "threads", 1, w) for w in WRITERS]
    out += [Setting(backend, durability, "asyncio", 1, w) for w in ASYNC_WRITERS]
    return out


# -- timing ---------------------------------------------------------------------------------


def run_calls(appender: Appender, calls: Sequence[Call]) -> Sample:
    """One writer, one call after another."""
    latencies: list[int] = []
    clock = time.perf_counter_ns
    cpu = time.process_time()
    start = clock()
    for call in calls:
        t0 = clock()
        appender.append(call)
        latencies.append(clock() - t0)
    elapsed = (clock() - start) / 1e9
    cpu = time.process_time() - cpu
    return Sample(count_events(calls), elapsed, latencies, appender.commits(), cpu)


def run_threads(appender: Appender, plans: Sequence[Sequence[Call]]) -> Sample:
    """One thread per writer, released together; the clock stops when the last one is done."""
    latencies: list[list[int]] = [[] for _ in plans]
    errors: list[BaseException] = []
    gate = threading.Barrier(len(plans) + 1)
    clock = time.perf_counter_ns

    def work(index: int) -> None:
        mine = latencies[index]
        gate.wait()
        try:
            for call in plans[index]:
                t0 = clock()
                appender.append(call)
                mine.append(clock() - t0)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(len(plans))]
    for thread in threads:
        thread.start()
    cpu = time.process_time()
    gate.wait()
    start = clock()
    for thread in threads:
        thread.join()
    elapsed = (clock() - start) / 1e9
    cpu = time.process_time() - cpu
    if errors:
        raise errors[0]
    flat = [value for per_writer in latencies for value in per_writer]
    events = sum(count_events(p) for p in plans)
    return Sample(events, elapsed, flat, appender.commits(), cpu)


def run_asyncio(appender: impls.AsyncAppender, plans: Sequence[Sequence[Call]]) -> Sample:
    """One asyncio task per writer on one event loop, each awaiting its own append."""
    latencies: list[int] = []
    clock = time.perf_counter_ns

    async def work(plan: Sequence[Call]) -> None:
        for call in plan:
            t0 = clock()
            await appender.append_async(call)
            latencies.append(clock() - t0)

    async def main() -> float:
        start = clock()
        await asyncio.gather(*(work(plan) for plan in plans))
        return (clock() - start) / 1e9

    cpu = time.process_time()
    elapsed = asyncio.run(main())
    cpu = time.process_time() - cpu
    events = sum(count_events(p) for p in plans)
    return Sample(events, elapsed, latencies, appender.commits(), cpu)


# -- fresh stores per repeat ----------------------------------------------------------------


class SqliteStores:
    """Fresh SQLite files: eventlog and raw get a copy of one log created at migration head."""

    backend = "sqlite"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.template = workdir / "template.db"
        EventLog.open(self.template).close()
        self._n = 0

    @contextlib.contextmanager
    def appender(self, impl: str, durability: Durability, writers: int) -> Iterator[Appender]:
        self._n += 1
        path = self.workdir / f"{impl}-{self._n}.db"
        if impl != "eventsourcing":
            shutil.copyfile(self.template, path)
        appender: Appender
        if impl == "eventlog":
            appender = impls.EventLogAppender(path, durability)
        elif impl == "raw":
            appender = impls.RawSqliteAppender(path, durability)
        else:
            appender = impls.EventsourcingAppender.sqlite(path, durability, writers)
        try:
            yield appender
        finally:
            appender.close()
        table = "stored_events" if impl == "eventsourcing" else "events"
        with contextlib.closing(sqlite3.connect(path)) as conn:
            self.stored = int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
        remove_database(path)


class PostgresStores:
    """One database; each repeat starts from emptied tables."""

    backend = "postgresql"

    def __init__(self, server: PgServer) -> None:
        import psycopg

        self.server = server
        self.dbname = "bench"
        with psycopg.connect(server.conninfo("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {self.dbname}")
        EventLog.open(server.url(self.dbname)).close()
        self.stored = 0

    def settings(self) -> dict[str, str]:
        import psycopg

        names = ("server_version", "fsync", "synchronous_commit", "wal_sync_method")
        with psycopg.connect(self.server.conninfo(self.dbname)) as conn:
            return {n: str(conn.execute(f"SHOW {n}").fetchone()[0]) for n in names}  # type: ignore[index]

    def _sql(self, statement: str) -> Any:
        import psycopg

        with psycopg.connect(self.server.conninfo(self.dbname), autocommit=True) as conn:
            cursor = conn.execute(statement)
            return cursor.fetchone() if cursor.description else None

    @contextlib.contextmanager
    def appender(self, impl: str, durability: Durability, writers: int) -> Iterator[Appender]:
        table = "stored_events" if impl == "eventsourcing" else "events"
        if impl == "eventsourcing":
            self._sql("DROP TABLE IF EXISTS stored_events")
        else:
            # The log's append-only trigger refuses TRUNCATE; a superuser's replica role
            # skips triggers for this one transaction, so every repeat starts empty.
            self._sql(
                "BEGIN; SET LOCAL session_replication_role = replica; TRUNCATE events; COMMIT"
            )
        appender: Appender
        if impl == "eventlog":
            appender = impls.EventLogAppender(self.server.url(self.dbname), durability)
        elif impl == "raw":
            appender = impls.RawPsycopgAppender(self.server.conninfo(self.dbname))
        else:
            s = self.server
            appender = impls.EventsourcingAppender.postgres(
                s.host, s.port, s.user, self.dbname, writers
            )
        try:
            yield appender
        finally:
            appender.close()
        self.stored = int(self._sql(f"SELECT count(*) FROM {table}")[0])


Stores = SqliteStores | PostgresStores


def measure(stores: Stores, impl: str, setting: Setting, plan: Any, expected_events: int) -> Sample:
    """One repeat of one implementation on a fresh store; checks every event was stored."""
    with stores.appender(impl, setting.durability, setting.writers) as appender:
        if setting.mode == "batch":
            sample = run_calls(appender, plan)
        elif setting.mode == "threads":
            sample = run_threads(appender, plan)
        else:
            assert isinstance(appender, impls.EventLogAppender)
            sample = run_asyncio(appender, plan)
    if stores.stored != expected_events:
        raise RuntimeError(
            f"{stores.backend} {impl} {setting}: stored {stores.stored} events, "
            f"expected {expected_events}"
        )
    return sample


# -- the matrix -----------------------------------------------------------------------------


def run_setting(
    stores: Stores,
    setting: Setting,
    *,
    impl_names: Sequence[str],
    repeats: int,
    scale: float,
    on_row: Callable[[dict[str, Any]], None],
) -> list[dict[str, Any]]:
    events = setting.events(scale)
    plan: Any
    if setting.mode == "batch":
        plan = batch_plan(events, setting.batch)
        total = count_events(plan)
    else:
        plan = writers_plan(events, setting.writers)
        total = sum(count_events(p) for p in plan)
    names = setting.impls(impl_names)
    samples: dict[str, list[Sample]] = {name: [] for name in names}
    for _ in range(repeats):
        for name in names:  # interleaved: background load falls on every implementation
            samples[name].append(measure(stores, name, setting, plan, total))
    rows = []
    for name in names:
        cell = Cell(
            stores.backend,
            name,
            setting.mode,
            setting.batch,
            setting.writers,
            setting.durability,
        )
        row = {**asdict(cell), **summarize(samples[name])}
        rows.append(row)
        on_row(row)
    return rows


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """`ratio_vs_raw`: same cell, raw driver. `ratio_vs_one_commit`: eventlog, batch 1, 1 writer."""

    def key(row: dict[str, Any]) -> tuple[Any, ...]:
        return (row["backend"], row["durability"], row["mode"], row["batch"], row["writers"])

    raw = {key(r): r["events_per_s"] for r in rows if r["impl"] == "raw"}
    one = {
        (r["backend"], r["durability"]): r["events_per_s"]
        for r in rows
        if r["impl"] == "eventlog" and r["mode"] == "batch" and r["batch"] == 1
    }
    for row in rows:
        base = raw.get(key(row)) or raw.get(key({**row, "mode": "threads"}))
        row["ratio_vs_raw"] = round(row["events_per_s"] / base, 3) if base else None
        single = one.get((row["backend"], row["durability"]))
        row["ratio_vs_one_commit"] = round(row["events_per_s"] / single, 2) if single else None


def _find(rows: Sequence[dict[str, Any]], **where: Any) -> dict[str, Any] | None:
    for row in rows:
        if all(row.get(k) == v for k, v in where.items()):
            return row
    return None


def evaluate_targets(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 11's targets, each a ratio of two medians from this run at the same durability.

    - every cell: eventlog ≥ 1.0× eventsourcing doing the same plan (asyncio tasks against
      the library's 64 threads, its way of running 64 concurrent appenders);
    - one event per call and batch 1000: eventlog ≥ 0.8× the raw driver;
    - SQLite FULL: 64 asyncio appenders ≥ 10× eventlog's one commit per event.

    Beside the deciding wall-clock ratio: `paired` (min..max of the per-repeat ratios; the
    implementations of a repeat ran seconds apart, so load drift cancels) and `cpu_ratio`
    (baseline CPU per event / eventlog CPU per event: what each costs, whatever fsync did).
    """
    targets: list[dict[str, Any]] = []

    Row = dict[str, Any]

    def target(name: str, num: Row | None, den: Row | None, need: float) -> None:
        entry: dict[str, Any] = {"target": name, "need": need, "status": "SKIP", "ratio": None}
        targets.append(entry)
        if num is None or den is None or not den["events_per_s"]:
            return
        ratio = num["events_per_s"] / den["events_per_s"]
        paired = [
            a / b for a, b in zip(num["events_per_s_each"], den["events_per_s_each"], strict=False)
        ]
        entry.update(
            status="PASS" if ratio >= need else "MISS",
            ratio=round(ratio, 3),
            paired_min=round(min(paired), 3),
            paired_max=round(max(paired), 3),
            cpu_ratio=round(den["cpu_us_per_event"] / num["cpu_us_per_event"], 3)
            if num["cpu_us_per_event"]
            else None,
            against=f"{den['impl']} {den['mode']} batch {den['batch']} writers {den['writers']}",
        )

    cells = sorted(
        {
            (r["backend"], r["durability"], r["mode"], r["batch"], r["writers"])
            for r in rows
            if r["impl"] == "eventlog"
        },
        key=lambda c: (c[0] != "sqlite", c[1], c[2] != "batch", c[2], c[3], c[4]),
    )
    for backend, durability, mode, batch, writers in cells:
        where = {"backend": backend, "durability": durability, "batch": batch, "writers": writers}
        label = f"{backend} {durability}: {mode} batch {batch} writers {writers}"
        peer_mode = "threads" if mode == "asyncio" else mode
        target(
            f"{label}: eventlog vs eventsourcing",
            _find(rows, impl="eventlog", mode=mode, **where),
            _find(rows, impl="eventsourcing", mode=peer_mode, **where),
            1.0,
        )
        if mode == "batch" and batch in (1, 1000):
            target(
                f"{label}: eventlog vs the raw driver",
                _find(rows, impl="eventlog", mode=mode, **where),
                _find(rows, impl="raw", mode=mode, **where),
                0.8,
            )
    sqlite_full = {"backend": "sqlite", "durability": "full"}
    target(
        "sqlite full: 64 asyncio appenders vs one commit per event",
        _find(rows, impl="eventlog", mode="asyncio", writers=64, **sqlite_full),
        _find(rows, impl="eventlog", mode="batch", batch=1, **sqlite_full),
        10.0,
    )
    return targets


def guarantee_costs(
    workdir: Path | None = None, events: int = 20_000, repeats: int = 5
) -> dict[str, Any]:
    """CPU per event of each guarantee's own work, measured alone on the batch plan's events
    (median of `repeats` passes), beside what the whole append costs: the validating decode
    of every encoded event, minting its id, and its link of the hash chain; with a workdir,
    also the unique index on event ids (`id_index_cost`). Expected versions and idempotent
    ids also cost lookups per request and per batch, not per event; they show in the
    difference between eventlog and raw in the matrix."""
    from eventlog import chain
    from eventlog.ids import mint_event_ids

    calls = batch_plan(events, 1000)
    flat = [event for call in calls for request in call for event in request.events]
    encode = msgspec.msgpack.Encoder().encode  # the encoding alone, which raw does too
    payloads = [encode(event) for event in flat]
    by_type = {cls: msgspec.msgpack.Decoder(cls) for cls in {type(event) for event in flat}}
    decoders = [by_type[type(event)] for event in flat]  # what codec.encode decodes with
    link = chain.link_fields
    fields = [
        (seq, "group/x", seq, bytes(16), "BenchSiblingSealed", 1, 1, payload)
        for seq, payload in enumerate(payloads, 1)
    ]

    def validate() -> None:
        for decoder, payload in zip(decoders, payloads, strict=True):
            decoder.decode(payload)

    def mint() -> None:
        for call in calls:  # the writer mints a transaction's ids in one go
            mint_event_ids(sum(len(request.events) for request in call))

    def hash_chain() -> None:
        previous = bytes(32)
        for each in fields:
            previous = link(previous, each)

    out: dict[str, Any] = {"events": len(flat)}
    for name, work in (("validation", validate), ("id_minting", mint), ("chain", hash_chain)):
        samples = []
        for _ in range(repeats):
            started = time.process_time()
            work()
            samples.append((time.process_time() - started) / len(flat) * 1e6)
        out[f"{name}_cpu_us_per_event"] = round(sorted(samples)[len(samples) // 2], 3)
    if workdir is not None:
        out["id_index_cpu_us_per_event"] = id_index_cost(workdir, calls, repeats)
    return out


def id_index_cost(workdir: Path, calls: Sequence[Call], repeats: int) -> float:
    """What the unique index on event ids (idempotent ids, a guarantee eventsourcing's table
    does without) costs a row: the raw driver's CPU per event writing the same batches
    (SQLite NORMAL) into eventlog's table with the index and with it dropped, paired
    passes, the median difference. The raw driver rather than eventlog: eventlog checks
    placed ids through that index, so it cannot run without it."""
    template = workdir / "id-index-template.db"
    EventLog.open(template).close()
    events = sum(len(request.events) for call in calls for request in call)
    differences = []
    for n in range(repeats):
        cpu: dict[bool, float] = {}
        for indexed in (True, False) if n % 2 == 0 else (False, True):
            path = workdir / f"id-index-{indexed}.db"
            shutil.copyfile(template, path)
            if not indexed:
                with contextlib.closing(sqlite3.connect(path)) as conn:
                    _drop_id_index(conn)
            appender = impls.RawSqliteAppender(path, "normal")
            started = time.process_time()
            for call in calls:
                appender.append(call)
            cpu[indexed] = (time.process_time() - started) / events * 1e6
            appender.close()
            remove_database(path)
        differences.append(cpu[True] - cpu[False])
    template.unlink()
    return round(sorted(differences)[len(differences) // 2], 3)


def _drop_id_index(conn: sqlite3.Connection) -> None:
    """Rebuild eventlog's table without its unique constraint on event ids: SQLite cannot
    drop a table constraint's index, so the table is made again from its own DDL."""
    (ddl,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'events'").fetchone()
    without = re.sub(r",\s*CONSTRAINT uq_events_event_id UNIQUE \(event_id\)", "", ddl)
    if without == ddl:
        raise RuntimeError(f"no unique constraint uq_events_event_id in {ddl!r}")
    with conn:
        conn.execute("DROP TABLE events")  # empty: the template was made a moment ago
        conn.execute(without)


def add_guarantee_shares(costs: dict[str, Any], rows: Sequence[dict[str, Any]]) -> None:
    """Each guarantee's CPU per event as a share of eventlog's own CPU per event at batch 1000
    (SQLite NORMAL, where fsync is not in the way)."""
    row = _find(
        rows, impl="eventlog", backend="sqlite", durability="normal", mode="batch", batch=1000
    )
    if row is None or not row["cpu_us_per_event"]:
        return
    costs["eventlog_cpu_us_per_event"] = row["cpu_us_per_event"]
    for name in GUARANTEES:
        if f"{name}_cpu_us_per_event" in costs:
            share = costs[f"{name}_cpu_us_per_event"] / row["cpu_us_per_event"]
            costs[f"{name}_share"] = round(share, 3)


def read_cells(stores: Stores, repeats: int, events: int) -> list[dict[str, Any]]:
    """`EventLog.read` (decode included) beside the raw driver's scan of the same rows plus a
    msgspec decode of each payload: the log written once by eventlog (batch 1000)."""
    from bench.impls import raw_read_decode

    setting = Setting(stores.backend, "normal", "batch", 1000, 1)
    plan = batch_plan(events, 1000)
    with stores.appender("eventlog", setting.durability, 1) as appender:
        assert isinstance(appender, impls.EventLogAppender)
        for call in plan:
            appender.append(call)
        target = appender.target
        rates: dict[str, list[float]] = {"eventlog": [], "raw": []}
        for _ in range(repeats):
            for impl in ("eventlog", "raw"):
                started = time.perf_counter()
                if impl == "eventlog":
                    count = sum(1 for _ in appender.log.read())
                else:
                    count = raw_read_decode(target)
                rates[impl].append(count / (time.perf_counter() - started))
                if count != events:
                    raise RuntimeError(f"{stores.backend} read {impl}: {count} of {events}")
    rows = []
    for impl, each in rates.items():
        rows.append(
            {
                "backend": stores.backend,
                "impl": impl,
                "records": events,
                "records_per_s": round(statistics.median(each), 1),
                "records_per_s_min": round(min(each), 1),
                "records_per_s_max": round(max(each), 1),
                "records_per_s_each": [round(v, 1) for v in each],
            }
        )
    return rows


def read_targets(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    targets = []
    for backend in sorted({r["backend"] for r in rows}):
        ours = next(r for r in rows if r["backend"] == backend and r["impl"] == "eventlog")
        raw = next(r for r in rows if r["backend"] == backend and r["impl"] == "raw")
        ratio = ours["records_per_s"] / raw["records_per_s"]
        paired = [
            a / b
            for a, b in zip(ours["records_per_s_each"], raw["records_per_s_each"], strict=True)
        ]
        name = f"{backend}: EventLog.read (decoded) vs raw driver scan + msgspec decode"
        targets.append(
            verdict(name, ratio, 0.5, paired) | {"cpu_ratio": None, "against": "raw read + decode"}
        )
    return targets


# -- output ---------------------------------------------------------------------------------


def table(rows: Sequence[dict[str, Any]]) -> Table:
    out = Table(title="append throughput (median of repeats; spread = min–max)")
    for name, justify in (
        ("backend", "left"),
        ("impl", "left"),
        ("mode", "left"),
        ("batch", "right"),
        ("writers", "right"),
        ("durability", "left"),
        ("events/s", "right"),
        ("spread", "right"),
        ("p50 ms", "right"),
        ("p99 ms", "right"),
        ("ev/commit", "right"),
        ("CPU µs/ev", "right"),
        ("× raw", "right"),
        ("× 1/commit", "right"),
    ):
        out.add_column(name, justify=justify)  # type: ignore[arg-type]

    def fmt(value: float | None, digits: int = 2) -> str:
        return "—" if value is None else f"{value:,.{digits}f}"

    for r in rows:
        out.add_row(
            r["backend"],
            r["impl"],
            r["mode"],
            str(r["batch"]),
            str(r["writers"]),
            r["durability"],
            f"{r['events_per_s']:,.0f}",
            f"{r['events_per_s_min']:,.0f}–{r['events_per_s_max']:,.0f}",
            fmt(r["p50_ms"], 3),
            fmt(r["p99_ms"], 3),
            fmt(r["events_per_commit"], 1),
            fmt(r["cpu_us_per_event"], 1),
            fmt(r.get("ratio_vs_raw")),
            fmt(r.get("ratio_vs_one_commit")),
        )
    return out


def print_targets(console: Console, targets: Sequence[dict[str, Any]]) -> None:
    for t in targets:
        style = {"PASS": "green", "MISS": "bold red"}.get(t["status"], "yellow")
        if t["ratio"] is None:
            detail = "n/a (cells not run)"
        else:
            cpu = "n/a" if t["cpu_ratio"] is None else f"{t['cpu_ratio']:.2f}×"
            detail = (
                f"{t['ratio']:.2f}× (need ≥ {t['need']}×; per repeat "
                f"{t['paired_min']:.2f}–{t['paired_max']:.2f}×; CPU per event {cpu})"
            )
        console.print(f"[{style}]{t['status']}[/] {t['target']}: {detail}", highlight=False)


def run(
    *,
    quick: bool = False,
    repeats: int | None = None,
    scale: float | None = None,
    backends: Sequence[str] = ("sqlite", "postgresql"),
    durabilities: Sequence[Durability] = ("full", "normal"),
    impl_names: Sequence[str] = IMPLS,
    out_dir: Path | None = None,
    workdir: Path | None = None,
    console: Console | None = None,
) -> Results:
    """Run the append matrix, print the table and targets, write <out_dir>/append.json."""
    console = console or Console()
    repeats = repeats if repeats is not None else (1 if quick else 3)
    scale = scale if scale is not None else (0.15 if quick else 1.0)
    with scratch(workdir, "eventlog-bench-") as work:
        results = Results("append", machine(work, {"repeats": repeats, "scale": scale}))
        rows: list[dict[str, Any]] = []

        def on_row(row: dict[str, Any]) -> None:
            console.print(
                f"  {row['backend']:<10} {row['durability']:<6} {row['mode']:<7} "
                f"batch {row['batch']:>4} writers {row['writers']:>2} {row['impl']:<13} "
                f"{row['events_per_s']:>10,.0f} ev/s  p99 {row['p99_ms']:.2f} ms",
                highlight=False,
            )

        read_rows: list[dict[str, Any]] = []

        def sweep(stores: Stores, backend_durabilities: Sequence[Durability]) -> None:
            for durability in backend_durabilities:
                for setting in settings(stores.backend, durability):
                    rows.extend(
                        run_setting(
                            stores,
                            setting,
                            impl_names=impl_names,
                            repeats=repeats,
                            scale=scale,
                            on_row=on_row,
                        )
                    )
            for row in read_cells(stores, repeats, max(1000, int(50_000 * scale))):
                console.print(
                    f"  {row['backend']:<10} read (decoded)  {row['impl']:<13} "
                    f"{row['records_per_s']:>10,.0f} records/s",
                    highlight=False,
                )
                read_rows.append(row)

        if "sqlite" in backends:
            console.print(f"[bold]SQLite[/] ({work}, {results.header['workdir_filesystem']})")
            sweep(SqliteStores(work), durabilities)
        if "postgresql" in backends:
            try:
                with pg_server() as server:
                    stores = PostgresStores(server)
                    results.header["postgresql"] = stores.settings()
                    console.print(f"[bold]PostgreSQL[/] {results.header['postgresql']}")
                    sweep(stores, [d for d in durabilities if d == "full"])
            except PgUnavailable as exc:
                reason = f"PostgreSQL rows skipped: {exc}"
                results.header["postgresql"] = {"skipped": reason}
                console.print(f"[yellow]{reason}[/]")
        costs = guarantee_costs(work if "sqlite" in backends else None)
    add_ratios(rows)
    add_guarantee_shares(costs, rows)
    results.header["guarantee_costs"] = costs
    results.header["reads"] = read_rows
    results.rows = rows
    results.targets = evaluate_targets(rows) + read_targets(read_rows)
    console.print(table(rows))
    console.print(
        "guarantees, CPU µs per event (share of eventlog's batch-1000 CPU per event): "
        + ", ".join(
            f"{name} {costs[f'{name}_cpu_us_per_event']:.2f}"
            + (f" ({costs[f'{name}_share']:.0%})" if f"{name}_share" in costs else "")
            for name in GUARANTEES
            if f"{name}_cpu_us_per_event" in costs
        ),
        highlight=False,
    )
    print_targets(console, results.targets)
    results.save(out_dir, console)
    return results
