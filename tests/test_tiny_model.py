"""The tiny test model: same bytes from every build, reused when intact, rebuilt when not."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from eventlog.recovery.errors import ConfigError
from eventlog.rollout.tiny_model import STAMP_FILE, build_tiny_model

pytestmark = pytest.mark.slow


def digests(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


def test_two_builds_write_identical_files_and_a_second_call_reuses_the_first(
    tmp_path: Path,
) -> None:
    first = build_tiny_model(tmp_path / "a")
    second = build_tiny_model(tmp_path / "b")
    assert digests(first) == digests(second)
    assert {"config.json", "model.safetensors", "tokenizer.json", STAMP_FILE} <= set(digests(first))

    weights = first / "model.safetensors"
    built_at = weights.stat().st_mtime_ns
    assert build_tiny_model(first) == first
    assert weights.stat().st_mtime_ns == built_at


def test_a_damaged_build_is_rebuilt_to_the_same_bytes(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "m")
    expected = digests(model)
    with open(model / "model.safetensors", "r+b") as f:
        f.seek(200)
        f.write(b"\xff\xff\xff\xff")

    assert build_tiny_model(model) == model
    assert digests(model) == expected


def test_a_directory_holding_something_else_is_refused_and_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "not-a-model"
    target.mkdir()
    (target / "notes.txt").write_text("mine")

    with pytest.raises(ConfigError, match="not-a-model"):
        build_tiny_model(target)
    assert [p.name for p in target.iterdir()] == ["notes.txt"]
