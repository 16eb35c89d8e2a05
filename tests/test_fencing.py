"""Fencing: a controller that opens or restores the ledger supersedes every older one.

The takeover runs in a second real process (the way a restarted controller meets a zombie),
on both backends; a superseded controller's next command is a ControllerFencedError naming
both epochs and appends nothing. A ledger is bound to its barrier.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch

from eventlog import EventLog
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.dataplane.protocol import DataPlaneCheckpoint
from eventlog.errors import ConcurrencyError
from eventlog.recovery.barrier import Cut, MutationBarrier
from eventlog.recovery.checkpoint import checkpoint_location
from eventlog.recovery.errors import BarrierError, ControllerFencedError, LedgerRuleError
from eventlog.recovery.ledger import RecoveryLedger
from eventlog.recovery.vocabulary import (
    CONTROLLER_STREAM,
    EPOCH_STREAM,
    CheckpointCommitted,
    ControllerEpochStarted,
    PromptRef,
)
from tests.fixtures.ledger import (  # noqa: F401
    STAGING,
    Harness,
    backend_harness_fixture,
    last_json_of_child,
    log_backend_harness_fixture,
    make_prompt,
)

T = TypeVar("T")

_CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    from eventlog import EventLog
    from eventlog.recovery.barrier import MutationBarrier
    from eventlog.dataplane.memory import InMemoryDataPlane
    from eventlog.recovery.ledger import RecoveryLedger
    from eventlog.recovery.vocabulary import PromptRef

    class Dataset:
        def __init__(self, prompts): self.prompts = prompts
        def get(self, sample_id): return self.prompts[sample_id]

    async def main():
        target, mode, prompts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
        barrier = MutationBarrier()
        with EventLog.open(target) as log:
            data_plane = InMemoryDataPlane()
            if mode == "open":
                ledger = RecoveryLedger.open(log, data_plane, barrier=barrier)
            else:
                ledger = RecoveryLedger(log, data_plane, barrier=barrier)
                async with barrier.mutation("recovery_restore") as cut:
                    ledger.restore(cut, Dataset(prompts))
            prompt = {"prompt_id": "p-gB", "task_name": "math", "text": "qgB"}
            async with barrier.mutation("reserve") as cut:
                ledger.reserve(
                    cut, group_id="gB", prompt=prompt,
                    prompt_ref=PromptRef(sample_id="gB", task_name="math"),
                    expected_generations=1, start_weight_version=0, admitted=True,
                    target_step=0, granularity="sibling",
                )
            print(json.dumps({"epoch": ledger.epoch, "head": log.head()}))

    asyncio.run(main())
    """
)


def take_over(target: str, mode: str, prompts: dict[str, Any] | None = None) -> dict[str, Any]:
    """Controller B, in its own process: open (or restore) the ledger and reserve group gB."""
    out: dict[str, Any] = last_json_of_child(_CHILD, target, mode, json.dumps(prompts or {}))
    return out


class Controller:
    """Controller A: a ledger on `target` with its own barrier, run section by section."""

    def __init__(self, target: str) -> None:
        self.log = EventLog.open(target)
        self.barrier = MutationBarrier()
        self.ledger = RecoveryLedger.open(self.log, InMemoryDataPlane(), barrier=self.barrier)

    def run(self, fn: Callable[[Cut], T]) -> T:
        async def section() -> T:
            async with self.barrier.mutation("test") as cut:
                return fn(cut)

        return asyncio.run(section())

    def reserve(self, group_id: str) -> None:
        self.run(
            lambda cut: self.ledger.reserve(
                cut,
                group_id=group_id,
                prompt=make_prompt(group_id),
                prompt_ref=PromptRef(sample_id=group_id, task_name="math"),
                expected_generations=1,
                start_weight_version=0,
                admitted=True,
                target_step=0,
                granularity="sibling",
            )
        )


@pytest.fixture(name="harness")
def _harness_on_each_backend(backend_harness: Harness) -> Harness:
    """SQLite and the real PostgreSQL server with the in-memory data plane, and SQLite with
    the real TransferQueue."""
    return backend_harness


@pytest.fixture
def controller(log_target: str) -> Iterator[Controller]:
    a = Controller(log_target)
    try:
        yield a
    finally:
        a.log.close()


