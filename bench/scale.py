"""Scale benchmark: one controller, rollout actors in their own processes, thousands of seals.

The real `Controller` (ledger, TransferQueue data plane, checkpoints) drives G prompt groups
of N siblings through A `RolloutActor`s (Ray, separate processes) with S attempts in flight.
The actors run a **paced fake engine** (this file only): it emits tokens at a fixed per-sample
rate in small deltas, like a decoding GPU, so the controller sees results arrive at a
realistic pace without a model. Everything else is real: Ray, TransferQueue, the log.

Each configuration (`sqlite/forwarded`, `postgresql/direct`, `postgresql/forwarded`) runs in
two phases: a controller runs the first half of the steps and is stopped mid-step (its task
cancelled: attempts in flight are lost, as in a crash); a second controller restores from the
newest checkpoint and finishes the run. Reported per configuration:

- seals/s and events/s over the whole run; events per commit (every writer's commits);
- the controller's event-loop lag, p50/p99 (a 1 ms ticker), overall and while at least half
  of the S slots are busy; the target is p99 < 10 ms with S = 500;
- seal latency p50/p99: an attempt's result reaching the controller -> its seal recorded;
- the restore: wall time of the second controller's restore and what its plan reused/redid;
- a read-back check: every group finalized once, every sibling sealed once (rolled-back
  records excluded), every sealed attempt's stream exactly start / one TokensStaged per staged
  row / finish, no event id twice, the chain verifies, and the attempt-stream records of the
  second phase equal what the actors report having appended. `lost_or_duplicated` must be 0.

`python -m bench scale [--quick]`; results go to <out>/scale.json and scale.machine.json.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from rich.console import Console
from rich.table import Table

from bench.common import Results, machine, percentile, print_targets, verdict
from eventlog.recovery.config import RecoveryConfig, parse_config
from eventlog.rollout.sampling import SampleDelta, Sampling

CONFIG_YAML = """\
rollout_recovery:
  default_granularity: sibling
token_capture:
  enabled: true
  staging_partition: scale_staging
checkpointing:
  enabled: true
  save_data_plane: true
"""

CONFIGS: tuple[tuple[str, str], ...] = (
    ("sqlite", "forwarded"),
    ("postgresql", "direct"),
    ("postgresql", "forwarded"),
)


@dataclass(frozen=True)
class Shape:
    groups: int
    siblings: int
    steps: int
    actors: int
    slots: int
    max_tokens: int
    tokens_per_s: float
    """Decode rate of one sample (a sequence on a busy GPU: tens of tokens per second)."""


FULL = Shape(
    groups=1000, siblings=16, steps=4, actors=4, slots=500, max_tokens=32, tokens_per_s=64.0
)
LAG_TARGET_MS = 10.0
"""Issue 12: the controller loop's lag p99 stays under this while the slots are busy."""

QUICK = Shape(groups=8, siblings=4, steps=2, actors=2, slots=16, max_tokens=8, tokens_per_s=200.0)


# -- the paced fake engine (bench only) -----------------------------------------------------
@dataclass(frozen=True)
class PacedEngine:
    """Emits `max_tokens` tokens per sample, `chunk` at a time, at `tokens_per_s` each."""

    tokens_per_s: float
    chunk: int = 4
    model_name: str = "paced-fake-engine"

    def tokenize(self, text: str) -> list[int]:
        return [1 + (ord(c) % 250) for c in text]

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return " ".join(str(t) for t in token_ids)

    async def generate(
        self, prompt_token_ids: Sequence[int], sampling: Sampling, request_id: str
    ) -> AsyncIterator[SampleDelta]:
        rng = random.Random(f"{request_id}/{sampling.seed}")
        done = 0
        while done < sampling.max_tokens:
            step = min(self.chunk, sampling.max_tokens - done)
            await asyncio.sleep(step / self.tokens_per_s)
            done += step
            finish = "length" if done >= sampling.max_tokens else None
            for index in range(sampling.n):
                ids = tuple(rng.randrange(1, 250) for _ in range(step))
                yield SampleDelta(index, ids, tuple(-1.0 for _ in ids), finish)


@dataclass(frozen=True)
class PacedEngineFactory:
    tokens_per_s: float

    def __call__(self) -> PacedEngine:
        return PacedEngine(self.tokens_per_s)


