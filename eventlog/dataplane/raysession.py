"""Find and stop the processes of a Ray session we started, by PID, even as orphans.

A process belongs to the session under ROOT when either
- its environment carries ``EVENTLOG_RAY_SESSION=<temp dir under ROOT>``: `start_transferqueue`
  sets it only while ``ray.init`` spawns the head processes, and the GCS, the raylet and the
  workers the raylet forks later (the TQ controller and storage actors) inherit it; or
- it holds a file open under ROOT: the raylet starts its dashboard and runtime-env agents with
  an environment of its own making, without our marker, but they keep their logs open in the
  session dir, and they are the ones that outlive a SIGKILLed driver longest.
Both survive re-parenting after the process that called ``ray.init`` died. Matching on them,
never on a process name, means we only ever kill what we started (so keep no files of your own
open under ROOT).

Usable without Ray installed: ``python -m eventlog.dataplane.raysession ROOT`` kills every
session whose temp dir lies under ROOT and prints the PIDs (for CI wrappers and the demo).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path

logger = logging.getLogger(__name__)

MARKER_ENV = "EVENTLOG_RAY_SESSION"
"""Environment variable whose value is the temp dir of the Ray session a process belongs to."""


def _marker(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, a zombie, or not ours to read
        return None
    prefix = MARKER_ENV.encode() + b"="
    for item in raw.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None


def _holds_file_under(pid: int, root: str) -> bool:
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if target.startswith("/") and _under(target, root):
            return True
    return False


def _belongs(pid: int, root: str) -> bool:
    marker = _marker(pid)
    return (marker is not None and _under(marker, root)) or _holds_file_under(pid, root)


def _under(path: str, root: str) -> bool:
    root = os.path.normpath(os.path.abspath(root))
    path = os.path.normpath(path)
    return path == root or path.startswith(root.rstrip("/") + "/")


def _alive(pid: int) -> bool:
    """True unless the process is gone or a zombie (dead, waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")


def session_pids(root: str) -> list[int]:
    """PIDs of live processes of the Ray session(s) at or under `root` (see module doc)."""
    me = os.getpid()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid == me:
            continue
        if _alive(pid) and _belongs(pid, root):
            pids.append(pid)
    return sorted(pids)


def _reap(pid: int) -> None:
    """Collect our own dead children so they do not linger as zombies."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _signal(pid: int, root: str, sig: signal.Signals) -> None:
    # Check again right before signalling: the PID may have been reused.
    if not _belongs(pid, root):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def kill_ray_session(root: str, *, grace_s: float = 3.0) -> list[int]:
    """Stop every process of the Ray session(s) under `root`: SIGTERM, then SIGKILL.

    Returns the PIDs that were still alive when called (empty when Ray had exited cleanly).
    """
    pids = session_pids(root)
    if not pids:
        return []
    logger.info("stopping %d Ray processes of session %s: %s", len(pids), root, pids)
    for pid in pids:
        _signal(pid, root, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        for pid in pids:
            _reap(pid)
        if not any(_alive(pid) for pid in pids):
            break
        time.sleep(0.05)
    for pid in pids:
        if _alive(pid):
            logger.warning("Ray process %d ignored SIGTERM; sending SIGKILL", pid)
            _signal(pid, root, signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        for pid in pids:
            _reap(pid)
        time.sleep(0.05)
    return pids


def main(argv: list[str] | None = None) -> int:
    """Kill the Ray sessions under each ROOT given; exit 2 on bad usage."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        sys.stderr.write("usage: python -m eventlog.dataplane.raysession ROOT [ROOT...]\n")
        return 2
    for root in args:
        killed = kill_ray_session(root)
        sys.stdout.write(f"{root}: stopped {len(killed)} Ray processes {killed}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
