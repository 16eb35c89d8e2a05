"""The parent side of `eventlog demo`: start the controller, watch the log, kill, restart.

The controller runs in a child process (`eventlog.demo.child`). The parent reads the log as
it grows and, mid-step after a checkpoint (see `_Watch` for which one), SIGKILLs the child:
no clean-up code runs, so what is left is exactly what a crash leaves. It then starts the
controller again on the same log;
that process restores from the newest checkpoint and finishes the run.

Whoever starts processes stops them: the parent kills its child by PID on any error or
interrupt, and after a SIGKILL it stops, by PID, the Ray/TransferQueue processes the child
started (they would otherwise live on as orphans).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from eventlog.dataplane.raysession import TEMP_ROOT_ENV
from eventlog.demo.scenario import CONFIG_YAML
from eventlog.log import EventLog
from eventlog.records import RecordedEvent
from eventlog.recovery.errors import DemoError
from eventlog.recovery.vocabulary import CheckpointCommitted, GroupSealed, SiblingSealed
from eventlog.rollout.settings import LoopSettings
from projections.siblings import LedgerState, RuleViolation, fold

logger = logging.getLogger(__name__)


class DemoObserver(Protocol):
    """Who watches the run: the command line's progress display, or a test."""

    def phase(self, message: str) -> None: ...

    def record(self, record: RecordedEvent) -> None: ...


@dataclass(frozen=True)
class DemoOptions:
    target: str
    """The log: an SQLite path or a SQLAlchemy URL (must be empty)."""
    run_dir: Path
    model_dir: Path
    settings: LoopSettings = field(default_factory=LoopSettings)
    data_plane: Literal["memory", "transferqueue"] = "memory"
    workers: Literal["threads", "ray"] = "threads"
    """Rollout workers beside the controller, or Ray actors (needs TransferQueue's Ray)."""
    kill_after_seals: int = 2
    kill_from_step: int = 1
    faults: bool = True
    timeout_s: float = 900.0
    poll_s: float = 0.02


@dataclass
class ControllerRun:
    """One controller process."""

    number: int
    pid: int
    output: Path
    """Its stdout and stderr (logging, vLLM)."""
    wall_s: float = 0.0
    returncode: int | None = None
    killed: bool = False
    first_seq: int = 0
    last_seq: int = 0
    report: dict[str, Any] | None = None


@dataclass(frozen=True)
class KillPoint:
    """Where the parent SIGKILLed the controller."""

    pid: int
    seq: int
    """The log's head once the process was gone: the last record it wrote."""
    checkpoint_step: int
    seals_since_checkpoint: int
    half_sealed: list[str]
    """`sibling` groups that checkpoint caught half-sealed (what the restore can reuse)."""


@dataclass
class DemoRun:
    options: DemoOptions
    runs: list[ControllerRun] = field(default_factory=list)
    kill: KillPoint | None = None


class _Watch:
    """Follows the log for one child (folding it as the ledger does); picks the kill moment.

    The kill should land where a restore has something to show: after a checkpoint that
    caught a `sibling` group half-sealed (its sealed siblings are reused, the rest rerun),
    once `kill_after_seals` sibling results were sealed after that checkpoint. If no
    checkpoint before the last step's catches one, the kill lands after the checkpoint of
    step `steps - 1` anyway (a restore with less to reuse is still a restore).
    """

    def __init__(self, options: DemoOptions, armed: bool) -> None:
        self.options = options
        self.armed = armed
        self.state = LedgerState()
        self.checkpoint_step: int | None = None
        self.seals = 0
        """Sibling results sealed since the newest checkpoint."""
        self.half_sealed: list[str] = []
        """`sibling` groups the newest checkpoint caught with some, not all, siblings sealed."""

    def due(self, record: RecordedEvent) -> bool:
        event = record.event
        with contextlib.suppress(RuleViolation):  # the demo's checks report a bad log
            fold(self.state, event)
        steps = self.options.settings.steps
        if isinstance(event, CheckpointCommitted):
            self.checkpoint_step, self.seals = event.step, 0
            self.half_sealed = [
                g.group_id
                for g in self.state.groups.values()
                if g.granularity == "sibling"
                and 0 < len(g.indices("sealed")) < g.expected_generations
            ]
            return False
        if isinstance(event, SiblingSealed):
            self.seals += 1
        elif isinstance(event, GroupSealed):
            self.seals += len(event.results)
        else:
            return False
        step = self.checkpoint_step
        if not self.armed or step is None or not self.options.kill_from_step <= step < steps:
            return False
        last_chance = step == steps - 1
        return (bool(self.half_sealed) or last_chance) and (
            self.seals >= self.options.kill_after_seals
        )


