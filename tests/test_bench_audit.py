"""The audit benchmark's smoke run: every audit command timed and measured at both log sizes."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import resource
from collections.abc import Sequence
from pathlib import Path

import pytest
from rich.console import Console

from bench import audit
from bench.__main__ import BENCHMARKS
from bench.runlog import run_log


def test_quick_audit_benchmark_times_every_command_at_both_sizes(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    logs = [run_log(n, cache_dir=cache)[0] for n in (6000, 3000)]
    before = [hashlib.sha256(log.path.read_bytes()).hexdigest() for log in logs]
    out = tmp_path / "out"
    output = io.StringIO()
    results = audit.run(
        quick=True,
        sizes=[3000, 6000],
        out_dir=out,
        workdir=tmp_path / "work",
        cache_dir=cache,
        console=Console(file=output, width=200),
    )
    rows = json.loads((out / "audit.json").read_text())
    assert rows == results.rows
    commands = [
        *("replay --json", "replay --json --jobs 1", "inspect group", "state --at", "stats"),
        *("export", "export --jobs 1", "report", "report --jobs 1"),
    ]
    assert [(r["records"], r["command"]) for r in rows] == [
        (log.records, command) for log in logs for command in commands
    ]
    for row in rows:
        assert row["seconds"] > 0 and row["records_per_s"] > 0 and row["maxrss_mb"] > 0
        assert len(row["seconds_each"]) == len(row["maxrss_mb_each"]) == 1
        assert row["cpu_s"] > 0 and len(row["cpu_s_each"]) == 1
    # each child's own peak memory, not this (larger) process's, which a fork would carry in
    ours_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert rows[0]["maxrss_mb"] < 0.9 * ours_mb
    assert (tmp_path / "work" / "out-6000" / "run.html").stat().st_size > 0
    names = [t["target"] for t in results.targets]
    assert len(names) == 2 * len(commands)
    for command in commands:
        replay = command.startswith("replay --json")
        speed = f"{command} records/s" if replay else f"{command} seconds"
        assert sum(name.startswith((speed, f"{command} peak RSS")) for name in names) == 2
    assert {t["status"] for t in results.targets} <= {"PASS", "MISS"}
    assert "replay --json records/s" in output.getvalue()
    assert [hashlib.sha256(log.path.read_bytes()).hexdigest() for log in logs] == before
    assert BENCHMARKS["audit"] is audit.run


def test_the_project_s_bytecode_is_cached_before_any_command_is_timed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installed package has its bytecode compiled; an editable checkout run with
    PYTHONDONTWRITEBYTECODE set would compile every module in every timed child instead."""
    for package in audit.PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "module.py").write_text("VALUE = 1\n")
    monkeypatch.setattr(audit, "REPO", tmp_path)
    assert audit.cache_bytecode()
    for package in audit.PACKAGES:
        source = tmp_path / package / "module.py"
        assert Path(importlib.util.cache_from_source(str(source))).is_file()

    order: list[str] = []

    def cache() -> bool:
        order.append("cache")
        return False

    monkeypatch.setattr(audit, "cache_bytecode", cache)

    def timed(argv: Sequence[str]) -> audit.Timed:
        order.append("timed")
        return audit.Timed(1.0, 1.0, 1.0)

    monkeypatch.setattr(audit, "timed_child", timed)
    monkeypatch.setattr(audit, "middle_group", lambda path, records: "g")
    output = io.StringIO()
    audit.run(
        quick=True,
        sizes=[3000],
        out_dir=tmp_path / "out",
        workdir=tmp_path / "work",
        cache_dir=tmp_path / "cache",
        console=Console(file=output, width=200),
    )
    assert order[0] == "cache" and order.count("cache") == 1 and "timed" in order
    assert "bytecode could not be cached" in output.getvalue()
