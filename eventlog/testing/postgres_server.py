"""A throwaway PostgreSQL server, started from the distribution's binaries and stopped by PID.

The test suite's session server and the benchmarks' server both come from here.
pytest-postgresql's process fixture runs ``initdb`` as the current user, which PostgreSQL
refuses when that user is root (the CI case), so the cluster is started here instead: as the
``postgres`` user through ``runuser`` when we are root, directly otherwise, on 127.0.0.1 and a
free port. initdb plus start take about a second.

A missing prerequisite raises `PostgresUnavailable` with the reason and the fix; the caller
decides what that means (the tests skip or fail, the benchmarks print it and go on).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

logger = logging.getLogger(__name__)

PG_USER = "postgres"
_WANTED_MAJOR = "15"
_START_ATTEMPTS = 3
_STOP_TIMEOUT_S = 30.0


class PostgresUnavailable(Exception):
    """No server can be started here; the message says why and how to fix it."""


@dataclass(frozen=True)
class PostgresServer:
    """Where a started server listens and how it was started."""

    host: str
    port: int
    user: str
    bindir: Path
    datadir: Path
    socket_dir: Path
    pid: int

    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL for ``database`` on this server (psycopg 3 driver)."""
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{database}"

    def conninfo(self, database: str = "postgres") -> str:
        """libpq connection string for ``database`` on this server."""
        return f"host={self.host} port={self.port} user={self.user} dbname={database}"


def _version_key(bindir: str) -> tuple[int, ...]:
    digits = re.findall(r"\d+", Path(bindir).parent.name)
    return tuple(int(d) for d in digits)


def find_pg_bindir() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``; PostgreSQL 15 preferred.

    Order: ``EVENTLOG_PG_BINDIR``, Debian's versioned folder (``/usr/lib/postgresql/N/bin``,
    off PATH), then ``pg_ctl`` on PATH.
    """
    override = os.environ.get("EVENTLOG_PG_BINDIR")
    if override:
        path = Path(override)
        return path if (path / "initdb").is_file() else None
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    dirs = sorted((str(Path(p).parent) for p in found), key=_version_key, reverse=True)
    preferred = [d for d in dirs if Path(d).parent.name == _WANTED_MAJOR]
    for candidate in preferred + dirs:
        if (Path(candidate) / "pg_ctl").is_file():
            return Path(candidate)
    on_path = shutil.which("pg_ctl")
    if on_path and (Path(on_path).parent / "initdb").is_file():
        return Path(on_path).parent
    return None


def require_bindir() -> Path:
    """`find_pg_bindir`, checked along with the server user and psycopg; or PostgresUnavailable."""
    bindir = find_pg_bindir()
    if bindir is None:
        raise PostgresUnavailable(
            "no PostgreSQL server binaries (looked in /usr/lib/postgresql/*/bin and on PATH); "
            "install them with `apt-get install -y postgresql` or set EVENTLOG_PG_BINDIR"
        )
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(PG_USER)
        except KeyError:
            raise PostgresUnavailable(
                f"running as root and there is no {PG_USER!r} user to run the server"
            ) from None
    try:
        import psycopg  # noqa: F401  (callers talk to the server through it)
    except ImportError:
        raise PostgresUnavailable(
            "psycopg is not installed; install the `postgres` extra"
        ) from None
    return bindir


def _as_server_user(argv: list[str]) -> list[str]:
    """initdb and the postmaster refuse to run as root: drop to ``postgres`` when we are root."""
    if os.geteuid() != 0:
        return argv
    runuser = shutil.which("runuser") or next(
        (p for p in ("/usr/sbin/runuser", "/sbin/runuser") if Path(p).is_file()), None
    )
    if runuser is None:
        raise PostgresUnavailable("running as root but `runuser` (util-linux) is not installed")
    return [str(runuser), "-u", PG_USER, "--", *argv]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def make_workdir() -> Path:
    """A temp folder the server user owns and can reach (a root-only TMPDIR would not do)."""
    candidates = [tempfile.gettempdir()]
    if "/tmp" not in candidates:
        candidates.append("/tmp")
    for parent in candidates:
        workdir = Path(tempfile.mkdtemp(prefix="eventlog-pg-", dir=parent))
        if os.geteuid() != 0:
            return workdir
        entry = pwd.getpwnam(PG_USER)
        os.chown(workdir, entry.pw_uid, entry.pw_gid)
        reachable = subprocess.run(
            _as_server_user(["test", "-w", str(workdir), "-a", "-x", str(workdir)]),
            check=False,
            capture_output=True,
        )
        if reachable.returncode == 0:
            return workdir
        shutil.rmtree(workdir, ignore_errors=True)
    raise PostgresUnavailable(f"user {PG_USER!r} cannot write to any of {candidates}")


def _run(argv: list[str], cwd: Path, what: str) -> None:
    proc = subprocess.run(argv, cwd=cwd, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{what} failed with exit code {proc.returncode}: {' '.join(argv)}\n"
            f"{proc.stdout}{proc.stderr}"
        )


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no server log)"


def _alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped by its adopter) counts as gone."""
    try:
        status = psutil.Process(pid).status()
    except psutil.AccessDenied:  # the server user's process, not ours to inspect: it exists
        return True
    except psutil.NoSuchProcess:  # ZombieProcess is one too
        return False
    return status not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def stop(pid: int) -> None:
    """Fast shutdown by PID (SIGINT), escalating to immediate (SIGQUIT) and then SIGKILL."""
    for sig, grace in (
        (signal.SIGINT, _STOP_TIMEOUT_S),
        (signal.SIGQUIT, 5.0),
        (signal.SIGKILL, 5.0),
    ):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.05)
        logger.warning("postgres pid %d still running after %s", pid, sig.name)


