"""The fencing benchmark's smoke run: every cell, both kinds of block in ABAB rounds, the
A-vs-A noise floor and the ledger beside them, and a verdict that follows from them."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import ModuleType

import pytest
from rich.console import Console

from bench import cleanup, fencing


@pytest.mark.parametrize(
    ("bench", "labels", "title"),
    [
        (fencing, ("U", "F"), "fencing: cost per command"),
        (cleanup, cleanup.LABELS, "cleanup: cost per finalize command"),
    ],
    ids=["fencing", "cleanup"],
)
def test_quick_ab_benchmark_compares_commands_with_and_without_what_it_measures(
    tmp_path: Path, bench: ModuleType, labels: tuple[str, str], title: str
) -> None:
    out = tmp_path / "out"
    output = io.StringIO()
    results = bench.run(
        quick=True,
        repeats=2,
        scale=0.2,
        backends=["sqlite"],
        out_dir=out,
        workdir=tmp_path / "work",
        console=Console(file=output, width=200),
    )
    rows = json.loads((out / f"{bench.__name__.split('.')[-1]}.json").read_text())
    assert rows == results.rows
    assert [(r["backend"], r["durability"]) for r in rows] == [
        ("sqlite", "full"),
        ("sqlite", "normal"),
    ]
    a, b = labels
    for row in rows:
        assert row["rounds"] == 2
        # ABAB, the opening alternating per round: A B A B, then B A B A
        assert [list(blocks) for blocks in row["blocks_us"]] == [
            [a, b, a + "2", b + "2"],
            [b, a, b + "2", a + "2"],
        ]
        assert all(v > 0 for blocks in row["blocks_us"] for v in blocks.values())
        assert len(row["delta_each_us"]) == len(row["aa_each_us"]) == 2
        assert row["noise_floor_us"] >= 0 and row["ledger_us_per_command"] > 0
    for row, target in zip(rows, results.targets, strict=True):
        allowed = max(row["noise_floor_us"], fencing.THRESHOLD * row["ledger_us_per_command"])
        assert target["status"] == ("PASS" if row["delta_us"] <= allowed else "MISS")
    assert title in output.getvalue()
    assert "A-vs-A" in output.getvalue()


def test_the_difference_is_the_effect_and_a_steady_drift_cancels_over_two_rounds() -> None:
    """Blocks with a fixed fencing cost `e` on a machine drifting by `d` per block: the two
    openings give e + d and e - d, and the A-vs-A contrast sees neither."""
    e, d = 7.0, 3.0
    rounds = [
        {"U": 0.0, "F": e + d, "U2": 2 * d, "F2": e + 3 * d},  # U F U F
        {"F": 4 * d + e, "U": 5 * d, "F2": 6 * d + e, "U2": 7 * d},  # F U F U
    ]
    deltas, aa = fencing.contrasts(rounds)
    assert deltas == [e + d, e - d]
    assert aa == [0.0, 0.0]


def _row(delta_us: float, noise_us: float, ledger_us: float = 1000.0) -> dict[str, object]:
    return {
        "backend": "sqlite",
        "durability": "normal",
        "delta_us": delta_us,
        "noise_floor_us": noise_us,
        "ledger_us_per_command": ledger_us,
        "command_ratio": round(1 + delta_us / ledger_us, 4),
        "command_ratio_each": [1 + delta_us / ledger_us],
    }


def test_fencing_passes_only_within_the_noise_floor_or_below_one_percent_of_a_command() -> None:
    within_noise = fencing.cell_target(_row(delta_us=30.0, noise_us=40.0))
    below_threshold = fencing.cell_target(_row(delta_us=9.0, noise_us=2.0))
    above_both = fencing.cell_target(_row(delta_us=11.0, noise_us=4.8))
    assert (within_noise["status"], below_threshold["status"], above_both["status"]) == (
        "PASS",
        "PASS",
        "MISS",
    )
    assert "within the A-vs-A noise floor" in within_noise["target"]
    assert "above the noise floor and 1 % of a command" in above_both["target"]
