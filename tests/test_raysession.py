"""Ray session cleanup kills exactly the processes marked with our temp dir, by PID."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlog.dataplane.raysession import MARKER_ENV, kill_ray_session, main, session_pids


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; any still running at the end are killed by PID."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _sleeper(marker: str | None) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != MARKER_ENV}
    if marker is not None:
        env[MARKER_ENV] = marker
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)


def test_kill_ray_session_stops_marked_processes_under_the_root_and_nothing_else(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    root = tmp_path / "ray"
    ours = _sleeper(str(root / "eventlog-ray-abc"))
    sibling_root = _sleeper(str(tmp_path / "ray-other"))  # shares a name prefix, not the dir
    unmarked = _sleeper(None)
    spawned.extend([ours, sibling_root, unmarked])

    assert session_pids(str(root)) == [ours.pid]
    killed = kill_ray_session(str(root), grace_s=5.0)

    assert killed == [ours.pid]
    assert ours.wait(timeout=5) is not None
    assert sibling_root.poll() is None and unmarked.poll() is None
    assert session_pids(str(root)) == []


def test_a_process_holding_a_file_open_in_the_session_dir_is_stopped_without_the_marker(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """Ray's dashboard and runtime-env agents lack our marker but keep their logs open."""
    root = tmp_path / "ray"
    (root / "session" / "logs").mkdir(parents=True)
    log = root / "session" / "logs" / "agent.out"
    agent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; f = open(sys.argv[1], 'w'); time.sleep(120)",
            log,
        ],
        env={k: v for k, v in os.environ.items() if k != MARKER_ENV},
    )
    spawned.append(agent)
    deadline = time.monotonic() + 30
    while session_pids(str(root)) != [agent.pid] and time.monotonic() < deadline:
        time.sleep(0.05)

    assert kill_ray_session(str(root), grace_s=5.0) == [agent.pid]
    assert agent.wait(timeout=5) is not None


def test_command_line_reports_no_processes_for_an_empty_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(tmp_path)]) == 0
    assert "stopped 0 Ray processes" in capsys.readouterr().out
    assert main([]) == 2
