"""`eventlog demo`: a small end-to-end run with a controller crash and a restore.

The controller (vLLM rollout workers on a local model, the recovery ledger, the in-memory
data plane or TransferQueue) runs in a child process on a fresh log. Mid-step, after a
checkpoint, the demo SIGKILLs it, starts it again, and the new process restores from the log
and the data-plane checkpoint, redispatches exactly the missing siblings and finishes the run.
Then the demo reads the whole log back and checks what a restore promises; exit 1 when a check
fails. Progress goes to stderr, the summary to stdout.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime
from pathlib import Path

import click
from rich.console import Console
from rich.text import Text

from eventlog.cli.exits import ExitCode
from eventlog.cli.numbers import number
from eventlog.cli.output import stderr_console, stdout_console
from eventlog.cli.targets import shown_target
from eventlog.demo.checks import DemoCheck, check_run
from eventlog.demo.runner import DemoOptions, DemoRun, DemoRunner
from eventlog.demo.view import DemoView
from eventlog.log import EventLog
from eventlog.rollout.settings import LoopSettings


def _model_dir(chosen: str | None, console: Console) -> Path:
    if chosen is not None:
        return Path(chosen).resolve()
    from eventlog.rollout.tiny_model import build_tiny_model

    target = os.environ.get("EVENTLOG_TINY_MODEL_DIR") or ".cache/tiny-model"
    started = time.monotonic()
    built = build_tiny_model(target)
    elapsed = time.monotonic() - started
    if elapsed > 1:
        console.print(f"built the tiny model in {built} ({elapsed:.1f} s)", highlight=False)
    return built


@click.command()
@click.option(
    "--db",
    "target",
    metavar="TARGET",
    help="The log: an SQLite path or a PostgreSQL URL (empty). Default: RUN_DIR/run.db.",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where checkpoints, controller output and the SQLite log go. "
    "Default: .demo/run-<timestamp>.",
)
@click.option(
    "--model",
    metavar="DIR",
    help="A local Hugging Face model directory. Default: the tiny model, built into "
    "$EVENTLOG_TINY_MODEL_DIR or .cache/tiny-model.",
)
@click.option(
    "--data-plane",
    type=click.Choice(["memory", "transferqueue"]),
    default="memory",
    show_default=True,
    help="Where token rows are staged: the in-memory twin (checkpoints to files) or "
    "TransferQueue on a Ray the controller starts (stopped by PID after the kill).",
)
@click.option(
    "--workers",
    type=click.Choice(["threads", "ray"]),
    default="threads",
    show_default=True,
    help="Rollout workers in the controller's process, or Ray actors with one vLLM engine "
    "each (needs --data-plane transferqueue; with a PostgreSQL --db they append to the log "
    "themselves, otherwise the controller appends for them).",
)
@click.option(
    "--steps",
    type=number(min=3),
    default=3,
    show_default=True,
    help="Train steps (3 or more: the kill lands after step 1's checkpoint, before the last).",
)
@click.option("--groups", type=number(min=1), default=4, show_default=True)
@click.option("--siblings", type=number(min=2), default=4, show_default=True)
@click.option("--max-tokens", type=number(min=8), default=24, show_default=True)
@click.option(
    "--slots",
    type=number(min=1),
    default=8,
    show_default=True,
    help="Attempts in flight at once.",
)
@click.option(
    "--kill-after-seals",
    type=number(min=1),
    default=2,
    show_default=True,
    help="SIGKILL the controller once this many sibling results were sealed after the "
    "checkpoint of step 1.",
)
@click.option("--no-faults", is_flag=True, help="No injected attempt failures or worker kill.")
@click.option("--timeout", type=float, default=900.0, show_default=True, metavar="SECONDS")
def demo(
    target: str | None,
    run_dir: Path | None,
    model: str | None,
    data_plane: str,
    workers: str,
    steps: int,
    groups: int,
    siblings: int,
    max_tokens: int,
    slots: int,
    kill_after_seals: int,
    no_faults: bool,
    timeout: float,
) -> None:
    """A small end-to-end run with a controller crash and a restore, then checks.

    Exit 0 when every check passes, 1 when one fails (each is printed), other codes as for
    every command (see `eventlog --help`).
    """
    out, err = stdout_console(), stderr_console()
    if run_dir is None:
        run_dir = Path(".demo") / f"run-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    target = target or str(run_dir / "run.db")
    settings = LoopSettings(
        steps=steps,
        groups_per_step=groups,
        siblings=siblings,
        max_tokens=max_tokens,
        slots=slots,
    )
    options = DemoOptions(
        target=target,
        run_dir=run_dir,
        model_dir=_model_dir(model, err),
        settings=settings,
        data_plane="transferqueue" if data_plane == "transferqueue" else "memory",
        workers="ray" if workers == "ray" else "threads",
        kill_after_seals=kill_after_seals,
        faults=not no_faults,
        timeout_s=timeout,
    )
    err.print(
        f"eventlog demo: {steps} steps × {groups} groups × {siblings} siblings on "
        f"{options.model_dir.name}; log {shown_target(target)}; run dir {run_dir}",
        highlight=False,
        soft_wrap=True,
    )
    live = err.is_terminal and sys.stderr.isatty()
    with DemoView(settings, err, live=live) as view:
        result = DemoRunner(options, view).run()
    with EventLog.open(target) as log:
        check = check_run(log, steps=steps, groups_per_step=groups)
        spans = [_span_s(log, r.first_seq, r.last_seq) for r in result.runs]
    _summary(out, result, check, target, sum(spans))
    if not check.ok:
        sys.exit(ExitCode.INTEGRITY)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _span_s(log: EventLog, first_seq: int, last_seq: int) -> float:
    """Seconds between two records' recorded_at (0 when the range is empty)."""
    if last_seq <= first_seq:
        return 0.0
    first = next(iter(log.read(from_seq=first_seq, until_seq=first_seq)))
    last = next(iter(log.read(from_seq=last_seq, until_seq=last_seq)))
    return (last.recorded_at - first.recorded_at) / 1e9


