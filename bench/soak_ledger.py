"""The ledger soak: a controller SIGKILLed at random moments, between and inside its commands.

Each round forks a controller. It restores the ledger from the newest checkpoint (its
in-memory data plane died with the previous controller), then runs commands at random until
it is killed: reserve, dispatch, stage rows and seal, fail and retry, finalize (canonical rows
first), train (replay select and consume), clear superseded rows, and every few commands a
checkpoint into one reused directory (`keep=2`, so older checkpoints are retired). It writes
each checkpoint to an acknowledgement file only after `checkpoint` returned. The parent kills
it after a random delay, so kills land inside restores, checkpoints and commands as well as
between them, and then checks, on the log as the kill left it:

- the log verifies, and folds without a rule violation;
- a restore (a new controller, a new epoch) succeeds, to a checkpoint no older than the newest
  acknowledged one; then every row the ledger references is in the data plane, no staging row
  is left unreferenced, the training partition holds exactly the finalized groups' canonical
  rows, and the restored state equals a fold of the log.

`python -m bench.soak --ledger [--kills N]` (DURABILITY.md §9, RELIABILITY.md).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eventlog import EventLog
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.records import ANY
from eventlog.recovery.barrier import MutationBarrier
from eventlog.recovery.config import DEFAULT_STAGING_PARTITION, DEFAULT_TRAINING_PARTITION
from eventlog.recovery.errors import LedgerRuleError
from eventlog.recovery.ledger import RecoveryLedger
from eventlog.recovery.vocabulary import (
    PromptRef,
    Receipt,
    TokensStaged,
    attempt_stream,
)
from projections.siblings import state_digest

STAGING = DEFAULT_STAGING_PARTITION
TRAINING = DEFAULT_TRAINING_PARTITION
IN_FLIGHT = 6
CHECKPOINT_EVERY = 12


@dataclass
class LedgerSoakReport:
    kills: int = 0
    restores: int = 0
    commands_acked: int = 0
    checkpoints_acked: int = 0
    checkpoint_kept: int = 0
    """Restores that landed on the newest acknowledged checkpoint or a newer one (must be all)."""
    restored_steps: dict[str, int] = field(default_factory=dict)
    logs: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures and self.checkpoint_kept == self.restores == self.kills


class Dataset:
    """Prompts come back by sample id, as a dataloader gives them."""

    def get(self, sample_id: str) -> dict[str, Any]:
        return prompt_for(sample_id)


def prompt_for(sample_id: str) -> dict[str, Any]:
    return {"prompt_id": f"p-{sample_id}", "task_name": "math", "text": f"q{sample_id}"}


def stage_rows(
    ledger: RecoveryLedger, log: EventLog, rollout_id: str, calls: int, tokens: int = 4
) -> Receipt:
    """What a worker does: put tagged rows, then record TokensStaged (outside the barrier)."""
    keys = [f"{rollout_id}/call-{c}" for c in range(calls)]
    tags = {k: {"rollout_id": rollout_id, "call": str(c)} for c, k in enumerate(keys)}
    rows = {k: {"token_ids": torch.arange(tokens)} for k in keys}
    ledger.data_plane.put_rows(STAGING, rows, tags)
    staged = [
        TokensStaged(
            rollout_id=rollout_id,
            partition=STAGING,
            staging_key=k,
            token_count=tokens,
            weight_version=0,
        )
        for k in keys
    ]
    log.append(attempt_stream(rollout_id), staged, ANY)
    return Receipt(rollout_id=rollout_id, staging_keys=keys)


async def _controller(target: str, directory: str, ack: int, seed: int) -> None:
    rng = random.Random(seed)
    barrier = MutationBarrier()
    with EventLog.open(target, create=False) as log:
        ledger = RecoveryLedger(log, InMemoryDataPlane(), barrier=barrier)
        step = 1
        try:
            async with barrier.mutation("recovery_restore") as cut:
                plan = ledger.restore(cut, Dataset())
            step = plan.checkpoint_step + 1
        except LedgerRuleError:  # the first controller of this log: nothing to restore yet
            ledger = RecoveryLedger.open(log, InMemoryDataPlane(), barrier=barrier)
            async with barrier.checkpoint() as cut:
                ledger.checkpoint(cut, step=0, directory=directory, keep=2)
        commands = 0
        while True:
            async with barrier.mutation("command") as cut:
                _one_command(ledger, log, cut, rng, step)
            commands += 1
            os.write(ack, b"command\n")
            if commands % CHECKPOINT_EVERY == 0:
                async with barrier.checkpoint() as cut:
                    event = ledger.checkpoint(cut, step=step, directory=directory, keep=2)
                os.write(ack, f"checkpoint {event.step} {event.covers_seq}\n".encode())
                step += 1


def _one_command(
    ledger: RecoveryLedger, log: EventLog, cut: Any, rng: random.Random, step: int
) -> None:
    state = ledger.state
    live = [g for g in state.groups.values() if g.status not in ("finalized", "discarded")]
    if len(live) < IN_FLIGHT and rng.random() < 0.5:
        sample = uuid.uuid4().hex[:10]
        ledger.reserve(
            cut,
            group_id=f"g{sample}",
            prompt=prompt_for(sample),
            prompt_ref=PromptRef(sample_id=sample, task_name="math"),
            expected_generations=2,
            start_weight_version=0,
            admitted=True,
            target_step=step,
            granularity="sibling",
        )
        return
    if state.replay and rng.random() < 0.2:
        ready = [gid for gid, e in state.replay.items() if e.status == "ready"]
        if ready:
            ledger.replay.select(cut, ready, step=step)
            ledger.replay.consume(cut, ready, step=step)
            return
    if rng.random() < 0.05:
        ledger.clear_superseded_rows(cut)
        return
    if not live:
        return
    group = rng.choice(live)
    gid = group.group_id
    if group.status == "ready_to_finalize":
        inputs = ledger.start_finalization(cut, gid, owner="soak")
        rows = {row: {"token_ids": torch.arange(4)} for row in inputs.canonical_row_ids}
        ledger.data_plane.put_rows(TRAINING, rows)
        ledger.finalize(cut, gid, owner="soak", min_weight_version=0)
        return
    for sibling in group.siblings:
        attempt = sibling.current
        index = sibling.generation_index
        if attempt.status == "reserved":
            ledger.dispatch(cut, gid)
            return
        if attempt.status in ("failed", "abandoned"):
            ledger.prepare_retry(cut, gid)
            return
        if attempt.status == "dispatched":
            if rng.random() < 0.2:
                ledger.fail_attempt(cut, gid, index, rollout_id=attempt.rollout_id, error="soak")
                return
            receipt = stage_rows(ledger, log, attempt.rollout_id, rng.randint(1, 3))
            ledger.seal_sibling(
                cut,
                gid,
                index,
                rollout_id=attempt.rollout_id,
                receipt=receipt,
                reward=rng.random(),
                mask_sample=False,
            )
            return


def _child(target: str, directory: str, ack_path: Path, seed: int) -> None:
    """The forked controller: runs until it is killed (never returns to the caller's code)."""
    code = 0
    try:
        ack = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        asyncio.run(_controller(target, directory, ack, seed))
    except BaseException:  # anything but the kill is a finding: the parent sees exit 3
        import traceback

        traceback.print_exc()
        code = 3
    finally:
        os._exit(code)


def _acked_checkpoint(ack_path: Path) -> tuple[int, int]:
    """(commands, newest acknowledged checkpoint's covered seq) from one controller's acks."""
    commands, newest = 0, -1
    if ack_path.exists():
        for line in ack_path.read_text().splitlines():
            if line == "command":
                commands += 1
            elif line.startswith("checkpoint "):
                newest = max(newest, int(line.split()[2]))
    return commands, newest


def _check(target: str, newest_acked: int, report: LedgerSoakReport, where: str) -> None:
    """After a kill: a new controller restores, and everything it holds is consistent."""
    barrier = MutationBarrier()
    with EventLog.open(target, create=False) as log:
        if not log.verify().ok:
            report.failures.append(f"{where}: verify failed")
        RecoveryLedger.open(log, InMemoryDataPlane(), read_only=True)  # folds, or raises
        data_plane = InMemoryDataPlane()
        ledger = RecoveryLedger(log, data_plane, barrier=barrier)

        async def restore() -> Any:
            async with barrier.mutation("recovery_restore") as cut:
                return ledger.restore(cut, Dataset())

        try:
            plan = asyncio.run(restore())
        except LedgerRuleError as exc:
            if newest_acked >= 0 or "no checkpoint" not in str(exc):
                raise
            # Killed before this log's first checkpoint: a new controller opens it instead.
            RecoveryLedger.open(log, InMemoryDataPlane())
            report.restores += 1
            report.checkpoint_kept += 1
            report.restored_steps["none"] = report.restored_steps.get("none", 0) + 1
            return
        report.restores += 1
        ckpt = next(
            r.event for r in log.read(from_seq=plan.checkpoint_seq, until_seq=plan.checkpoint_seq)
        )
        covers = getattr(ckpt, "covers_seq", -1)
        if covers >= newest_acked:
            report.checkpoint_kept += 1
        else:
            report.failures.append(
                f"{where}: restored a checkpoint covering seq {covers}, older than the "
                f"acknowledged one covering {newest_acked}"
            )
        key = str(plan.checkpoint_step)
        report.restored_steps[key] = report.restored_steps.get(key, 0) + 1
        ledger.check_rows()
        state = ledger.state
        owned = {k for g in state.groups.values() for k in g.staging_keys()}
        staged = set(data_plane.list_keys(STAGING))
        if staged != owned:
            report.failures.append(
                f"{where}: staging rows {sorted(staged - owned)[:3]} unreferenced, "
                f"{sorted(owned - staged)[:3]} missing"
            )
        canonical = {row for e in state.replay.values() for row in e.canonical_row_ids}
        trained = set(data_plane.list_keys(TRAINING))
        if trained != canonical:
            report.failures.append(
                f"{where}: training rows {sorted(trained - canonical)[:3]} unowned, "
                f"{sorted(canonical - trained)[:3]} missing"
            )
        rebuilt = RecoveryLedger.open(log, InMemoryDataPlane(), read_only=True)
        if state_digest(rebuilt.state) != ledger.digest():
            report.failures.append(f"{where}: the restored state differs from the log's fold")


def run_ledger_soak(
    *,
    kills: int,
    rotate: int = 25,
    min_delay: float = 0.05,
    max_delay: float = 0.6,
    seed: int = 0,
    workdir: Path | None = None,
) -> LedgerSoakReport:
    """Kill `kills` controllers; a new SQLite log (and checkpoint directory) every `rotate`."""
    rng = random.Random(seed)
    report = LedgerSoakReport()
    started = time.monotonic()
    scratch = Path(workdir or tempfile.mkdtemp(prefix="eventlog-ledger-soak-"))
    target, directory, newest = "", "", -1
    for kill in range(kills):
        if kill % rotate == 0:
            target = str(scratch / f"ledger{report.logs}.db")
            directory = str(scratch / f"checkpoints{report.logs}")
            EventLog.open(target).close()
            report.logs += 1
            newest = -1
        ack_path = scratch / f"ack{kill}"
        delay = rng.uniform(min_delay, max_delay)
        pid = os.fork()
        if pid == 0:
            _child(target, directory, ack_path, seed * 100_003 + kill)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0:
            report.failures.append(f"kill {kill}: the controller failed before the kill")
        commands, acked = _acked_checkpoint(ack_path)
        report.commands_acked += commands
        if acked >= 0:
            report.checkpoints_acked += 1
        newest = max(newest, acked)
        report.kills += 1
        where = f"kill {kill} (after {delay * 1000:.0f} ms, {commands} commands)"
        try:
            _check(target, newest, report, where)
        except Exception as exc:  # a restore that fails is the finding
            report.failures.append(f"{where}: {type(exc).__name__}: {exc}")
        ack_path.unlink(missing_ok=True)
    report.seconds = round(time.monotonic() - started, 1)
    return report
