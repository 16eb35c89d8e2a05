"""`python -m bench [NAME] [--quick]`: run the benchmarks and rewrite bench/results/*.json.

Without a name every benchmark runs. `--quick` is a smoke run (small counts, one repeat)
that writes to a temporary folder unless `--out` says otherwise, so it never replaces the
published figures.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from bench import append, audit, cleanup, esapp, fencing, replay, rollout, scale
from bench.common import RESULTS_DIR

Benchmark = Callable[..., Any]

BENCHMARKS: dict[str, Benchmark] = {
    "append": append.run,
    "audit": audit.run,
    "cleanup": cleanup.run,
    "esapp": esapp.run,
    "fencing": fencing.run,
    "replay": replay.run,
    "rollout": rollout.run,
    "scale": scale.run,
}


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, help=__doc__)
@click.argument("name", required=False, type=click.Choice(sorted(BENCHMARKS)))
@click.option("--quick", is_flag=True, help="small counts, one repeat")
@click.option("--repeats", type=int, help="repeats per cell (default 3, quick 1)")
@click.option("--scale", type=float, help="multiply every event count")
@click.option(
    "--backend",
    "backends",
    multiple=True,
    type=click.Choice(["sqlite", "postgresql"]),
    help="repeatable",
)
@click.option(
    "--out", type=click.Path(path_type=Path), help="results folder (default bench/results)"
)
@click.option(
    "--workdir", type=click.Path(path_type=Path), help="where the databases go (default a temp dir)"
)
def command(
    name: str | None,
    quick: bool,
    repeats: int | None,
    scale: float | None,
    backends: tuple[str, ...],
    out: Path | None,
    workdir: Path | None,
) -> None:
    console = Console()
    if not console.is_terminal:  # piped to a file or CI log: keep the table's columns whole
        console = Console(width=170)
    if out is None:
        out = Path(tempfile.mkdtemp(prefix="eventlog-bench-quick-")) if quick else RESULTS_DIR
    names = [name] if name else list(BENCHMARKS)
    options: dict[str, Any] = {"quick": quick, "out_dir": out, "console": console}
    if repeats is not None:
        options["repeats"] = repeats
    if scale is not None:
        options["scale"] = scale
    if backends:
        options["backends"] = list(backends)
    if workdir is not None:
        options["workdir"] = workdir
    for each in names:
        console.rule(f"bench {each}")
        BENCHMARKS[each](**options)


def main(argv: list[str] | None = None) -> int:
    """Run `command` and return its exit status (2 on bad usage) instead of exiting."""
    try:
        command.main(args=argv, prog_name="python -m bench")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
