"""The in-memory twin's checkpoints outlive the process that wrote them (the demo SIGKILLs it)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import torch

from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.dataplane.protocol import DataPlaneCheckpoint, inventory_digest

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


def test_a_checkpoint_of_the_first_format_still_restores(tmp_path: Path) -> None:
    """Checkpoints written before the plane's own format (torch.save of a dict) stay loadable."""
    rows = {
        "g0_g0/c0": {"token_ids": torch.arange(3), "reward": torch.tensor(0.5)},
        "g0_g1/c0": {"mask": torch.tensor([True, False]), "h": torch.ones(2, 2).bfloat16()},
    }
    tags = {"g0_g0/c0": {"rollout_id": "g0_g0"}, "g0_g1/c0": {}}
    payload = {  # exactly what format 1 wrote
        "format": 1,
        "partitions": {"staging": {k: {"fields": f, "tags": tags[k]} for k, f in rows.items()}},
    }
    torch.save(payload, tmp_path / "memory-dataplane.pt")
    pairs = [("staging", key) for key in rows]
    checkpoint = DataPlaneCheckpoint(
        ref=str(tmp_path), inventory_digest=inventory_digest(pairs), row_count=2
    )
    plane = InMemoryDataPlane()
    plane.load_checkpoint(checkpoint)
    assert plane.list_keys("staging") == tags
    read = plane.read_rows("staging", list(rows))
    for key, fields in rows.items():
        assert read[key].keys() == fields.keys()
        for name, tensor in fields.items():
            got = read[key][name]
            assert isinstance(got, torch.Tensor) and torch.equal(got, tensor)


def test_loading_a_checkpoint_and_listing_its_rows_does_not_import_torch(
    tmp_path: Path,
) -> None:
    """A restore lists keys and tags; the tensors are built only when a row is read."""
    plane = InMemoryDataPlane()
    plane.put_rows(
        "staging",
        {"k1": {"t": torch.arange(4, dtype=torch.int32)}, "k2": {"x": torch.zeros(0)}},
        tags={"k1": {"rollout_id": "r1"}},
    )
    checkpoint = plane.save_checkpoint(str(tmp_path))
    probe = (
        "import sys, msgspec; sys.modules['torch'] = None\n"
        "from eventlog.dataplane.memory import InMemoryDataPlane\n"
        "from eventlog.dataplane.protocol import DataPlaneCheckpoint\n"
        "plane = InMemoryDataPlane()\n"
        "plane.load_checkpoint(msgspec.json.decode(sys.argv[1], type=DataPlaneCheckpoint))\n"
        "print(plane.list_keys('staging'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, msgspec.json.encode(checkpoint).decode()],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{'k1': {'rollout_id': 'r1'}, 'k2': {}}"
    fresh = InMemoryDataPlane()
    fresh.load_checkpoint(checkpoint)
    read = fresh.read_rows("staging", ["k1", "k2"])
    t, x = read["k1"]["t"], read["k2"]["x"]
    assert isinstance(t, torch.Tensor) and torch.equal(t, torch.arange(4, dtype=torch.int32))
    assert isinstance(x, torch.Tensor) and x.shape == (0,) and x.dtype == torch.float32


def test_a_checkpoint_folder_is_made_durably_in_its_parents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file and its own folder were fsynced, never the parent holding the new folder's
    entry: after a power cut the folder could be gone while the CheckpointCommitted naming
    it stayed, and the newest checkpoint could not be loaded."""
    import os

    synced: list[str] = []
    fsync = os.fsync

    def recording(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording)
    plane = InMemoryDataPlane()
    plane.put_rows("p", {"k": {"token_ids": torch.arange(3)}})
    target = tmp_path / "ckpts" / "step-1"
    plane.save_checkpoint(str(target))
    assert {str(tmp_path), str(tmp_path / "ckpts"), str(target)} <= set(synced)
