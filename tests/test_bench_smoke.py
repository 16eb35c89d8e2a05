"""The append benchmark's machinery runs end to end and writes the figures people read.

No timing is asserted: only that every cell produced a complete, positive row and a header.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from bench import append

REQUIRED = ("backend", "impl", "batch", "writers", "durability", "events_per_s", "p50_ms", "p99_ms")


def test_quick_append_benchmark_writes_every_cell_with_required_keys(tmp_path: Path) -> None:
    out = tmp_path / "results"
    output = io.StringIO()
    results = append.run(
        quick=True,
        repeats=1,
        scale=0.005,
        backends=("sqlite",),
        durabilities=("full",),
        out_dir=out,
        workdir=tmp_path / "work",
        console=Console(file=output, width=200),
    )

    rows = json.loads((out / "append.json").read_text())
    header = json.loads((out / "append.machine.json").read_text())
    assert rows == results.rows
    cells = {(r["impl"], r["mode"], r["batch"], r["writers"]) for r in rows}
    for batch in append.BATCHES:
        for impl in append.IMPLS:
            assert (impl, "batch", batch, 1) in cells
    for writers in append.WRITERS:
        for impl in append.IMPLS:
            assert (impl, "threads", 1, writers) in cells
    assert ("eventlog", "asyncio", 1, 64) in cells
    for row in rows:
        for key in REQUIRED:
            assert key in row, f"{key} missing from {row}"
        assert row["backend"] == "sqlite" and row["durability"] == "full"
        assert row["events"] > 0
        assert row["events_per_s"] > 0
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["events_per_s_min"] <= row["events_per_s"] <= row["events_per_s_max"]
        assert row["ratio_vs_raw"] is not None and row["ratio_vs_raw"] > 0
    assert header["cpu_count"] >= 1
    assert header["sqlite_version"]
    assert {t["status"] for t in header["targets"]} <= {"PASS", "MISS", "SKIP"}
    for name in append.GUARANTEES:  # each guarantee's cost, the id index's included
        assert f"{name}_cpu_us_per_event" in header["guarantee_costs"]
    assert "append throughput" in output.getvalue()


def test_raw_sqlite_baseline_writes_the_same_rows_eventlog_verifies(tmp_path: Path) -> None:
    """The raw baseline is only fair if it stores what eventlog stores: same chain, same rows."""
    from bench.impls import RawSqliteAppender
    from bench.workload import batch_plan, count_events
    from eventlog import EventLog

    path = tmp_path / "raw.db"
    EventLog.open(path).close()
    plan = batch_plan(300, 100)
    raw = RawSqliteAppender(path, "full")
    for call in plan:
        raw.append(call)
    raw.close()

    with EventLog.open(path) as log:
        report = log.verify()
        first = next(iter(log.read()))
    assert report.ok, report.problems
    assert report.records == count_events(plan)
    assert first.event == plan[0][0].events[0]


def test_the_id_index_cost_is_measured_on_a_table_without_that_index_and_only_it(
    tmp_path: Path,
) -> None:
    """The id index's cost is the raw driver with the index less the raw driver without it:
    the table measured without it must lose that index (a repeated id goes in) and keep
    every other rule (a repeated stream version is still refused)."""
    import sqlite3

    from eventlog import EventLog

    path = tmp_path / "log.db"
    EventLog.open(path).close()
    conn = sqlite3.connect(path)
    append._drop_id_index(conn)
    row = (1, "s", 1, b"i" * 16, "T", 1, 0, b"", b"c" * 32)
    insert = "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    with conn:
        conn.execute(insert, row)
        conn.execute(insert, (2, "s", 2, *row[3:]))  # the same event id, a second time
    try:
        conn.execute(insert, (3, "s", 2, b"j" * 16, *row[4:]))
    except sqlite3.IntegrityError as exc:
        assert "stream" in str(exc) and "version" in str(exc)
    else:
        raise AssertionError("the stream-version rule went with the id index")
    conn.close()