def _summary(out: Console, run: DemoRun, check: DemoCheck, target: str, appending_s: float) -> None:
    options = run.options
    s = options.settings
    verdict = ("passed", "green") if check.ok else ("FAILED", "red")
    out.print(
        Text.assemble(
            "\neventlog demo ",
            verdict,
            f": {s.steps} steps × {s.groups_per_step} groups × {s.siblings} siblings, "
            f"{options.data_plane} data plane, run dir {options.run_dir}",
        )
    )
    rows: list[tuple[str, str]] = [
        (
            "log",
            f"{shown_target(target)}: {check.records} records, verify "
            f"{'ok' if check.verified else 'FAILED'}, head chain {check.chain[:16]}…",
        )
    ]
    for r in run.runs:
        engine = (r.report or {}).get("engine_start_s")
        started = f", engine ready in {engine} s" if engine is not None else ""
        if r.killed and run.kill is not None:
            caught = (
                f"; that checkpoint caught {', '.join(run.kill.half_sealed)} half-sealed"
                if run.kill.half_sealed
                else ""
            )
            end = (
                f"SIGKILLed at seq {run.kill.seq} "
                f"({_n(run.kill.seals_since_checkpoint, 'sibling result')} sealed after "
                f"checkpoint step {run.kill.checkpoint_step}{caught})"
            )
        else:
            end = f"exit {r.returncode}"
        rows.append(
            (
                f"controller #{r.number}",
                f"pid {r.pid}, {r.wall_s:.1f} s{started}, seqs {r.first_seq}..{r.last_seq}, {end}",
            )
        )
    for restore in check.restores:
        counts = restore.recorded
        rows.append(
            (
                "restore",
                f"checkpoint step {restore.checkpoint_step} (seq {restore.checkpoint_seq}); "
                f"rolled back seqs {restore.rolled_back[0]}..{restore.rolled_back[1]} "
                f"({_n(restore.seals_rolled_back, 'sibling result')} sealed after the "
                "checkpoint, rolled back with it)",
            )
        )
        rows.append(
            (
                "",
                f"{_n(counts['groups_restored'], 'group')} restored: "
                f"{_n(counts['siblings_reused'], 'sibling')} reused, "
                f"{counts['siblings_redispatched']} redispatched, "
                f"{_n(counts['rows_cleared'], 'unreferenced row')} cleared",
            )
        )
        for gid in sorted(restore.sealed_at_checkpoint.keys() | restore.missing_at_checkpoint):
            kept = restore.sealed_at_checkpoint.get(gid, [])
            rerun = restore.missing_at_checkpoint.get(gid, [])
            rows.append(("", f"  {gid}: reused {kept or '-'}, redispatched {rerun or '-'}"))
    rows.append(
        (
            "groups",
            f"{check.groups_trained}/{check.groups_expected} trained once each (steps "
            f"{', '.join(map(str, check.steps_trained))}); "
            f"{_n(check.finalized_records, 'GroupFinalized record')}, "
            f"{check.finalized_rolled_back} of them rolled back by the restore",
        )
    )
    rows.append(
        (
            "attempts",
            f"{check.attempts_started} started, {check.attempts_failed} failed, "
            f"{check.attempts_cut_off} cut off by a kill, {check.retries} retried, "
            f"{check.abandoned} abandoned, {check.stale_rejected} late results rejected",
        )
    )
    rate = check.records / appending_s if appending_s > 0 else 0.0
    rows.append(
        (
            "events",
            f"{check.records} appended in {appending_s:.1f} s of controller activity "
            f"(first to last record of each process): {rate:.0f} events/s, peak "
            f"{check.peak_per_s} in one second",
        )
    )
    width = max(len(name) for name, _ in rows)
    for name, text in rows:
        out.print(f"  {name:<{width}}  {text}", highlight=False, markup=False)
    if check.problems:
        out.print("\nchecks failed:", style="red")
        for problem in check.problems:
            out.print(f"  - {problem}", highlight=False, markup=False)
    else:
        pad = " " * (width + 4)
        out.print(
            f"  {'checks':<{width}}  restore counts match the log at the checkpoint; every "
            f"sealed sibling kept;\n{pad}exactly the missing siblings redispatched; no group "
            "finalized or trained twice; verify ok",
            highlight=False,
            markup=False,
        )
    shown = shown_target(target)
    group = next(
        (g for r in check.restores for g in sorted(r.sealed_at_checkpoint)),
        f"step{s.steps}-g0",
    )
    out.print("\nLook closer:", highlight=False)
    for line in (
        f"eventlog replay {shown} --type RestoreStarted --type RestoreCompleted "
        "--type StagingCleared",
        f"eventlog replay {shown} --group {group}",
        f"eventlog replay {shown} --type AttemptFailed --type GroupAbandoned "
        "--type StaleResultRejected",
        f"eventlog replay {shown} --type RestoreCompleted --json",
        f"eventlog stats {shown}",
        f"eventlog verify {shown}",
    ):
        out.print(f"  {line}", highlight=False, markup=False)
