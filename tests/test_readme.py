"""The README's Python examples run as written (a stale example is a bug)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(BLOCKS[index])
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    if "admit_restored" in BLOCKS[index]:  # the controller loop: g7 trained, g8 reserved again
        assert "['g7'] [] ['g8-r1_g0', 'g8-r1_g1']" in done.stdout


def test_the_controller_example_is_the_whole_loop_in_under_40_lines() -> None:
    (loop,) = [block for block in BLOCKS if "admit_restored" in block]
    steps = [
        "reserve(",
        "dispatch(",
        "stage(",
        "seal_sibling(",
        "fail(",
        "finalize(",
        "checkpoint(",
        "restore(",
    ]
    assert all(step in loop for step in steps)
    assert len(loop.splitlines()) < 40


def test_readme_names_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert "make demo" in text and "make test" in text
