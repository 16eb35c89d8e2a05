"""`python -m bench [NAME] [--quick]`: run the benchmarks and rewrite bench/results/*.json.

Without a name every benchmark runs. `--quick` is a smoke run (small counts, one repeat)
that writes to a temporary folder unless `--out` says otherwise, so it never replaces the
published figures.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from bench import append, replay, rollout
from bench.common import RESULTS_DIR

Benchmark = Callable[..., Any]

BENCHMARKS: dict[str, Benchmark] = {
    "append": append.run,
    "replay": replay.run,
    "rollout": rollout.run,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("name", nargs="?", choices=sorted(BENCHMARKS), help="one benchmark")
    parser.add_argument("--quick", action="store_true", help="small counts, one repeat")
    parser.add_argument("--repeats", type=int, help="repeats per cell (default 3, quick 1)")
    parser.add_argument("--scale", type=float, help="multiply every event count")
    parser.add_argument(
        "--backend", action="append", choices=["sqlite", "postgresql"], help="repeatable"
    )
    parser.add_argument("--out", type=Path, help="results folder (default bench/results)")
    parser.add_argument("--workdir", type=Path, help="where the databases go (default a temp dir)")
    args = parser.parse_args(argv)

    console = Console()
    if not console.is_terminal:  # piped to a file or CI log: keep the table's columns whole
        console = Console(width=170)
    out = args.out
    if out is None:
        out = Path(tempfile.mkdtemp(prefix="eventlog-bench-quick-")) if args.quick else RESULTS_DIR
    names = [args.name] if args.name else list(BENCHMARKS)
    options: dict[str, Any] = {"quick": args.quick, "out_dir": out, "console": console}
    if args.repeats is not None:
        options["repeats"] = args.repeats
    if args.scale is not None:
        options["scale"] = args.scale
    if args.backend:
        options["backends"] = args.backend
    if args.workdir is not None:
        options["workdir"] = args.workdir
    for name in names:
        console.rule(f"bench {name}")
        BENCHMARKS[name](**options)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
