"""One controller process of `eventlog demo`: ``python -m eventlog.demo.child ...``.

The parent starts it, watches the log, SIGKILLs it mid-step and starts it again; this process
does not know which run it is. An empty log means a fresh run (checkpoint 0 first); a log
with history means restore from its newest checkpoint and finish the run. It owns its data
plane: the in-memory twin (rows die with the process; checkpoints are files) or TransferQueue
on a Ray it starts itself, under a temp root the parent cleans up by PID after a kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import click

from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.dataplane.protocol import DataPlane
from eventlog.demo.scenario import DemoDataset, demo_faults
from eventlog.log import EventLog
from eventlog.recovery.config import RecoveryConfig, load_config
from eventlog.rollout.controller import Controller, RunReport
from eventlog.rollout.faults import FaultPlan
from eventlog.rollout.pool import RolloutPool
from eventlog.rollout.sampling import TokenEngine
from eventlog.rollout.settings import LoopSettings

logger = logging.getLogger("eventlog.demo.child")


def report_json(report: RunReport, **extra: object) -> dict[str, object]:
    plan = report.restore
    return {
        "started_at_step": report.started_at_step,
        "restore": None
        if plan is None
        else {
            "checkpoint_step": plan.checkpoint_step,
            "checkpoint_seq": plan.checkpoint_seq,
            "rolled_back": list(plan.rolled_back),
            "counts": plan.counts,
            "groups": {
                g.group_id: {
                    "granularity": g.granularity,
                    "reused": [s.generation_index for s in g.sealed],
                    "redispatched": [r.rollout_id for r in g.redispatch],
                }
                for g in plan.admitted + [g for a in plan.reserved for g in a.groups]
            },
        },
        "steps": [vars(s) for s in report.steps],
        "rejected_results": report.rejected_results,
        "retried_attempts": report.retried_attempts,
        "discarded_groups": report.discarded_groups,
        "replaced_workers": report.replaced_workers,
        **extra,
    }


@contextlib.contextmanager
def _workers(
    kind: str,
    target: str,
    model: str,
    config: RecoveryConfig,
    settings: LoopSettings,
    faults: FaultPlan,
    log: EventLog,
) -> Iterator[tuple[TokenEngine | None, RolloutPool | None]]:
    """One vLLM engine in this process, or `settings.workers` rollout actors with one each.

    Actors append their attempt streams themselves when the log is PostgreSQL (every host
    reaches it) and forward them to this process's log otherwise.
    """
    if kind == "ray":
        from eventlog.log import resolve_url
        from eventlog.rollout.actor import (
            ActorPool,
            ActorSpec,
            VllmEngineFactory,
            start_actors,
            stop_actors,
        )

        direct = resolve_url(target).get_backend_name() == "postgresql"
        spec = ActorSpec(
            engine=VllmEngineFactory(model, settings.seed),
            route="direct" if direct else "forwarded",
            log_target=target if direct else None,
            partition=config.token_capture.staging_partition,
            faults=faults,
        )
        actors = start_actors([spec] * settings.workers, name="demo-actor")
        try:
            yield None, ActorPool(log, actors, slots=settings.slots)
        finally:
            stop_actors(actors)
        return
    from eventlog.rollout.engine import EngineConfig, VllmEngine

    with VllmEngine.start(EngineConfig(model=model, seed=settings.seed)) as engine:
        yield engine, None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--target", required=True, help="the log: SQLite path or SQLAlchemy URL")
@click.option("--run-dir", required=True, type=click.Path(path_type=Path))
@click.option("--model", required=True, help="local Hugging Face model directory")
@click.option(
    "--data-plane", "plane_kind", type=click.Choice(["memory", "transferqueue"]), default="memory"
)
@click.option("--ray-root", default=None, help="temp root for Ray (transferqueue)")
@click.option(
    "--workers",
    "worker_kind",
    type=click.Choice(["threads", "ray"]),
    default="threads",
    help="rollout workers in this process, or Ray actors (direct to a PostgreSQL log, "
    "forwarded to this process otherwise)",
)
@click.option("--settings", "settings_json", required=True, help="LoopSettings as JSON")
@click.option("--no-faults", is_flag=True)
@click.option(
    "--report", type=click.Path(path_type=Path), default=None, help="write a JSON report here"
)
def command(
    target: str,
    run_dir: Path,
    model: str,
    plane_kind: str,
    ray_root: str | None,
    worker_kind: str,
    settings_json: str,
    no_faults: bool,
    report: Path | None,
) -> None:
    """Run the demo's controller on the --target log: a fresh run, or restore and finish it."""
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    settings = LoopSettings(**json.loads(settings_json))
    config = load_config(run_dir / "recovery.yaml")
    faults = FaultPlan() if no_faults else demo_faults(settings, in_process=worker_kind != "ray")
    started = time.monotonic()
    runtime = None
    log = EventLog.open(target)
    try:
        data_plane: DataPlane
        if plane_kind == "transferqueue":
            from eventlog.dataplane.transferqueue import (
                TransferQueueDataPlane,
                start_transferqueue,
            )

            runtime = start_transferqueue(temp_root=ray_root)
            data_plane = TransferQueueDataPlane()
        else:
            data_plane = InMemoryDataPlane()
        engine_started = time.monotonic()
        with _workers(worker_kind, target, model, config, settings, faults, log) as (engine, pool):
            engine_s = time.monotonic() - engine_started
            controller = Controller(
                log=log,
                data_plane=data_plane,
                engine=engine,
                source=DemoDataset(),
                config=config,
                settings=settings,
                checkpoint_dir=run_dir / "checkpoints",
                faults=faults,
                owner=f"demo-controller:{os.getpid()}",
                pool=pool,
            )
            run_started = time.monotonic()
            result = asyncio.run(controller.run())
            run_s = time.monotonic() - run_started
        if report is not None:
            report.write_text(
                json.dumps(
                    report_json(
                        result,
                        pid=os.getpid(),
                        engine_start_s=round(engine_s, 2),
                        run_s=round(run_s, 2),
                        total_s=round(time.monotonic() - started, 2),
                    ),
                    indent=2,
                )
            )
    finally:
        log.close()
        if runtime is not None:
            from eventlog.dataplane.transferqueue import stop_transferqueue

            stop_transferqueue(runtime)
    logger.info("controller finished in %.1f s", time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    """Run `command` and return its exit status (2 on bad usage) instead of exiting."""
    try:
        command.main(args=argv, prog_name="python -m eventlog.demo.child")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