def start(bindir: Path, workdir: Path) -> PostgresServer:
    """initdb a cluster under ``workdir`` and start it; RuntimeError with the server log if not."""
    datadir = workdir / "data"
    logfile = workdir / "server.log"
    _run(
        _as_server_user(
            [
                str(bindir / "initdb"),
                "-D",
                str(datadir),
                "-U",
                PG_USER,
                "--auth=trust",
                "--no-sync",
                "--no-locale",
                "-E",
                "UTF8",
            ]
        ),
        workdir,
        "initdb",
    )
    last_error = ""
    for _ in range(_START_ATTEMPTS):
        port = _free_port()  # another process may take it before the server binds: retry
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {workdir}"
        argv = [str(bindir / "pg_ctl"), "-D", str(datadir), "-l", str(logfile)]
        argv += ["-o", options, "-w", "-t", "60", "start"]
        proc = subprocess.run(
            _as_server_user(argv), cwd=workdir, check=False, capture_output=True, text=True
        )
        pid_file = datadir / "postmaster.pid"
        if proc.returncode == 0 and pid_file.is_file():
            pid = int(pid_file.read_text().splitlines()[0])
            return PostgresServer(
                host="127.0.0.1",
                port=port,
                user=PG_USER,
                bindir=bindir,
                datadir=datadir,
                socket_dir=workdir,
                pid=pid,
            )
        last_error = f"{proc.stdout}{proc.stderr}\n--- server log ---\n{_tail(logfile)}"
        if pid_file.is_file():  # started but pg_ctl gave up waiting: do not leave it behind
            with contextlib.suppress(ValueError, IndexError):
                stop(int(pid_file.read_text().splitlines()[0]))
    raise RuntimeError(f"pg_ctl start failed {_START_ATTEMPTS} times:\n{last_error}")


@contextlib.contextmanager
def running_server() -> Iterator[PostgresServer]:
    """A fresh cluster for the with-block; stopped by PID and deleted after, also on failure."""
    bindir = require_bindir()
    workdir = make_workdir()
    server: PostgresServer | None = None
    try:
        server = start(bindir, workdir)
        logger.info(
            "postgres %s listening on 127.0.0.1:%d (pid %d)", bindir, server.port, server.pid
        )
        yield server
    finally:
        if server is not None:
            stop(server.pid)
        shutil.rmtree(workdir, ignore_errors=True)
