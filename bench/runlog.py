"""A realistic run log for the replay benchmark, generated once and cached.

It simulates what a controller and its rollout workers record over many train steps: prompt
groups reserved and admitted in admissions of 8, siblings dispatched, workers appending
GenerationStarted / TokensStaged per call / GenerationFinished (or GenerationFailed), seals
(SiblingSealed, or GroupSealed under `prompt_group`), failures with retries, abandoned groups
whose late results are rejected, finalization, replay selection and consumption at each train
step, and a checkpoint (with its data-plane checkpoint and projection snapshot) every tenth of
the log, the newest one a fixed tail before the log's end. Several hundred groups are in
flight at once and their records interleave at random.

Speed: the controller's rules are checked by the same fold the ledger uses
(`projections.siblings.fold`, which raises on any event the ledger would refuse), but the
records go to the log in `append_batch` calls of ~2000 events with durability "normal",
not one command per commit, so 10^6 records take about a minute instead of an hour.
The result is the same log a RecoveryLedger would have written: `RecoveryLedger.restore`
accepts it (same digests, snapshots, data-plane checkpoints, prompt fingerprints).

The cache lives in `.cache/bench/` (git-ignored), keyed by GENERATOR_VERSION, record count
and seed; bump GENERATOR_VERSION whenever the generated log would change.
"""

from __future__ import annotations

import bisect
import json
import logging
import random
import shutil
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eventlog import EventLog
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.events import Event
from eventlog.records import NO_STREAM, AppendRequest, ExpectedVersion
from eventlog.recovery.checkpoint import live_versions, save_snapshot
from eventlog.recovery.config import DEFAULT_TRAINING_PARTITION
from eventlog.recovery.restore import Prompt, prompt_digest
from eventlog.recovery.vocabulary import (
    CONTROLLER_STREAM,
    REPLAY_STREAM,
    AttemptFailed,
    CheckpointCommitted,
    FinalizationStarted,
    GenerationFailed,
    GenerationFinished,
    GenerationStarted,
    GroupAdmitted,
    GroupFinalized,
    GroupReserved,
    GroupSealed,
    PromptRef,
    Receipt,
    ReplayConsumed,
    ReplaySelected,
    SealResult,
    SiblingsDispatched,
    SiblingSealed,
    StaleResultRejected,
    TokensStaged,
    attempt_stream,
    group_stream,
    logical_id,
)
from projections.recovery import abandon_events, attempt_ref, retry_events
from projections.siblings import GroupState, LedgerState, fold, state_digest
from projections.version import PROJECTION_VERSION

logger = logging.getLogger(__name__)

GENERATOR_VERSION = 7
"""Bump when the generated log changes; cached logs of other versions are rebuilt (3: the
in-memory data plane checkpoints in its own format, and logs at migration head; 4: snapshots
and checkpoints carry the projection version, without which a restore does not trust them;
5: every log of 76,800 records or more holds IN_FLIGHT groups in flight; 6: the newest
checkpoint lies TAIL records before the end of every log of 10 × TAIL records or more; 7: a
long log trains every RECORDS_PER_STEP records)."""

REPO = Path(__file__).resolve().parents[1]
CACHE_DIR = REPO / ".cache" / "bench"
STAGING = "rollout_staging"

SIBLINGS = 16
CALLS = 2
"""Model calls per attempt: one TokensStaged each."""
ADMISSION = 8
FAIL_RATE = 0.03
PROMPT_GROUP_SHARE = 0.15
FLUSH_EVENTS = 2000
IN_FLIGHT = 512
"""Groups in flight in a long log. Logs of different lengths hold the same live work, so a
restore measured on each (bench.replay's flatness) differs only in the history behind it."""
RECORDS_PER_GROUP_IN_FLIGHT = 150
"""A short log holds fewer in flight (one per this many records, at least four admissions),
so its groups still get finalized and trained."""
CHECKPOINTS = 10
TAIL = 10_000
"""Records after a long log's newest checkpoint (a tenth of the log in a short one). A run
checkpoints every so many steps, so what a restore rolls back is bounded by that interval,
not by the history behind it: logs of different lengths end with the same tail."""
TRAIN_STEPS = 40
RECORDS_PER_STEP = 2_500
"""A long log trains every this many records (a short one TRAIN_STEPS times): a run trains a
batch at a time, so the finalized groups waiting in the replay buffer (and their canonical rows
in a checkpoint) do not grow with the log either."""
TASKS = ("math", "code", "chat")
AGENTS = ("math_agent", "code_agent", "chat_agent", None)


