"""`python -m bench.soak`: crash safety proven by killing — SIGKILL appenders at random moments.

Each round forks a child that appends to the log in one of four ways — single appends,
batches over several streams, 64 asyncio appenders, or the CLI's `eventlog append` with a
large input — and writes each event id to an acknowledgement file only after the append
that stored it returned (out of band: a write() to a file survives the writer's SIGKILL).
The parent SIGKILLs the child after a random delay, then checks the log:

- every acknowledged event is present, exactly once (no event id is stored twice);
- seqs are gapless from 1, each stream's versions are contiguous from 0;
- `verify` finds no problem; and the log is still appendable (one probe append).

The log is replaced every `--rotate` kills so the checks stay cheap. Results (kills per mode,
acknowledged events, lost = 0) go to bench/results/soak.*.json; RELIABILITY.md reports them.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click

from bench.soak_events import SoakNote
from eventlog import AppendRequest, EventLog, Proposed

MODES = ("single", "batch", "async64", "cli")
CLI_LINES = 2000
PAD = "x" * 200


@dataclass
class SoakReport:
    backend: str
    kills: int = 0
    kills_by_mode: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MODES, 0))
    acked_events: int = 0
    acked_by_mode: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MODES, 0))
    stored_unacked_events: int = 0
    """Committed but killed before the acknowledgement was written: allowed, not lost."""
    lost: int = 0
    duplicated: int = 0
    gaps: int = 0
    version_breaks: int = 0
    verify_failures: int = 0
    probe_failures: int = 0
    logs: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def _new_id() -> uuid.UUID:
    return uuid.uuid4()


def _ack(out: int, ids: list[uuid.UUID]) -> None:
    os.write(out, "".join(f"{i}\n" for i in ids).encode())


def _child_single(log: EventLog, out: int, rng: random.Random) -> None:
    n = 0
    while True:
        event_id = _new_id()
        log.append(
            f"single/{rng.randrange(8)}", [Proposed(SoakNote(writer="single", n=n), event_id)]
        )
        _ack(out, [event_id])
        n += 1


def _child_batch(log: EventLog, out: int, rng: random.Random) -> None:
    n = 0
    while True:
        requests, ids = [], []
        for stream in rng.sample(range(16), 3):
            items = []
            for _ in range(5):
                ids.append(_new_id())
                items.append(Proposed(SoakNote(writer="batch", n=n, pad=PAD), ids[-1]))
                n += 1
            requests.append(AppendRequest(f"batch/{stream}", items))
        log.append_batch(requests)
        _ack(out, ids)


def _child_async(log: EventLog, out: int, rng: random.Random) -> None:
    async def appender(k: int) -> None:
        n = 0
        while True:
            event_id = _new_id()
            await log.append_async(
                f"async/{k}", [Proposed(SoakNote(writer="async", n=n), event_id)]
            )
            _ack(out, [event_id])
            n += 1

    async def main() -> None:
        await asyncio.gather(*(appender(k) for k in range(64)))

    asyncio.run(main())


def _cli_input(path: Path, rng: random.Random) -> None:
    lines = []
    for n in range(CLI_LINES):
        data = {"writer": "cli", "n": n, "pad": PAD}
        line = {"stream": f"cli/{rng.randrange(32)}", "type": "SoakNote", "data": data}
        line["event_id"] = str(_new_id())
        lines.append(json.dumps(line))
    path.write_text("\n".join(lines) + "\n")


def _child(mode: str, target: str, ack_path: Path, input_path: Path, seed: int) -> None:
    """The forked appender: runs until it is killed (never returns to the caller's code)."""
    code = 0
    try:
        out = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        rng = random.Random(seed)
        if mode == "cli":
            import io

            from eventlog.cli.main import main

            sys.stdin = io.TextIOWrapper(open(input_path, "rb"))  # noqa: SIM115
            sys.stdout = os.fdopen(out, "w", buffering=1)
            args = ["--events-module", "bench.soak_events", "append", target, "--json"]
            if main(args, standalone_mode=False) not in (None, 0):
                raise RuntimeError("eventlog append failed")
            time.sleep(3600)  # the batch is in: wait for the kill like the others
        log = EventLog.open(target, create=False)
        children: dict[str, Callable[[EventLog, int, random.Random], None]] = {
            "single": _child_single,
            "batch": _child_batch,
            "async64": _child_async,
        }
        children[mode](log, out, rng)
    except BaseException:  # anything but the kill is a finding: the parent sees exit 3
        import traceback

        traceback.print_exc()
        code = 3
    finally:
        os._exit(code)


def _acked(ack_path: Path, mode: str) -> set[uuid.UUID]:
    if not ack_path.exists():
        return set()
    ids = set()
    for line in ack_path.read_text().splitlines():
        text = line.strip()
        if not text:
            continue
        if mode == "cli":
            if not text.startswith("{"):
                continue
            text = json.loads(text)["event_id"]
        ids.add(uuid.UUID(text))
    return ids


def _check(target: str, acked: set[uuid.UUID], report: SoakReport, where: str) -> None:
    """After a kill: nothing acknowledged lost or doubled, no gap, chain intact, appendable."""
    with EventLog.open(target, create=False) as log:
        records = list(log.read_records())
        ids = collections.Counter(r.event_id for r in records)
        doubled = sum(1 for count in ids.values() if count > 1)
        lost = len(acked - ids.keys())
        gaps = 0 if [r.seq for r in records] == list(range(1, len(records) + 1)) else 1
        versions: dict[str, int] = {}
        breaks = 0
        for record in records:
            if record.version != versions.get(record.stream, -1) + 1:
                breaks += 1
            versions[record.stream] = record.version
        report_ok = log.verify().ok
        probe = _new_id()
        try:
            log.append("probe", [Proposed(SoakNote(writer="probe", n=len(records)), probe)])
            acked.add(probe)
        except Exception as exc:
            report.probe_failures += 1
            report.failures.append(f"{where}: probe append failed: {exc}")
    report.lost += lost
    report.duplicated += doubled
    report.gaps += gaps
    report.version_breaks += breaks
    if not report_ok:
        report.verify_failures += 1
    for name, count in (("lost", lost), ("doubled", doubled), ("gap", gaps), ("version", breaks)):
        if count:
            report.failures.append(f"{where}: {name} x{count}")
    if not report_ok:
        report.failures.append(f"{where}: verify failed")


def run_soak(
    target_factory: Callable[[int], str],
    *,
    backend: str,
    kills: int,
    rotate: int = 25,
    max_delay: float = 0.4,
    seed: int = 0,
    workdir: Path | None = None,
) -> SoakReport:
    """Kill `kills` appenders, cycling through MODES; `target_factory(i)` gives log number i."""
    rng = random.Random(seed)
    report = SoakReport(backend=backend)
    started = time.monotonic()
    scratch = Path(workdir or tempfile.mkdtemp(prefix="eventlog-soak-"))
    target = ""
    acked: set[uuid.UUID] = set()
    stored_total = 0
    for kill in range(kills):
        if kill % rotate == 0:
            if target:
                stored_total += _stored(target)
            target = target_factory(report.logs)
            report.logs += 1
            EventLog.open(target).close()
            acked = set()
        mode = MODES[kill % len(MODES)]
        ack_path = scratch / f"ack{kill}"
        input_path = scratch / f"input{kill}.jsonl"
        if mode == "cli":
            _cli_input(input_path, rng)
        delay = rng.uniform(0.0, max_delay * (4 if mode == "cli" else 1))
        pid = os.fork()
        if pid == 0:
            _child(mode, target, ack_path, input_path, seed * 100_003 + kill)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0:
            report.failures.append(f"kill {kill} ({mode}): appender failed before the kill")
        new = _acked(ack_path, mode)
        report.acked_events += len(new)
        report.acked_by_mode[mode] += len(new)
        acked |= new
        report.kills += 1
        report.kills_by_mode[mode] += 1
        _check(target, acked, report, f"kill {kill} ({mode}, after {delay * 1000:.0f} ms)")
        ack_path.unlink(missing_ok=True)
        input_path.unlink(missing_ok=True)
    if target:
        stored_total += _stored(target)
    probes = report.kills
    report.stored_unacked_events = max(stored_total - report.acked_events - probes, 0)
    report.seconds = round(time.monotonic() - started, 1)
    return report


def _stored(target: str) -> int:
    with EventLog.open(target, create=False) as log:
        return log.head()


def sqlite_targets(folder: Path) -> Callable[[int], str]:
    def make(index: int) -> str:
        return str(folder / f"soak{index}.db")

    return make


def postgres_targets(url: str) -> Callable[[int], str]:
    """Each new log empties the database at `url` first (drops the log's tables)."""

    def make(index: int) -> str:
        import sqlalchemy as sa

        from eventlog.log import resolve_url
        from eventlog.store import migrate

        engine = sa.create_engine(resolve_url(url))
        try:
            if migrate.current_revision(engine) is not None:
                migrate.downgrade(engine, "base")
        finally:
            engine.dispose()
        return url

    return make


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, help=__doc__)
@click.option("--kills", type=click.IntRange(min=1), default=200, show_default=True)
@click.option("--rotate", type=click.IntRange(min=1), default=25, show_default=True)
@click.option("--max-delay", type=float, default=0.4, show_default=True, help="seconds")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--postgres", "postgres_url", help="soak a PostgreSQL database (emptied first)")
@click.option(
    "--ledger",
    is_flag=True,
    help="kill recovery-ledger controllers instead of appenders (bench/soak_ledger.py)",
)
@click.option("--out", type=click.Path(path_type=Path), help="results file (JSON)")
def main(
    kills: int,
    rotate: int,
    max_delay: float,
    seed: int,
    postgres_url: str | None,
    ledger: bool,
    out: Path | None,
) -> None:
    folder = Path(tempfile.mkdtemp(prefix="eventlog-soak-"))
    if ledger:
        from bench.soak_ledger import run_ledger_soak

        found = run_ledger_soak(
            kills=kills, rotate=rotate, max_delay=max_delay, seed=seed, workdir=folder
        )
        _emit(asdict(found), found.ok, out)
        return
    if postgres_url:
        factory, backend = postgres_targets(postgres_url), "postgresql"
    else:
        factory, backend = sqlite_targets(folder), "sqlite"
    report = run_soak(
        factory,
        backend=backend,
        kills=kills,
        rotate=rotate,
        max_delay=max_delay,
        seed=seed,
        workdir=folder,
    )
    _emit(asdict(report), report.ok, out)


def _emit(result: dict[str, Any], ok: bool, out: Path | None) -> None:
    """A soak's report as JSON on stdout (and in --out); exit 1 when it found a broken rule."""
    result["ok"] = ok
    text = json.dumps(result, indent=2)
    click.echo(text)
    if out is not None:
        out.write_text(text + "\n")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
