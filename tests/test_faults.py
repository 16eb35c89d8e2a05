"""Faults: a full disk, a read-only medium, bit flips in pages and payloads, and a PostgreSQL
server restarted under the appenders. Each ends in a typed error (or a verify naming the first
bad seq), nothing acknowledged is lost, and the log opens and appends again afterwards."""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from eventlog import EventLog, Proposed
from eventlog.cli.main import main
from eventlog.errors import StorageDamagedError, StorageUnavailableError
from eventlog.testing.postgres_server import (
    PostgresServer,
    PostgresUnavailable,
    running_server,
    stop,
)
from tests.vocabulary import LogNote

PAD = "p" * 4000
ONE_LINE = '{"stream": "s", "type": "LogNote", "data": {"text": "x"}}\n'


def cli(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(
        main, ["--events-module", "tests.vocabulary", *args], input=input, catch_exceptions=False
    )


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs of its own (root and mount(8) needed; skipped where mounting is refused)."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a size-limited tmpfs here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _checkpointed(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


# -- disk full -------------------------------------------------------------------------------


def test_a_full_disk_is_a_clear_error_and_loses_nothing_acknowledged(small_fs: Path) -> None:
    target = small_fs / "log.db"
    filler = small_fs / "filler"
    filler.write_bytes(b"\0" * (1024 * 1024))
    acked: list[uuid.UUID] = []
    with EventLog.open(target) as log:
        with pytest.raises(StorageUnavailableError, match="disk is full") as caught:
            for n in range(1000):
                event_id = uuid.uuid4()
                log.append("s", [Proposed(LogNote(text=PAD, n=n), event_id)])
                acked.append(event_id)
        assert "retry the append with the same event ids" in (caught.value.hint or "")
        assert len(acked) > 10  # the disk filled up after real appends, not at once
    line = f'{{"stream": "s", "type": "LogNote", "data": {{"text": "{PAD}"}}}}\n' * 20
    full = cli("append", str(target), input=line)
    assert full.exit_code == 6, full.output
    assert "disk is full" in full.stderr and "Traceback" not in full.stderr
    filler.unlink()  # space again: the log opens, holds every acknowledged event, appends
    with EventLog.open(target) as log:
        stored = [r.event_id for r in log.read_records()]
        assert stored == acked
        assert log.verify().ok
        assert log.append("s", [LogNote(text="after")]).seqs == [len(acked) + 1]


# -- read-only medium ------------------------------------------------------------------------


def test_a_log_on_a_read_only_medium_is_read_but_never_written(small_fs: Path) -> None:
    target = small_fs / "log.db"
    with EventLog.open(target) as log:
        log.append("s", [LogNote(text=f"n{i}") for i in range(3)])
    copy = small_fs.parent / "copy.db"  # replayed elsewhere: no -shm left beside the log
    shutil.copyfile(target, copy)
    before = cli("replay", str(copy), "--json").stdout
    assert sorted(p.name for p in small_fs.iterdir()) == ["log.db"]
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    with pytest.raises(StorageUnavailableError), EventLog.open(target) as log:
        log.append("s", [LogNote(text="refused")])
    appended = cli("append", str(target), input=ONE_LINE)
    assert appended.exit_code == 6, appended.output
    assert "Traceback" not in appended.stderr
    assert cli("verify", str(target)).stdout.startswith("ok: 3 records")
    assert cli("replay", str(target), "--json").stdout == before


# -- bit flips -------------------------------------------------------------------------------


@pytest.fixture
def intact(tmp_path: Path) -> tuple[Path, str]:
    target = tmp_path / "log.db"
    with EventLog.open(target) as log:
        for i in range(40):
            log.append(f"s{i % 4}", [LogNote(text=f"marker-{i:04d}", n=i)])
    _checkpointed(target)
    return target, cli("replay", str(target), "--json").stdout


def test_a_bit_flip_in_a_payload_is_named_by_verify(intact: tuple[Path, str]) -> None:
    target, _ = intact
    data = bytearray(target.read_bytes())
    at = data.index(b"marker-0017")
    data[at + 3] ^= 0x04
    target.write_bytes(bytes(data))
    result = cli("verify", str(target))
    assert result.exit_code == 1
    assert "FAILED: first bad seq 18" in result.stdout


def test_bit_flips_anywhere_never_replay_silently_wrong_nor_exit_70(
    intact: tuple[Path, str],
) -> None:
    """Outcomes allowed: the same records (the flip hit unused space), verify naming a seq,
    a schema error naming a seq, or the file reported damaged — never another history."""
    target, original = intact
    pristine = target.read_bytes()
    rng = random.Random(9)
    outcomes: dict[int, int] = {}
    for _ in range(60):
        data = bytearray(pristine)
        for _ in range(rng.choice([1, 1, 2, 8])):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        target.write_bytes(bytes(data))
        verified = cli("verify", str(target))
        replayed = cli("replay", str(target), "--json")
        assert verified.exit_code in (0, 1, 3, 6), verified.output
        assert replayed.exit_code in (0, 1, 3, 6), replayed.output
        assert "Traceback" not in verified.stderr + replayed.stderr
        if verified.exit_code == 0 and replayed.exit_code == 0:
            assert replayed.stdout == original, "verify passed but replay changed"
        outcomes[verified.exit_code] = outcomes.get(verified.exit_code, 0) + 1
    assert outcomes.get(1, 0) + outcomes.get(6, 0) > 0, outcomes  # the flips were noticed


def test_a_flipped_page_header_says_the_file_is_damaged(tmp_path: Path) -> None:
    target = tmp_path / "log.db"
    with EventLog.open(target) as log:
        log.append("s", [LogNote(text=f"n{i}") for i in range(200)])
    _checkpointed(target)
    data = bytearray(target.read_bytes())
    page = 4096
    for offset in range(page, len(data), page):  # every b-tree page's type byte
        data[offset] = 0x00
    target.write_bytes(bytes(data))
    with pytest.raises(StorageDamagedError, match="damaged"), EventLog.open(target) as log:
        list(log.read_records())
    result = cli("verify", str(target))
    assert result.exit_code == 6
    assert "damaged" in result.stderr


# -- PostgreSQL restarted --------------------------------------------------------------------


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server this test may stop and start again (stopped by PID)."""
    try:
        with running_server() as server:
            try:
                yield server
            finally:  # a restarted server has a new PID: stop that one too
                pid_file = server.datadir / "postmaster.pid"
                if pid_file.is_file():
                    stop(int(pid_file.read_text().splitlines()[0]))
    except PostgresUnavailable as exc:
        pytest.skip(f"PostgreSQL unavailable: {exc}")


def _restart_half(server: PostgresServer, action: str) -> None:
    """Stop the server (by its PID) or start it again on the same data and port."""
    if action == "stop":
        pid_file = server.datadir / "postmaster.pid"
        stop(int(pid_file.read_text().splitlines()[0]))
        return
    argv = [str(server.bindir / "pg_ctl"), "-D", str(server.datadir), "-w", "start"]
    argv += ["-l", str(server.socket_dir / "restarted.log")]
    argv += ["-o", f"-c listen_addresses=127.0.0.1 -p {server.port} -k {server.socket_dir}"]
    if os.geteuid() == 0:  # the postmaster refuses to run as root
        argv = ["runuser", "-u", "postgres", "--", *argv]
    subprocess.run(argv, check=True, capture_output=True, cwd=server.socket_dir)


@pytest.mark.postgres
@pytest.mark.slow
def test_appends_across_a_postgresql_restart_fail_typed_then_resume_without_doubles(
    own_postgres: PostgresServer,
) -> None:
    url = own_postgres.url()
    with EventLog.open(url, busy_timeout=2) as log:
        first = [Proposed(LogNote(text="before", n=i), uuid.uuid4()) for i in range(3)]
        log.append("s", first)
        _restart_half(own_postgres, "stop")
        during = [Proposed(LogNote(text="during", n=i), uuid.uuid4()) for i in range(3)]
        with pytest.raises(StorageUnavailableError):
            log.append("s", during)
        down = cli("append", url, input=ONE_LINE)
        assert down.exit_code == 6 and "Traceback" not in down.stderr
        _restart_half(own_postgres, "start")
        resumed = None
        for _ in range(3):  # a pooled connection from before the restart fails once at most
            try:
                resumed = log.append("s", during)
                break
            except StorageUnavailableError:
                continue
        assert resumed is not None and resumed.seqs == [4, 5, 6]
        again = log.append("s", during)  # the caller's retry after a lost reply: no double
        assert again.seqs == [4, 5, 6]
        assert log.append("s", first).seqs == [1, 2, 3]
        assert [r.seq for r in log.read_records()] == [1, 2, 3, 4, 5, 6]
        assert log.verify().ok