def test_a_controller_opened_in_another_process_fences_the_first(
    controller: Controller, log_target: str
) -> None:
    a = controller
    a.reserve("g1")
    assert a.ledger.epoch == 1
    b = take_over(log_target, "open")
    assert b["epoch"] == 2
    head = a.log.head()
    assert head == b["head"]
    with pytest.raises(ControllerFencedError) as caught:
        a.reserve("g2")  # the zombie's next command
    err = caught.value
    assert (err.held_epoch, err.current_epoch) == (1, 2)
    assert "fencing epoch 1, but epoch 2 was taken" in str(err)
    assert "(open)" in str(err)
    assert isinstance(err, ConcurrencyError) and err.stream == EPOCH_STREAM
    with pytest.raises(ControllerFencedError, match="epoch 1, but epoch 2"):
        a.run(lambda cut: a.ledger.dispatch(cut, "g1"))
    assert a.log.head() == head
    assert a.log.stream_version("group/g2") is None
    epochs = [r.event for r in a.log.read_stream(EPOCH_STREAM)]
    assert [(e.epoch, e.reason) for e in epochs if isinstance(e, ControllerEpochStarted)] == [
        (1, "open"),
        (2, "open"),
    ]
    # B's view is the log's: a full fold holds gB and g1, nothing of the zombie.
    folded = RecoveryLedger.open(a.log, InMemoryDataPlane(), read_only=True).state
    assert sorted(folded.groups) == ["g1", "gB"]


def test_a_restore_reads_again_the_absences_it_kept_before_a_newer_controller_appended(
    harness: Harness,
) -> None:
    """A ledger that read a group id absent, was superseded (the newer controller reserved
    that id) and restored: the id is taken now. Kept, the absence offered it again, and its
    reserve failed on NO_STREAM and fenced the ledger one command after its restore."""
    h = harness
    h.reserve("g1")
    h.checkpoint(1)
    assert h.ledger.unused_group_id("g5") == "g5"  # read absent, and kept
    newer = h.newer_controller()
    newer.reserve("g5")
    h.run(lambda cut: h.ledger.restore(cut, h.dataset), kind="recovery_restore")
    assert h.ledger.unused_group_id("g5") == "g5-r1"
    h.reserve("g5-r1")
    assert "g5-r1" in RecoveryLedger.open(h.log, h.data_plane, read_only=True).state.groups


def test_a_controller_restored_in_another_process_fences_the_first(
    log_backend_harness: Harness,
) -> None:
    h = log_backend_harness  # the other process restores an in-memory data plane
    h.reserve("g1", n=2)
    h.dispatch("g1")
    h.seal("g1", 0)
    h.checkpoint(1)
    b = take_over(h.location, "restore", {k: dict(v) for k, v in h.dataset.prompts.items()})
    assert b["epoch"] == 2
    rid = h.rollout_id("g1", 1)
    receipt = h.stage(rid)  # the worker's records are not the controller's
    head = h.log.head()
    with pytest.raises(ControllerFencedError, match=r"epoch 1, but epoch 2 .*\(restore\)"):
        h.run(
            lambda cut: h.ledger.seal_sibling(
                cut, "g1", 1, rollout_id=rid, receipt=receipt, reward=1.0, mask_sample=False
            )
        )
    assert h.log.head() == head
    # The zombie's checkpoint is refused too, so no snapshot can drop B's group.
    with pytest.raises(ControllerFencedError):
        h.checkpoint(2)
    assert h.log.head() == head
    assert "gB" in RecoveryLedger.open(h.log, h.data_plane, read_only=True).state.groups


def test_reopening_takes_a_newer_epoch_that_fences_the_process_that_took_over(
    log_backend_harness: Harness,
) -> None:
    h = log_backend_harness
    h.reserve("g1")
    take_over(h.location, "open")
    h.reopen()  # an operator decides this controller takes over again
    assert h.ledger.epoch == 3
    h.reserve("g2")
    assert {"g1", "g2", "gB"} <= set(h.ledger.state.groups)


