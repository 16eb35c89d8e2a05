"""The eventsourcing application benchmark runs and compares like with like (bench/esapp.py)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from bench import esapp


def test_quick_esapp_benchmark_writes_a_ratio_for_every_phase(tmp_path: Path) -> None:
    out = tmp_path / "out"
    esapp.run(
        quick=True,
        scale=0.03,
        backends=["sqlite"],
        out_dir=out,
        workdir=tmp_path / "work",
        console=Console(file=open(tmp_path / "console.txt", "w")),  # noqa: SIM115
    )
    rows = json.loads((out / "esapp.json").read_text())
    cells = {(r["impl"], r["phase"]) for r in rows}
    assert cells == {
        (impl, phase) for impl in ("eventlog", "eventsourcing") for phase in esapp.PHASES
    }
    for row in rows:
        assert row["ops_per_s"] > 0
        assert ("vs_eventsourcing" in row) == (row["impl"] == "eventlog")
    header = json.loads((out / "esapp.machine.json").read_text())
    assert header["eventsourcing"] and header["accounts"] >= 2
