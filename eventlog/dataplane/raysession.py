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

Processes are found through psutil. Usable without Ray installed:
``python -m eventlog.dataplane.raysession ROOT`` kills every session whose temp dir lies under
ROOT and prints the PIDs (for CI wrappers and the demo).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time

import click
import psutil

logger = logging.getLogger(__name__)

MARKER_ENV = "EVENTLOG_RAY_SESSION"
"""Environment variable whose value is the temp dir of the Ray session a process belongs to."""
TEMP_ROOT_ENV = "EVENTLOG_RAY_TMPDIR"
"""Where Ray temp dirs are created when no root is passed (keep it short: socket paths)."""


def _marker(proc: psutil.Process) -> str | None:
    try:
        marker: str | None = proc.environ().get(MARKER_ENV)
    except psutil.Error:  # gone, a zombie, or not ours to read
        return None
    return marker


def _holds_file_under(proc: psutil.Process, root: str) -> bool:
    try:
        files = proc.open_files()
    except psutil.Error:
        return False
    return any(_under(f.path, root) for f in files)


def _belongs(proc: psutil.Process, root: str) -> bool:
    marker = _marker(proc)
    return (marker is not None and _under(marker, root)) or _holds_file_under(proc, root)


def _under(path: str, root: str) -> bool:
    root = os.path.normpath(os.path.abspath(root))
    path = os.path.normpath(path)
    return path == root or path.startswith(root.rstrip("/") + "/")


def _alive(pid: int) -> bool:
    """True unless the process is gone or a zombie (dead, waiting to be reaped)."""
    try:
        status = psutil.Process(pid).status()
    except psutil.AccessDenied:  # someone else's process: it exists
        return True
    except psutil.NoSuchProcess:  # ZombieProcess is one too
        return False
    return status not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def session_pids(root: str) -> list[int]:
    """PIDs of live processes of the Ray session(s) at or under `root` (see module doc)."""
    me = os.getpid()
    pids = []
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        if _alive(proc.pid) and _belongs(proc, root):
            pids.append(proc.pid)
    return sorted(pids)


def _reap(pid: int) -> None:
    """Collect our own dead children so they do not linger as zombies."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _signal(pid: int, root: str, sig: signal.Signals) -> None:
    # Check again right before signalling: the PID may have been reused.
    try:
        proc = psutil.Process(pid)
    except psutil.Error:
        return
    if not _belongs(proc, root):
        return
    with contextlib.suppress(psutil.NoSuchProcess):
        proc.send_signal(sig)


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


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("roots", nargs=-1, required=True, metavar="ROOT...")
def command(roots: tuple[str, ...]) -> None:
    """Kill every Ray session whose temp dir lies under each ROOT; print the PIDs stopped."""
    for root in roots:
        killed = kill_ray_session(root)
        click.echo(f"{root}: stopped {len(killed)} Ray processes {killed}")


def main(argv: list[str] | None = None) -> int:
    """Run `command` and return its exit status (2 on bad usage) instead of exiting."""
    try:
        command.main(args=argv, prog_name="python -m eventlog.dataplane.raysession")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