class Prompts:
    """A dataset of `groups` prompts, `per_step` a step."""

    def __init__(self, per_step: int) -> None:
        self.per_step = per_step

    def get(self, sample_id: str) -> dict[str, Any]:
        return {"prompt_id": sample_id, "text": f"Prompt {sample_id}: count the stars."}

    def sample_ids(self, step: int, count: int) -> list[str]:
        return [f"s{step:03d}-{j:04d}" for j in range(count)]


# -- measuring ------------------------------------------------------------------------------
class LagMeter:
    """Ticks every millisecond on the controller's loop; a late tick is loop lag."""

    def __init__(self, busy: Any, threshold: int) -> None:
        self.busy = busy
        self.threshold = threshold
        self.all_ns: list[int] = []
        self.loaded_ns: list[int] = []
        self.peak_in_flight = 0

    async def run(self) -> None:
        period = 0.001
        while True:
            started = time.perf_counter_ns()
            await asyncio.sleep(period)
            lag = max(0, time.perf_counter_ns() - started - int(period * 1e9))
            in_flight = self.busy()
            self.peak_in_flight = max(self.peak_in_flight, in_flight)
            self.all_ns.append(lag)
            if in_flight >= self.threshold:
                self.loaded_ns.append(lag)


def _ms(values: list[int], q: float) -> float:
    return round(percentile(values, q) / 1e6, 3)


@dataclass
class Phase:
    wall_s: float
    restore_s: float | None
    plan: dict[str, int] | None


def _pool_class() -> Any:
    from eventlog.rollout.actor import ActorPool

    class TimedPool(ActorPool):
        """Notes when each attempt's result reached the controller (for seal latency)."""

        arrived_ns: ClassVar[dict[str, int]] = {}
        returned: ClassVar[dict[str, Any]] = {}

        async def run(self, *args: Any, **kwargs: Any) -> Any:
            result = await super().run(*args, **kwargs)
            self.arrived_ns[result.rollout_id] = time.time_ns()
            self.returned[result.rollout_id] = result
            return result

    return TimedPool


