"""TransferQueue-only behaviour: restore into another TQ, orphan cleanup, parity with the twin.

A second Ray + TQ runs in a child process (one per module, ~12 s): it loads a checkpoint the
session's TQ saved, then is SIGKILLed the way the demo kills its controller, and whatever Ray
left behind must be found and stopped by PID.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import psutil
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.dataplane.raysession import kill_ray_session, session_pids
from eventlog.recovery.errors import DataPlaneError, MissingRowsError

if TYPE_CHECKING:  # imported lazily: collecting this module must not load Ray
    from eventlog.dataplane.transferqueue import TransferQueueDataPlane, TransferQueueRuntime

pytestmark = [pytest.mark.slow, pytest.mark.tq]

_REPO = Path(__file__).resolve().parents[1]

_CHILD = """
import sys, json, time
import msgspec, torch
from eventlog.dataplane.protocol import DataPlaneCheckpoint
from eventlog.dataplane.transferqueue import TransferQueueDataPlane, start_transferqueue
root, checkpoint_json, out = sys.argv[1:4]
runtime = start_transferqueue(temp_root=root)
plane = TransferQueueDataPlane()
plane.load_checkpoint(msgspec.json.decode(checkpoint_json, type=DataPlaneCheckpoint))
rows = {p: plane.read_rows(p, sorted(plane.list_keys(p))) for p in plane.list_partitions()}
tags = {p: plane.list_keys(p) for p in plane.list_partitions()}
torch.save({"rows": rows, "tags": tags}, out)
print(json.dumps({"temp_dir": runtime.temp_dir, "pids": list(runtime.pids)}), flush=True)
time.sleep(600)
"""


def _rows() -> dict[str, dict[str, torch.Tensor]]:
    return {
        f"g{i}_g{j}/call0": {
            "token_ids": torch.arange(i * 10, i * 10 + 3 + j, dtype=torch.int64),
            "logprobs": torch.full((3 + j,), -0.5 * i, dtype=torch.float32),
            "reward": torch.tensor(float(i + j)),
        }
        for i in range(3)
        for j in range(2)
    }


@dataclass
class ChildTQ:
    """A second Ray + TQ in a child process that loaded our checkpoint."""

    proc: subprocess.Popen[str]
    root: Path
    temp_dir: str
    pids: list[int]
    loaded: dict[str, Any]
    """What the child read back after loading: {"rows": ..., "tags": ...}."""


@pytest.fixture(scope="module")
def child_tq(
    tq_runtime: TransferQueueRuntime, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ChildTQ]:
    from eventlog.dataplane.raysession import TEMP_ROOT_ENV
    from eventlog.dataplane.transferqueue import TransferQueueDataPlane

    work = tmp_path_factory.mktemp("child-tq")
    plane = TransferQueueDataPlane()
    plane.clear()
    plane.put_rows("staging", _rows(), tags={"g0_g0/call0": {"rollout_id": "g0_g0"}})
    checkpoint = plane.save_checkpoint(str(work / "checkpoint"))
    plane.clear()

    # Not under tmp_path: Ray's socket paths must fit in 107 bytes (see start_transferqueue).
    root = Path(tempfile.mkdtemp(prefix="c", dir=os.environ.get(TEMP_ROOT_ENV)))
    stderr = open(work / "child.stderr", "w")  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _CHILD,
            str(root),
            msgspec.json.encode(checkpoint).decode(),
            str(work / "loaded.pt"),
        ],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        cwd=_REPO,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the child is ready or dies
        if not line:
            code = proc.wait(timeout=30)
            tail = (work / "child.stderr").read_text()[-3000:]
            pytest.fail(f"child TQ exited with {code} before loading the checkpoint:\n{tail}")
        started = json.loads(line)
        loaded = torch.load(work / "loaded.pt", weights_only=True)
        yield ChildTQ(proc, root, started["temp_dir"], started["pids"], loaded)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        stderr.close()
        kill_ray_session(str(root))
        shutil.rmtree(root, ignore_errors=True)


def test_checkpoint_loads_into_a_fresh_transferqueue_in_another_process(child_tq: ChildTQ) -> None:
    loaded_rows = child_tq.loaded["rows"]
    assert isinstance(loaded_rows, dict) and list(loaded_rows) == ["staging"]
    expected = _rows()
    assert sorted(loaded_rows["staging"]) == sorted(expected)
    for key, row in expected.items():
        for name, tensor in row.items():
            found = loaded_rows["staging"][key][name]
            assert found.dtype == tensor.dtype and torch.equal(found, tensor), (key, name)
    assert child_tq.loaded["tags"] == {
        "staging": {
            key: ({"rollout_id": "g0_g0"} if key == "g0_g0/call0" else {}) for key in expected
        }
    }


def test_ray_processes_of_a_sigkilled_driver_are_stopped_by_pid(child_tq: ChildTQ) -> None:
    assert child_tq.pids, "the child recorded no Ray processes"
    assert set(child_tq.pids) <= set(session_pids(child_tq.temp_dir))
    child_tq.proc.send_signal(signal.SIGKILL)
    child_tq.proc.wait(timeout=30)

    kill_ray_session(str(child_tq.root), grace_s=5.0)

    assert session_pids(str(child_tq.root)) == []
    for pid in child_tq.pids:
        assert _gone_or_zombie(pid), pid
    recorded = json.loads(Path(child_tq.temp_dir, "eventlog-ray.json").read_text())
    assert recorded["pids"] == child_tq.pids


def _gone_or_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return True


def test_starting_a_second_transferqueue_in_one_process_is_refused(
    tq_runtime: TransferQueueRuntime,
) -> None:
    from eventlog.dataplane.transferqueue import start_transferqueue

    with pytest.raises(DataPlaneError, match="already initialised"):
        start_transferqueue()


# -- parity with the in-memory twin -----------------------------------------------------
_KEYS = ["a", "b", "c", "d"]
_PARTITIONS = ["p1", "p2"]
_op = st.one_of(
    st.tuples(
        st.just("put"),
        st.sampled_from(_PARTITIONS),
        st.dictionaries(st.sampled_from(_KEYS), st.integers(0, 6), min_size=1, max_size=3),
    ),
    st.tuples(st.just("delete"), st.sampled_from(_PARTITIONS), st.lists(st.sampled_from(_KEYS))),
    st.tuples(st.just("read"), st.sampled_from(_PARTITIONS), st.lists(st.sampled_from(_KEYS))),
)


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=st.lists(_op, min_size=1, max_size=12))
def test_transferqueue_answers_every_sequence_of_calls_like_the_in_memory_twin(
    tq_data_plane: TransferQueueDataPlane, ops: list[tuple[str, str, object]]
) -> None:
    tq_data_plane.clear()
    twin = InMemoryDataPlane()
    for step, (kind, partition, arg) in enumerate(ops):
        if kind == "put":
            assert isinstance(arg, dict)
            rows = {
                k: {"ids": torch.arange(n) + step, "r": torch.tensor(n)} for k, n in arg.items()
            }
            tags = {k: {"step": str(step)} for k in arg}
            for plane in (tq_data_plane, twin):
                plane.put_rows(partition, rows, tags=tags)
        elif kind == "delete":
            assert isinstance(arg, list)
            for plane in (tq_data_plane, twin):
                plane.delete_rows(partition, arg)
        else:
            assert isinstance(arg, list)
            answers = [_read_or_missing(plane, partition, arg) for plane in (tq_data_plane, twin)]
            assert answers[0] == answers[1], (step, kind, partition, arg)
        assert tq_data_plane.list_partitions() == twin.list_partitions()
        for p in _PARTITIONS:
            assert tq_data_plane.list_keys(p) == twin.list_keys(p)


def _read_or_missing(
    plane: TransferQueueDataPlane | InMemoryDataPlane, partition: str, keys: list[str]
) -> object:
    started = time.monotonic()
    try:
        rows = plane.read_rows(partition, keys)
    except MissingRowsError as err:
        return ("missing", err.partition, err.keys)
    assert time.monotonic() - started < 30
    return {
        k: {n: t.tolist() for n, t in row.items() if isinstance(t, torch.Tensor)}
        for k, row in rows.items()
    }