def records_per_step(records: int) -> int:
    """How many records the generator writes between two train steps."""
    return max(1, min(RECORDS_PER_STEP, records // TRAIN_STEPS))


def checkpoint_positions(records: int) -> list[int]:
    """Where the generator checkpoints (records written): every tenth of the log, and the
    newest min(TAIL, a tenth) records before its end."""
    every = records // CHECKPOINTS
    if every == 0:
        return []
    newest = records - min(TAIL, every)
    return [k * every for k in range(1, CHECKPOINTS) if k * every < newest] + [newest]


def prompt_for(number: int) -> dict[str, Any]:
    """The dataset prompt of the `number`-th group (deterministic, so a restore can rehydrate)."""
    task, agent = TASKS[number % len(TASKS)], AGENTS[number % len(AGENTS)]
    prompt: dict[str, Any] = {
        "prompt_id": f"p{number}",
        "task_name": task,
        "text": f"prompt number {number} for task {task}",
    }
    if agent is not None:
        prompt["extra_env_info"] = {"agent_ref": {"name": agent}}
    return prompt


class RunDataset:
    """The generated run's dataset: sample `s{n}` is `prompt_for(n)`."""

    def get(self, sample_id: str) -> Prompt:
        if not sample_id.startswith("s") or not sample_id[1:].isdigit():
            raise KeyError(sample_id)
        return prompt_for(int(sample_id[1:]))


@dataclass(frozen=True)
class RunLog:
    """A generated log in the cache: its file, its data-plane checkpoints and its figures."""

    directory: Path
    manifest: dict[str, Any]

    @property
    def path(self) -> Path:
        return self.directory / "run.db"

    @property
    def records(self) -> int:
        return int(self.manifest["head"])


@dataclass
class _Worker:
    """What a rollout worker knows about one attempt while it runs it."""

    group_id: str
    index: int
    attempt: int
    rollout_id: str
    step: int = 0
    """0: not started; 1..CALLS: that many calls staged; CALLS + 1: finished (result pending)."""
    keys: list[str] = field(default_factory=list)
    tokens: int = 0


def in_flight_for(records: int) -> int:
    """Groups the generator keeps in flight in a log of `records` records."""
    return max(ADMISSION * 4, min(IN_FLIGHT, records // RECORDS_PER_GROUP_IN_FLIGHT))


class _Generator:
    """Drives the simulated run; every group event is checked by the ledger's fold first."""

    def __init__(self, log: EventLog, directory: Path, records: int, seed: int) -> None:
        self.log = log
        self.directory = directory
        self.target = records
        self.rng = random.Random(seed)
        self.state = LedgerState()
        self.versions: dict[str, int] = {}
        self.ledger_versions: dict[str, int] = {}
        """Versions of the streams a live ledger appends to (what its snapshot stores)."""
        self.pending: list[tuple[str, list[Event], ExpectedVersion]] = []
        """Requests of the next append_batch, in order; consecutive events of a stream merged."""
        self.pending_events = 0
        self.written = 0
        self.live: list[str] = []
        self.live_at: dict[str, int] = {}
        self.in_flight = in_flight_for(records)
        self.next_group = 0
        self.admissions: list[str] = []
        self.workers: dict[str, _Worker] = {}
        self.results: dict[str, dict[int, SealResult]] = {}
        self.staged: dict[str, list[str]] = {}
        """Staging keys every attempt of a live group put in the data plane (until finalized)."""
        self.step = 0
        self.checkpoints: list[dict[str, Any]] = []
        self.counts: dict[str, int] = {}

    # -- output ----------------------------------------------------------------------------

    def emit(self, stream: str, *events: Event) -> None:
        """Queue events for one stream (folded first when they are the ledger's)."""
        if not stream.startswith("attempt/"):
            for event in events:
                fold(self.state, event)  # raises RuleViolation on anything the ledger refuses
        version = self.versions.get(stream)
        if self.pending and self.pending[-1][0] == stream:
            self.pending[-1][1].extend(events)
        else:
            self.pending.append((stream, list(events), NO_STREAM if version is None else version))
        new_version = (-1 if version is None else version) + len(events)
        self.versions[stream] = new_version
        if not stream.startswith("attempt/"):
            self.ledger_versions[stream] = new_version
        for event in events:
            name = type(event).__name__
            self.counts[name] = self.counts.get(name, 0) + 1
        self.pending_events += len(events)
        self.written += len(events)
        if self.pending_events >= FLUSH_EVENTS:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.log.append_batch([AppendRequest(s, evs, exp) for s, evs, exp in self.pending])
        self.pending, self.pending_events = [], 0

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> None:
        checkpoints = checkpoint_positions(self.target)
        step_every = records_per_step(self.target)
        next_step = step_every
        while self.written < self.target:
            self.tick()
            if self.written >= next_step:
                next_step += step_every
                self.train_step()
            if checkpoints and self.written >= checkpoints[0]:
                del checkpoints[: bisect.bisect_right(checkpoints, self.written)]
                self.checkpoint()
        self.flush()

    def tick(self) -> None:
        if len(self.live) < self.in_flight:
            self.reserve_admission()
            return
        if self.admissions and self.rng.random() < 0.02:
            self.admit(self.admissions.pop(0))
            return
        gid = self.live[self.rng.randrange(len(self.live))]
        self.advance(self.state.groups[gid])

    def reserve_admission(self) -> None:
        admission = f"adm-{self.next_group:07d}"
        for _ in range(ADMISSION):
            number = self.next_group
            self.next_group += 1
            gid = f"grp-{number:07d}-{self.rng.getrandbits(24):06x}"
            prompt = prompt_for(number)
            task = prompt["task_name"]
            agent = AGENTS[number % len(AGENTS)]
            granularity = "prompt_group" if self.rng.random() < PROMPT_GROUP_SHARE else "sibling"
            self.emit(
                group_stream(gid),
                GroupReserved(
                    group_id=gid,
                    admission_id=admission,
                    prompt_ref=PromptRef(sample_id=f"s{number}", task_name=task),
                    prompt_id=prompt["prompt_id"],
                    prompt_hash=prompt_digest(prompt),
                    agent_name=agent,
                    granularity=granularity,  # type: ignore[arg-type]
                    expected_generations=SIBLINGS,
                    target_step=None,
                    start_weight_version=self.step,
                    admitted=False,
                ),
            )
            self.live_at[gid] = len(self.live)
            self.live.append(gid)
            self.staged[gid] = []
        self.admissions.append(admission)

    def admit(self, admission: str) -> None:
        for gid in self.state.admissions.get(admission, ()):
            self.emit(
                group_stream(gid),
                GroupAdmitted(
                    group_id=gid,
                    admission_id=admission,
                    target_step=self.step + 1,
                    start_weight_version=self.step,
                ),
            )

    def advance(self, group: GroupState) -> None:
        """One action on one group: the controller's or one of its workers'."""
        if group.phase == "reserved":
            if group.admission_id in self.admissions:
                self.admissions.remove(group.admission_id)
                self.admit(group.admission_id)
            return
        if group.status == "ready_to_finalize":
            self.finalize(group)
            return
        gid = group.group_id
        if group.granularity == "prompt_group":
            if group.indices("failed"):
                self.abandon_group(group)
                return
            if len(self.results.get(gid, {})) == SIBLINGS:
                results = self.results.pop(gid)
                self.emit(
                    group_stream(gid),
                    GroupSealed(group_id=gid, results=[results[i] for i in range(SIBLINGS)]),
                )
                return
        choices: list[int] = []
        if group.indices("reserved"):
            choices.append(-1)
        if group.indices("failed", "abandoned"):
            choices.append(-2)
        for sibling in group.siblings:
            current = sibling.current
            if current.status == "dispatched":
                worker = self.workers.get(current.rollout_id)
                if worker is None or worker.step <= CALLS:
                    choices.append(sibling.generation_index)
        if not choices:
            return
        pick = choices[self.rng.randrange(len(choices))]
        if pick == -1:
            refs = [attempt_ref(i, group.siblings[i].current) for i in group.indices("reserved")]
            self.emit(group_stream(gid), SiblingsDispatched(group_id=gid, attempts=refs))
        elif pick == -2:
            self.emit(group_stream(gid), *retry_events(group))
        else:
            self.work(group, pick)

    def work(self, group: GroupState, index: int) -> None:
        """The worker running this sibling's current attempt takes its next step."""
        current = group.siblings[index].current
        rid = current.rollout_id
        worker = self.workers.get(rid)
        if worker is None:
            worker = _Worker(group.group_id, index, current.attempt, rid)
            self.workers[rid] = worker
            self.emit(
                attempt_stream(rid),
                GenerationStarted(
                    rollout_id=rid,
                    group_id=group.group_id,
                    generation_index=index,
                    attempt=current.attempt,
                    worker=f"worker-{self.rng.randrange(8)}",
                    model="bench-model",
                    weight_version=self.step,
                    sampling_params={"temperature": 1.0, "max_tokens": 256, "seed": index},
                ),
            )
            return
        if worker.step < CALLS:
            key = f"{rid}/call-{worker.step}"
            tokens = self.rng.randrange(16, 256)
            worker.step += 1
            worker.keys.append(key)
            worker.tokens += tokens
            self.staged[group.group_id].append(key)
            self.emit(
                attempt_stream(rid),
                TokensStaged(
                    rollout_id=rid,
                    partition=STAGING,
                    staging_key=key,
                    token_count=tokens,
                    weight_version=self.step,
                ),
            )
            return
        worker.step += 1
        gid = group.group_id
        if self.rng.random() < FAIL_RATE:
            del self.workers[rid]
            self.emit(attempt_stream(rid), GenerationFailed(rollout_id=rid, error="worker lost"))
            self.emit(
                group_stream(gid),
                AttemptFailed(
                    group_id=gid,
                    generation_index=index,
                    attempt=current.attempt,
                    rollout_id=rid,
                    error="worker lost",
                ),
            )
            return
        reward = round(self.rng.random(), 4)
        mask = self.rng.random() < 0.05
        self.emit(
            attempt_stream(rid),
            GenerationFinished(
                rollout_id=rid,
                finish_reason="stop",
                token_count=worker.tokens,
                reward=reward,
                staging_keys=list(worker.keys),
            ),
        )
        receipt = Receipt(rollout_id=rid, staging_keys=list(worker.keys))
        if group.granularity == "prompt_group":
            self.results.setdefault(gid, {})[index] = SealResult(
                generation_index=index,
                attempt=current.attempt,
                rollout_id=rid,
                receipt=receipt,
                reward=reward,
                mask_sample=mask,
            )
            return
        del self.workers[rid]
        self.emit(
            group_stream(gid),
            SiblingSealed(
                group_id=gid,
                generation_index=index,
                attempt=current.attempt,
                rollout_id=rid,
                receipt=receipt,
                reward=reward,
                mask_sample=mask,
            ),
        )

    def abandon_group(self, group: GroupState) -> None:
        """A `prompt_group` sibling failed: abandon all; late results of the others arrive."""
        gid = group.group_id
        self.results.pop(gid, None)
        events = abandon_events(group, "sibling failed")
        self.emit(group_stream(gid), *events)
        for sibling in group.siblings:
            rid = sibling.current.rollout_id
            worker = self.workers.pop(rid, None)
            if worker is None or worker.step > CALLS:
                continue  # never started, or finished before the failure: nothing arrives late
            if self.rng.random() < 0.5:
                continue  # killed: GenerationStarted without an outcome
            self.emit(
                attempt_stream(rid),
                GenerationFinished(
                    rollout_id=rid,
                    finish_reason="stop",
                    token_count=worker.tokens,
                    reward=None,
                    staging_keys=list(worker.keys),
                ),
            )
            self.emit(
                group_stream(gid),
                StaleResultRejected(
                    group_id=gid,
                    generation_index=sibling.generation_index,
                    rollout_id=rid,
                    current_rollout_id=rid,
                    reason=f"attempt {sibling.current.attempt} ({rid!r}) was abandoned",
                ),
            )

    def finalize(self, group: GroupState) -> None:
        gid = group.group_id
        owner = "finalizer-0"
        self.emit(
            group_stream(gid),
            FinalizationStarted(group_id=gid, owner=owner),
            GroupFinalized(
                group_id=gid,
                owner=owner,
                prompt_id=group.prompt_id,
                target_step=group.target_step,
                canonical_row_ids=[logical_id(gid, i) for i in range(SIBLINGS)],
                min_weight_version=group.start_weight_version,
            ),
        )
        for sibling in group.siblings:
            self.workers.pop(sibling.current.rollout_id, None)
        self.staged.pop(gid, None)  # the finalizer turned them into canonical rows
        at = self.live_at.pop(gid)
        last = self.live.pop()
        if last != gid:
            self.live[at] = last
            self.live_at[last] = at

    def train_step(self) -> None:
        """The trainer takes every ready finalized group (by id), in chunks of 128."""
        self.step += 1
        ready = sorted(g for g, entry in self.state.replay.items() if entry.status == "ready")
        for start in range(0, len(ready), 128):
            chunk = ready[start : start + 128]
            self.emit(
                REPLAY_STREAM,
                ReplaySelected(group_ids=chunk, step=self.step),
                ReplayConsumed(group_ids=chunk, step=self.step),
            )

    def checkpoint(self) -> None:
        """What `RecoveryLedger.checkpoint` stores: data plane, CheckpointCommitted, snapshot."""
        self.flush()
        data_plane = InMemoryDataPlane()
        token_row = {"token_ids": torch.arange(32, dtype=torch.int32)}
        keys = [key for keys in self.staged.values() for key in keys]
        # tagged as the rollout worker tags its rows (eventlog.rollout.worker)
        tags = {}
        for key in keys:
            rollout_id, _, call = key.rpartition("/call-")
            tags[key] = {"rollout_id": rollout_id, "call": call}
        data_plane.put_rows(STAGING, dict.fromkeys(keys, token_row), tags)
        # the canonical rows the finalizer wrote for finalized groups not yet trained
        canonical = [row for e in self.state.replay.values() for row in e.canonical_row_ids]
        data_plane.put_rows(DEFAULT_TRAINING_PARTITION, dict.fromkeys(canonical, token_row))
        directory = self.directory / f"step_{self.step}" / "data_plane"
        saved = data_plane.save_checkpoint(str(directory))
        covers_seq, chain = self.log.tail_chain()
        event = CheckpointCommitted(
            step=self.step,
            data_plane_ref=saved.ref,
            inventory_digest=saved.inventory_digest,
            row_count=saved.row_count,
            ledger_digest=state_digest(self.state),
            projection_version=PROJECTION_VERSION,
            group_count=len(self.state.groups),
            covers_seq=covers_seq,
            chain=chain.hex(),
        )
        self.emit(CONTROLLER_STREAM, event)
        self.flush()
        seq = self.log.head()
        versions = self.ledger_versions = live_versions(self.state, self.ledger_versions)
        snapshot_bytes = save_snapshot(self.log, seq, self.state, versions)
        self.checkpoints.append(
            {
                "step": self.step,
                "seq": seq,
                "groups": len(self.state.groups),
                "replay": len(self.state.replay),
                "rows": saved.row_count,
                "snapshot_bytes": snapshot_bytes,
            }
        )


def cache_key(records: int, seed: int) -> str:
    return f"runlog-v{GENERATOR_VERSION}-{records}-s{seed}"


def _usable(directory: Path, records: int) -> dict[str, Any] | None:
    manifest_path = directory / "manifest.json"
    if not manifest_path.is_file() or not (directory / "run.db").is_file():
        return None
    try:
        manifest: dict[str, Any] = json.loads(manifest_path.read_text())
    except ValueError:
        return None
    if manifest.get("generator_version") != GENERATOR_VERSION or manifest.get("target") != records:
        return None
    # Data-plane refs are absolute paths: a moved checkout needs a fresh log.
    refs = [Path(c["data_plane_ref"]) for c in manifest.get("checkpoints", [])]
    if not all(ref.is_dir() for ref in refs):
        return None
    return manifest


def run_log(
    records: int, *, seed: int = 11, cache_dir: Path = CACHE_DIR, rebuild: bool = False
) -> tuple[RunLog, bool]:
    """The cached log of `records` records, generated first if needed; (log, was_cached)."""
    directory = cache_dir / cache_key(records, seed)
    manifest = None if rebuild else _usable(directory, records)
    if manifest is not None:
        return RunLog(directory, manifest), True
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    started = time.perf_counter()
    cpu = time.process_time()
    with EventLog.open(directory / "run.db", durability="normal") as log:
        generator = _Generator(log, directory, records, seed)
        generator.run()
        head = log.head()
        controller = [r for r in log.read_stream(CONTROLLER_STREAM)]
        refs = {r.seq: r.event.data_plane_ref for r in controller}  # type: ignore[attr-defined]
    with sqlite3.connect(directory / "run.db") as conn:  # fold the WAL in: one file to copy
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    for checkpoint in generator.checkpoints:
        checkpoint["data_plane_ref"] = refs[checkpoint["seq"]]
    manifest = {
        "generator_version": GENERATOR_VERSION,
        "target": records,
        "seed": seed,
        "head": head,
        "groups": generator.next_group,
        "in_flight": generator.in_flight,
        "train_steps": generator.step,
        "checkpoints": generator.checkpoints,
        "types": dict(sorted(generator.counts.items(), key=lambda kv: -kv[1])),
        "file_bytes": (directory / "run.db").stat().st_size,
        "generation_s": round(time.perf_counter() - started, 2),
        "generation_cpu_s": round(time.process_time() - cpu, 2),
    }
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    logger.info("generated %d records in %.1f s at %s", head, manifest["generation_s"], directory)
    return RunLog(directory, manifest), False


def copy_log(source: RunLog, target: Path, *, keep_snapshots: bool) -> Path:
    """A private copy of the log file (a restore appends to it); optionally without snapshots.

    Without snapshots the copy is what a crash right after a CheckpointCommitted append
    leaves behind: every restore has to fold from seq 1 (eventlog.checkpoint's fallback).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source.path, target)
    if not keep_snapshots:
        with sqlite3.connect(target) as conn:
            conn.execute("DELETE FROM snapshots")
        conn.close()
    return target


def describe(run: Mapping[str, Any], keys: Sequence[str] = ("head", "groups")) -> str:
    return ", ".join(f"{k} {run[k]:,}" for k in keys if k in run)