def run_config(
    backend: str,
    route: str,
    target: str,
    shape: Shape,
    work: Path,
) -> dict[str, Any]:
    """One configuration, both phases, and the read-back check; Ray + TQ must be running."""
    from eventlog.dataplane.transferqueue import TransferQueueDataPlane
    from eventlog.log import EventLog
    from eventlog.rollout.actor import ActorSpec, start_actors, stop_actors
    from eventlog.rollout.settings import LoopSettings

    config = parse_config(CONFIG_YAML, source="bench scale")
    per_step = shape.groups // shape.steps
    settings = LoopSettings(
        steps=shape.steps,
        groups_per_step=per_step,
        siblings=shape.siblings,
        max_tokens=shape.max_tokens,
        lookahead=1,
        workers=shape.actors,
        slots=shape.slots,
    )
    EventLog.open(target).close()  # at head before a direct actor opens it
    plane = TransferQueueDataPlane()
    plane.clear()
    spec = ActorSpec(
        engine=PacedEngineFactory(shape.tokens_per_s),
        route="direct" if route == "direct" else "forwarded",
        log_target=target if route == "direct" else None,
        partition=config.token_capture.staging_partition,
    )
    actors = start_actors([spec] * shape.actors, name=f"{backend}-{route}-", num_cpus=0.1)
    pool_class = _pool_class()
    lag = LagMeter(lambda: 0, shape.slots // 2)
    try:
        with EventLog.open(target) as log:
            started = time.perf_counter()
            first = _phase(
                log, plane, actors, pool_class, config, settings, work, lag, stop_mid_run=True
            )
            await_idle(actors)
            before = _attempt_records(log), _actor_events(actors)
            second = _phase(
                log, plane, actors, pool_class, config, settings, work, lag, stop_mid_run=False
            )
            wall = time.perf_counter() - started
            after = _attempt_records(log), _actor_events(actors)
            check = read_back(log, pool_class.returned, shape)
            check["phase2_attempt_records"] = after[0] - before[0]
            check["phase2_actor_events"] = after[1] - before[1]
            if check["phase2_attempt_records"] != check["phase2_actor_events"]:
                check["lost_or_duplicated"] += abs(
                    check["phase2_attempt_records"] - check["phase2_actor_events"]
                )
            commits = log.commits + sum(int(s["commits"]) for s in _stats(actors))
            head = log.head()
            seals = check["live_seals"]
            latency = [
                recorded - pool_class.arrived_ns[rid]
                for rid, recorded in check.pop("sealed_at").items()
                if rid in pool_class.arrived_ns
            ]
    finally:
        stop_actors(actors)
        plane.clear()
    return {
        "backend": backend,
        "route": route,
        **asdict(shape),
        "wall_s": round(wall, 2),
        "seals_per_s": round(seals / wall, 1),
        "events_per_s": round(head / wall, 1),
        "events": head,
        "commits": commits,
        "events_per_commit": round(head / commits, 2) if commits else None,
        "loop_lag_p50_ms": _ms(lag.all_ns, 50),
        "loop_lag_p99_ms": _ms(lag.all_ns, 99),
        "loop_lag_loaded_p50_ms": _ms(lag.loaded_ns, 50),
        "loop_lag_loaded_p99_ms": _ms(lag.loaded_ns, 99),
        "loop_lag_loaded_samples": len(lag.loaded_ns),
        "peak_in_flight": lag.peak_in_flight,
        "seal_latency_p50_ms": _ms(latency, 50),
        "seal_latency_p99_ms": _ms(latency, 99),
        "phase1_wall_s": round(first.wall_s, 2),
        "restore_s": None if second.restore_s is None else round(second.restore_s, 3),
        "restore_plan": second.plan,
        **check,
    }


def _phase(
    log: Any,
    plane: Any,
    actors: list[Any],
    pool_class: Any,
    config: RecoveryConfig,
    settings: Any,
    work: Path,
    lag: LagMeter,
    *,
    stop_mid_run: bool,
) -> Phase:
    from eventlog.recovery.vocabulary import RestoreCompleted
    from eventlog.rollout.controller import Controller

    pool = pool_class(log, actors, slots=settings.slots)
    lag.busy = lambda: pool.running
    controller = Controller(
        log=log,
        data_plane=plane,
        engine=None,
        source=Prompts(settings.groups_per_step),
        config=config,
        settings=settings,
        checkpoint_dir=work / "checkpoints",
        pool=pool,
        owner=f"bench-controller-{'a' if stop_mid_run else 'b'}",
    )
    from_seq = log.head() + 1
    started_ns = time.time_ns()
    started = time.perf_counter()
    # Stop mid-run: once the step after the half-way checkpoint has sealed some siblings.
    half = settings.steps // 2

    async def main() -> None:
        ticker = asyncio.create_task(lag.run())
        runner = asyncio.create_task(controller.run())
        try:
            if stop_mid_run:
                quarter = max(1, settings.groups_per_step * settings.siblings // 4)
                await _until_mid_run(log, half, quarter, runner)
                runner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await runner
            else:
                await runner
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker

    asyncio.run(main())
    wall = time.perf_counter() - started
    restore_s, plan = None, None
    for record in log.read(from_seq=from_seq):
        if isinstance(record.event, RestoreCompleted):
            restore_s = (record.recorded_at - started_ns) / 1e9
            event = record.event
            plan = {
                "checkpoint_step": event.checkpoint_step,
                "groups_restored": event.groups_restored,
                "siblings_reused": event.siblings_reused,
                "siblings_redispatched": event.siblings_redispatched,
                "rows_cleared": event.rows_cleared,
            }
            break
    return Phase(wall, restore_s, plan)


async def _until_mid_run(log: Any, half: int, seals: int, runner: asyncio.Task[Any]) -> None:
    """Until checkpoint `half` is committed and `seals` siblings were sealed after it.

    The log is read in a thread, only the two types it needs: the controller's loop is what
    this benchmark measures, and the watcher must not add lag to it.
    """
    types = ["CheckpointCommitted", "SiblingSealed"]
    cursor, after_checkpoint = 0, -1

    def scan() -> tuple[int, int]:
        seen, count = cursor, after_checkpoint
        for record in log.read(from_seq=cursor + 1, types=types):
            seen = record.seq
            event = record.event
            if record.type == "CheckpointCommitted" and event.step == half:
                count = 0
            elif record.type == "SiblingSealed" and count >= 0:
                count += 1
        return seen, count

    while not runner.done():
        cursor, after_checkpoint = await asyncio.to_thread(scan)
        if after_checkpoint >= seals:
            return
        await asyncio.sleep(0.05)


def await_idle(actors: list[Any], quiet_s: float = 1.0, limit_s: float = 60.0) -> None:
    """Until the actors' append counters stop moving (attempts of a stopped controller end)."""
    deadline = time.monotonic() + limit_s
    last = -1
    while time.monotonic() < deadline:
        now = _actor_events(actors)
        if now == last:
            return
        last = now
        time.sleep(quiet_s)


def _stats(actors: list[Any]) -> list[dict[str, float]]:
    import ray

    return list(ray.get([a.stats.remote() for a in actors]))


def _actor_events(actors: list[Any]) -> int:
    return sum(int(s["events"]) for s in _stats(actors))


def _attempt_records(log: Any) -> int:
    return sum(1 for r in log.read_records() if r.stream.startswith("attempt/"))


def read_back(log: Any, returned: dict[str, Any], shape: Shape) -> dict[str, Any]:
    """Check the whole log against what the run must have produced; count every mismatch."""
    from eventlog.recovery.vocabulary import (
        GenerationFinished,
        GenerationStarted,
        GroupFinalized,
        RestoreStarted,
        SiblingSealed,
        TokensStaged,
    )

    records = list(log.read())
    rolled_back: list[tuple[int, int]] = [
        (r.event.rolled_back_from_seq, r.seq)
        for r in records
        if isinstance(r.event, RestoreStarted)
    ]

    def live(seq: int) -> bool:
        return not any(lo <= seq < hi for lo, hi in rolled_back)

    problems = Counter[str]()
    ids = Counter(r.event_id for r in records)
    problems["duplicate_event_ids"] = sum(n - 1 for n in ids.values() if n > 1)
    seals: Counter[tuple[str, int]] = Counter()
    sealed_at: dict[str, int] = {}
    finalized: Counter[str] = Counter()
    streams: dict[str, list[Any]] = defaultdict(list)
    for r in records:
        if r.stream.startswith("attempt/"):
            streams[r.stream.removeprefix("attempt/")].append(r.event)
        if not live(r.seq):
            continue
        if isinstance(r.event, SiblingSealed):
            seals[(r.event.group_id, r.event.generation_index)] += 1
            sealed_at[r.event.rollout_id] = r.recorded_at
        elif isinstance(r.event, GroupFinalized):
            finalized[r.event.group_id] += 1
    groups = {g for g, _ in seals}
    problems["groups_missing"] = shape.groups - len(finalized)
    problems["groups_finalized_twice"] = sum(n - 1 for n in finalized.values() if n > 1)
    problems["siblings_sealed_twice"] = sum(n - 1 for n in seals.values() if n > 1)
    problems["siblings_unsealed"] = sum(
        shape.siblings - len([k for k in seals if k[0] == g]) for g in groups
    )
    for events in streams.values():
        if sum(isinstance(e, GenerationStarted) for e in events) != 1:
            problems["attempt_streams_started_twice"] += 1
    for rollout_id in sealed_at:
        events = streams.get(rollout_id, [])
        result = returned.get(rollout_id)
        keys = [e.staging_key for e in events if isinstance(e, TokensStaged)]
        shape_ok = (
            len(events) >= 3
            and isinstance(events[0], GenerationStarted)
            and isinstance(events[-1], GenerationFinished)
            and keys == events[-1].staging_keys
            and (result is None or result.receipt is None or keys == result.receipt.staging_keys)
        )
        if not shape_ok:
            problems["sealed_attempt_streams_malformed"] += 1
    report = log.verify()
    problems["chain_problems"] = len(report.problems)
    return {
        "live_seals": sum(seals.values()),
        "groups_finalized": len(finalized),
        "problems": {k: v for k, v in problems.items() if v},
        "lost_or_duplicated": sum(problems.values()),
        "sealed_at": sealed_at,
    }


# -- the benchmark --------------------------------------------------------------------------
@contextlib.contextmanager
def _ray(work: Path) -> Iterator[None]:
    import ray

    from eventlog.dataplane.transferqueue import start_transferqueue, stop_transferqueue

    if ray.is_initialized():  # a caller (the smoke test) already runs Ray + TQ
        yield
        return
    root = tempfile.mkdtemp(prefix="evscale-", dir="/tmp")
    runtime = start_transferqueue(temp_root=root)
    try:
        yield
    finally:
        stop_transferqueue(runtime)
        shutil.rmtree(root, ignore_errors=True)


def run(
    *,
    quick: bool = False,
    out_dir: Path | None = None,
    workdir: Path | None = None,
    console: Console | None = None,
    configs: Sequence[tuple[str, str]] = CONFIGS,
    shape: Shape | None = None,
    **_: Any,
) -> Results:
    """Run every configuration, print a table, write <out_dir>/scale.json."""
    from bench.pg import PgUnavailable, pg_server

    console = console or Console()
    shape = shape or (QUICK if quick else FULL)
    made = workdir is None
    work = Path(tempfile.mkdtemp(prefix="eventlog-bench-scale-")) if workdir is None else workdir
    work.mkdir(parents=True, exist_ok=True)
    results = Results("scale", machine(work, {"shape": asdict(shape), "quick": quick}))
    try:
        with _ray(work), contextlib.ExitStack() as stack:
            server = None
            for backend, route in configs:
                cell = work / f"{backend}-{route}"
                cell.mkdir(parents=True, exist_ok=True)
                if backend == "sqlite":
                    target = str(cell / "run.db")
                else:
                    if server is None:
                        try:
                            server = stack.enter_context(pg_server())
                        except PgUnavailable as exc:
                            results.header["postgresql"] = {"skipped": str(exc)}
                            console.print(f"[yellow]PostgreSQL rows skipped: {exc}[/]")
                            continue
                    target = server.url(_fresh_db(server, f"scale_{route}"))
                row = run_config(backend, route, target, shape, cell)
                results.rows.append(row)
                console.print(
                    f"  {backend:<10} {route:<9} {row['seals_per_s']:>8,.0f} seals/s "
                    f"{row['events_per_s']:>8,.0f} ev/s  {row['events_per_commit']} ev/commit  "
                    f"lag p99 {row['loop_lag_p99_ms']} ms (loaded {row['loop_lag_loaded_p99_ms']})"
                    f"  seal p99 {row['seal_latency_p99_ms']} ms  restore {row['restore_s']} s  "
                    f"lost/dup {row['lost_or_duplicated']}"
                )
    finally:
        if made:
            shutil.rmtree(work, ignore_errors=True)
    results.targets = [
        verdict(
            f"{r['backend']}/{r['route']}: controller loop lag p99 ms with the slots busy",
            r["loop_lag_loaded_p99_ms"],
            LAG_TARGET_MS,
            [r["loop_lag_loaded_p99_ms"]],
            at_most=True,
        )
        | {"backend": r["backend"], "route": r["route"]}
        for r in results.rows
    ] + [
        verdict(
            f"{r['backend']}/{r['route']}: lost or duplicated events",
            r["lost_or_duplicated"],
            0,
            [r["lost_or_duplicated"]],
            at_most=True,
        )
        | {"backend": r["backend"], "route": r["route"]}
        for r in results.rows
    ]
    console.print(table(results.rows))
    print_targets(console, results.targets, ",.3f")
    results.save(out_dir, console)
    return results


def _fresh_db(server: Any, name: str) -> str:
    import psycopg

    with psycopg.connect(server.conninfo("postgres"), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    return name


def table(rows: list[dict[str, Any]]) -> Table:
    out = Table(title="scale: one controller, rollout actors, a restore in the middle")
    columns = (
        ("backend", "backend"),
        ("route", "route"),
        ("seals/s", "seals_per_s"),
        ("events/s", "events_per_s"),
        ("ev/commit", "events_per_commit"),
        ("lag p50 ms", "loop_lag_p50_ms"),
        ("lag p99 ms", "loop_lag_p99_ms"),
        ("lag p99 busy", "loop_lag_loaded_p99_ms"),
        ("seal p50 ms", "seal_latency_p50_ms"),
        ("seal p99 ms", "seal_latency_p99_ms"),
        ("restore s", "restore_s"),
        ("lost/dup", "lost_or_duplicated"),
    )
    for title, _ in columns:
        out.add_column(title)
    for row in rows:
        out.add_row(*(str(row[key]) for _, key in columns))
    return out
