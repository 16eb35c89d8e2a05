"""The fencing benchmark's smoke run: every cell, both paths, the ledger beside them."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from bench import fencing


def test_quick_fencing_benchmark_compares_fenced_and_unfenced_commands(tmp_path: Path) -> None:
    out = tmp_path / "out"
    output = io.StringIO()
    results = fencing.run(
        quick=True,
        repeats=2,
        scale=0.2,
        backends=["sqlite"],
        out_dir=out,
        workdir=tmp_path / "work",
        console=Console(file=output, width=200),
    )
    rows = json.loads((out / "fencing.json").read_text())
    assert rows == results.rows
    assert [(r["backend"], r["durability"]) for r in rows] == [
        ("sqlite", "full"),
        ("sqlite", "normal"),
    ]
    for row in rows:
        assert len(row["fenced_each_us"]) == len(row["unfenced_each_us"]) == 2
        assert row["fenced_us_per_command"] > 0 and row["unfenced_us_per_command"] > 0
        assert row["ledger_us_per_command"] > 0
    assert {t["status"] for t in results.targets} <= {"PASS", "MISS"}
    assert "fencing: cost per command" in output.getvalue()
    assert all(r["command_ratio"] > 0 for r in rows)