def test_a_read_only_ledger_takes_no_epoch_and_refuses_commands(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    h.reserve("g1")
    head = h.log.head()
    viewer = RecoveryLedger.open(h.log, h.data_plane, read_only=True)
    assert viewer.epoch is None and h.log.head() == head
    with pytest.raises(LedgerRuleError, match="no fencing epoch"):
        h.run(lambda cut: viewer.dispatch(cut, "g1"))
    h.checkpoint(1)
    head = h.log.head()
    loads: list[object] = []
    monkeypatch.setattr(h.data_plane, "load_checkpoint", loads.append)
    with pytest.raises(LedgerRuleError, match="read-only ledger cannot restore"):
        h.run(lambda cut: viewer.restore(cut, h.dataset), kind="recovery_restore")
    assert h.log.head() == head and viewer.epoch is None and loads == []
    h.dispatch("g1")  # the controller is not fenced by a viewer
    head, keys = h.log.head(), h.data_plane.list_keys(STAGING)
    with pytest.raises(LedgerRuleError, match="'g1_g0': a read-only ledger cannot stage"):
        viewer.stage("g1_g0", {"g1_g0/c0": {"token_ids": torch.arange(3)}}, weight_version=0)
    assert h.log.head() == head and h.data_plane.list_keys(STAGING) == keys
    stale = h.run(lambda cut: cut)  # its section has exited
    for command in (viewer.replay.consume, h.ledger.replay.consume):
        with pytest.raises(BarrierError):  # nothing to consume, a stale cut all the same
            command(stale, ["absent"], step=1)
    with pytest.raises(BarrierError):
        h.ledger.replay.evict(object(), ["absent"], reason="r")  # type: ignore[arg-type]


class HandMade:
    """Not a cut: it only has the method a duck-typed check would look for."""

    def require_live(self) -> None:
        return None

    exclusive = True


def test_a_ledger_refuses_cuts_of_another_barrier_and_hand_made_ones(harness: Harness) -> None:
    h = harness
    h.reserve("g1")  # binds the ledger to h.barrier
    head = h.log.head()
    other = MutationBarrier("other")

    async def with_other() -> None:
        async with other.mutation("dispatch") as cut:
            h.ledger.dispatch(cut, "g1")

    with pytest.raises(BarrierError, match="another barrier"):
        asyncio.run(with_other())

    async def checkpoint_of_other() -> None:
        async with other.checkpoint() as cut:
            h.ledger.checkpoint(cut, step=1, directory=str(h.path.parent / "x"))

    with pytest.raises(BarrierError, match="another barrier"):
        asyncio.run(checkpoint_of_other())
    with pytest.raises(BarrierError, match="found a HandMade"):
        h.ledger.dispatch(HandMade(), "g1")  # type: ignore[arg-type]
    with pytest.raises(BarrierError, match="found a HandMade"):
        h.ledger.checkpoint(HandMade(), step=1, directory=str(h.path.parent / "x"))  # type: ignore[arg-type]
    assert h.log.head() == head
    h.dispatch("g1")  # its own barrier still works
    # A command with nothing left to do (no reserved sibling) is refused all the same.
    with pytest.raises(BarrierError, match="found a HandMade"):
        h.ledger.dispatch(HandMade(), "g1")  # type: ignore[arg-type]
    with pytest.raises(BarrierError, match="another barrier"):
        asyncio.run(with_other())


def test_a_ledger_bound_at_open_refuses_even_its_first_foreign_cut(tmp_path: Path) -> None:
    bound, other = MutationBarrier("bound"), MutationBarrier("other")
    with EventLog.open(tmp_path / "run.db") as log:
        ledger = RecoveryLedger.open(log, InMemoryDataPlane(), barrier=bound)
        head = log.head()

        async def reserve() -> None:
            async with other.mutation("reserve") as cut:
                ledger.reserve(
                    cut,
                    group_id="g1",
                    prompt=make_prompt("g1"),
                    prompt_ref=PromptRef(sample_id="g1", task_name="math"),
                    expected_generations=1,
                    start_weight_version=0,
                    admitted=True,
                    granularity="sibling",
                )

        with pytest.raises(BarrierError, match=r"'other'.*does not hold this one"):
            asyncio.run(reserve())
        assert log.head() == head


def _checkpoint_folders(h: Harness) -> list[Path]:
    return sorted(h.path.parent.rglob("step-*-seq-*"))


def test_a_superseded_ledger_writes_no_checkpoint_files(harness: Harness) -> None:
    """A checkpoint saves the data plane before its append: the append's fence would refuse
    it only after the files were written (and a zombie at the live controller's cut wrote over
    the live one's folder). The epoch is read before anything is saved."""
    h = harness
    h.reserve("g1")
    h.newer_controller()  # takes epoch 2; this ledger has not appended since
    head = h.log.head()
    for _ in range(2):  # unaware of it, then aware
        with pytest.raises(ControllerFencedError, match="epoch 1, but epoch 2"):
            h.checkpoint(1)
    assert _checkpoint_folders(h) == []
    assert h.log.head() == head


def test_the_live_controllers_checkpoint_survives_a_zombie_checkpointing_the_same_cut(
    harness: Harness,
) -> None:
    """B (the newer controller) has saved its data plane and not yet committed when A, the
    zombie, checkpoints the same step at the same log head: A is refused without touching
    B's folder, and B's committed checkpoint loads B's rows."""
    a = harness
    a.reserve("g1")
    b = a.newer_controller()
    b.data_plane = InMemoryDataPlane()
    b.ledger = RecoveryLedger.open(b.log, b.data_plane)
    a.data_plane.put_rows(STAGING, {"zombie-row": {"token_ids": torch.arange(3)}})
    b.data_plane.put_rows(STAGING, {"live-row": {"token_ids": torch.arange(3)}})
    saved_by_b = b.data_plane.save_checkpoint
    refused: list[BaseException] = []

    def b_saves_then_a_checkpoints(where: str) -> Any:
        saved = saved_by_b(where)
        try:
            with ThreadPoolExecutor(1) as other:  # A's own loop, as in its own process
                other.submit(a.checkpoint, 1).result()
        except ControllerFencedError as exc:
            refused.append(exc)
        return saved

    b.data_plane.save_checkpoint = b_saves_then_a_checkpoints  # type: ignore[method-assign,assignment]
    b.checkpoint(1)

    assert len(refused) == 1
    (ckpt,) = [
        r.event for r in b.log.read_stream(CONTROLLER_STREAM) if r.type == "CheckpointCommitted"
    ]
    assert isinstance(ckpt, CheckpointCommitted)
    assert _checkpoint_folders(b) == [Path(ckpt.data_plane_ref)]
    loaded = InMemoryDataPlane()
    loaded.load_checkpoint(
        DataPlaneCheckpoint(
            ref=ckpt.data_plane_ref,
            inventory_digest=ckpt.inventory_digest,
            row_count=ckpt.row_count,
        )
    )
    assert list(loaded.list_keys(STAGING)) == ["live-row"]


def test_two_controllers_never_name_the_same_checkpoint_folder() -> None:
    """The saving controller's epoch is in the folder's name: at the same step, cut and chain,
    a zombie that got past the epoch read still writes beside the live one, not over it."""
    chain = bytes(range(32))
    first = checkpoint_location("/ckpt", 1, 7, chain, epoch=1)
    second = checkpoint_location("/ckpt", 1, 7, chain, epoch=2)
    assert first != second
    assert first.parent == second.parent == Path("/ckpt").resolve()


def test_checkpoint_folders_named_before_and_after_epochs_are_both_deleted_when_retired() -> None:
    """Retiring deletes only folders the ledger named itself; a log written before the epoch
    was in the name (`step-N-seq-S-chain`) still has its old folders deleted."""
    from dataclasses import dataclass

    from eventlog.recovery.checkpoint import retire_events
    from projections.history import RolledBack

    @dataclass
    class Rec:
        seq: int
        event: CheckpointCommitted

    def committed(seq: int, name: str) -> Rec:
        return Rec(seq, CheckpointCommitted(
            step=seq, data_plane_ref=f"/ckpt/{name}", inventory_digest="d", row_count=0,
            ledger_digest="l", group_count=0, covers_seq=seq - 1, chain="ab",
        ))  # fmt: skip

    records = [
        committed(1, "step-1-seq-0-ab12"),
        committed(2, "step-2-seq-1-e3-ab12"),
        committed(3, "my-own-folder"),
        committed(4, "step-4-seq-3-e3-ab12"),
    ]
    retired = retire_events(records, RolledBack(), keep=1)
    assert [(e.checkpoint_seq, e.deleted) for e in retired] == [(1, True), (2, True), (3, False)]