class DemoRunner:
    """Runs the demo's controllers one after the other and kills the first mid-step."""

    def __init__(self, options: DemoOptions, observer: DemoObserver) -> None:
        self.options = options
        self.observer = observer
        self.run_dir = options.run_dir.resolve()
        self._cursor = 0
        self._ray_root: str | None = None

    def run(self) -> DemoRun:
        options = self.options
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "recovery.yaml").write_text(CONFIG_YAML)
        result = DemoRun(options)
        if options.workers == "ray" and options.data_plane != "transferqueue":
            raise DemoError(
                "--workers ray: rollout actors need the Ray that TransferQueue runs on",
                hint="add --data-plane transferqueue",
            )
        with EventLog.open(options.target) as log, self._ray_session():
            if log.head() != 0:
                raise DemoError(
                    f"the demo needs an empty log; {options.target} holds {log.head()} records",
                    hint="pass --db with a new SQLite path or an empty PostgreSQL database",
                )
            first = self._run_controller(log, 1, armed=True, result=result)
            if not first.killed:
                raise DemoError(
                    f"controller #1 finished (exit {first.returncode}) before the planned kill "
                    f"({options.kill_after_seals} sibling results sealed after a checkpoint of "
                    f"step {options.kill_from_step}..{options.settings.steps - 1}); see "
                    f"{first.output}",
                    hint="use more steps or siblings, or a smaller --kill-after-seals",
                )
            self._run_controller(log, 2, armed=False, result=result)
        return result

    @contextlib.contextmanager
    def _ray_session(self) -> Iterator[None]:
        if self.options.data_plane != "transferqueue":
            yield
            return
        # Short: Ray's socket paths under it must stay below 108 bytes, and CI's own temp
        # root already takes a share of them.
        self._ray_root = tempfile.mkdtemp(prefix="ev", dir=os.environ.get(TEMP_ROOT_ENV))
        try:
            yield
        finally:
            self._stop_ray()
            shutil.rmtree(self._ray_root, ignore_errors=True)

    def _stop_ray(self) -> None:
        if self._ray_root is None:
            return
        from eventlog.dataplane.raysession import kill_ray_session

        stopped = kill_ray_session(self._ray_root)
        if stopped:
            self.observer.phase(f"stopped {len(stopped)} orphaned Ray/TQ processes by PID")

    def _command(self, number: int) -> list[str]:
        options = self.options
        command = [
            sys.executable,
            "-m",
            "eventlog.demo.child",
            "--target",
            options.target,
            "--run-dir",
            str(self.run_dir),
            "--model",
            str(options.model_dir),
            "--data-plane",
            options.data_plane,
            "--workers",
            options.workers,
            "--settings",
            json.dumps(asdict(options.settings)),
            "--report",
            str(self.run_dir / f"controller-{number}.json"),
        ]
        if self._ray_root is not None:
            command += ["--ray-root", self._ray_root]
        if not options.faults:
            command.append("--no-faults")
        return command

    def _run_controller(
        self, log: EventLog, number: int, *, armed: bool, result: DemoRun
    ) -> ControllerRun:
        output = self.run_dir / f"controller-{number}.log"
        env = dict(os.environ)
        env.setdefault(
            "TORCHINDUCTOR_CACHE_DIR", str(self.options.model_dir.parent / "torchinductor")
        )
        started = time.monotonic()
        with open(output, "wb") as sink:
            proc = subprocess.Popen(
                self._command(number), stdout=sink, stderr=subprocess.STDOUT, env=env
            )
        run = ControllerRun(number=number, pid=proc.pid, output=output, first_seq=self._cursor + 1)
        result.runs.append(run)
        what = "fresh run" if number == 1 else "restore from the newest checkpoint"
        self.observer.phase(f"controller #{number} started (pid {proc.pid}, {what})")
        watch = _Watch(self.options, armed)
        deadline = started + self.options.timeout_s
        try:
            while True:
                exited = proc.poll() is not None
                for record in log.read(from_seq=self._cursor + 1):
                    self._cursor = record.seq
                    self.observer.record(record)
                    if not run.killed and watch.due(record):
                        os.kill(proc.pid, signal.SIGKILL)
                        proc.wait()
                        run.killed = True
                        result.kill = KillPoint(
                            pid=proc.pid,
                            seq=log.head(),
                            checkpoint_step=watch.checkpoint_step or 0,
                            seals_since_checkpoint=watch.seals,
                            half_sealed=list(watch.half_sealed),
                        )
                        self.observer.phase(
                            f"SIGKILL controller #{number} (pid {proc.pid}) at seq "
                            f"{result.kill.seq}: {watch.seals} sibling results sealed since "
                            f"checkpoint step {watch.checkpoint_step}"
                        )
                        self._stop_ray()
                if exited or run.killed:
                    # Read what the process wrote before it went (killed: nothing more comes).
                    for record in log.read(from_seq=self._cursor + 1):
                        self._cursor = record.seq
                        self.observer.record(record)
                    break
                if time.monotonic() > deadline:
                    raise DemoError(
                        f"controller #{number} ran past the {self.options.timeout_s:.0f} s "
                        f"limit; see {output}"
                    )
                time.sleep(self.options.poll_s)
        finally:
            if proc.poll() is None:  # an error or Ctrl-C in the parent: never leave it running
                proc.kill()
                proc.wait()
        run.returncode = proc.returncode
        run.wall_s = time.monotonic() - started
        run.last_seq = self._cursor
        report = self.run_dir / f"controller-{number}.json"
        if report.is_file():
            run.report = json.loads(report.read_text())
        if not run.killed:
            self.observer.phase(
                f"controller #{number} exited with {run.returncode} after {run.wall_s:.1f} s"
            )
        if run.returncode != 0 and not run.killed:
            raise DemoError(
                f"controller #{number} exited with {run.returncode}; see {output}",
                hint=_tail(output),
            )
        return run


def _tail(path: Path, lines: int = 1) -> str:
    """The last error-looking line of a controller's output (for a one-line hint)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"see {path}"
    for line in reversed(text):
        if "Error" in line or "error" in line:
            return line.strip()[:300]
    return "\n".join(text[-lines:])[:300] or f"see {path}"
