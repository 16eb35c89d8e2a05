"""The fencing benchmark's smoke run: every cell, both kinds of block in ABAB rounds, the
A-vs-A noise floor and the ledger beside them, and a verdict that follows from them."""

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
        assert row["rounds"] == 2
        # ABAB, the opening alternating per round: U F U F, then F U F U
        assert [list(b) for b in row["blocks_us"]] == [
            ["U", "F", "U2", "F2"],
            ["F", "U", "F2", "U2"],
        ]
        assert all(v > 0 for b in row["blocks_us"] for v in b.values())
        assert len(row["delta_each_us"]) == len(row["aa_each_us"]) == 2
        assert row["noise_floor_us"] >= 0 and row["ledger_us_per_command"] > 0
    for row, target in zip(rows, results.targets, strict=True):
        allowed = max(row["noise_floor_us"], fencing.THRESHOLD * row["ledger_us_per_command"])
        assert target["status"] == ("PASS" if row["delta_us"] <= allowed else "MISS")
    assert "fencing: cost per command" in output.getvalue()
    assert "A-vs-A" in output.getvalue()
