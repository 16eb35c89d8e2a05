"""The in-memory twin's checkpoints outlive the process that wrote them (the demo SIGKILLs it)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import msgspec
import torch

from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.dataplane.protocol import DataPlaneCheckpoint

_WRITER = """
import os, signal, sys
import msgspec, torch
from eventlog.dataplane.memory import InMemoryDataPlane
plane = InMemoryDataPlane()
rows = {f"g{i}_g0/call0": {"token_ids": torch.arange(i + 1), "reward": torch.tensor(i / 2)}
        for i in range(4)}
plane.put_rows("staging", rows, tags={"g0_g0/call0": {"rollout_id": "g0_g0"}})
checkpoint = plane.save_checkpoint(sys.argv[1])
plane.put_rows("staging", {"after-checkpoint": {"token_ids": torch.arange(3)}})
sys.stdout.buffer.write(msgspec.json.encode(checkpoint) + b"\\n")
sys.stdout.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_checkpoint_saved_by_a_sigkilled_process_restores_in_a_fresh_one(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WRITER, str(tmp_path / "cp")],
        capture_output=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    checkpoint = msgspec.json.decode(done.stdout.splitlines()[-1], type=DataPlaneCheckpoint)

    plane = InMemoryDataPlane()
    plane.load_checkpoint(checkpoint)

    assert plane.list_partitions() == ["staging"]
    keys = plane.list_keys("staging")
    assert sorted(keys) == [f"g{i}_g0/call0" for i in range(4)]
    assert keys["g0_g0/call0"] == {"rollout_id": "g0_g0"}
    rows = plane.read_rows("staging", sorted(keys))
    for i in range(4):
        row = rows[f"g{i}_g0/call0"]
        token_ids, reward = row["token_ids"], row["reward"]
        assert isinstance(token_ids, torch.Tensor) and isinstance(reward, torch.Tensor)
        assert torch.equal(token_ids, torch.arange(i + 1))
        assert torch.equal(reward, torch.tensor(i / 2))


def test_saving_twice_into_one_directory_keeps_only_the_latest_rows(tmp_path: Path) -> None:
    plane = InMemoryDataPlane()
    plane.put_rows("p", {"old": {"x": torch.ones(2)}})
    plane.save_checkpoint(str(tmp_path))
    plane.delete_rows("p", ["old"])
    plane.put_rows("p", {"new": {"x": torch.zeros(1)}})
    latest = plane.save_checkpoint(str(tmp_path))

    fresh = InMemoryDataPlane()
    fresh.load_checkpoint(latest)
    assert fresh.list_keys("p") == {"new": {}}
    assert not list(tmp_path.glob("*.tmp"))


def test_importing_the_in_memory_plane_and_the_ledger_does_not_load_torch() -> None:
    """The README's ledger example needs torch only for its checkpoint file (the torch extra)."""
    probe = (
        "import sys; sys.modules['torch'] = None; "
        "from eventlog.dataplane.memory import InMemoryDataPlane; "
        "from eventlog.recovery import MutationBarrier, RecoveryLedger; "
        "plane = InMemoryDataPlane(); plane.delete_rows('staging', ['k']); "
        "print(plane.list_partitions(), plane.list_keys('staging'))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] {}"
