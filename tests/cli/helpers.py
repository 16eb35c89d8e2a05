"""What the command-line tests share: running `eventlog` in-process or installed, JSON
lines, and raw sqlite3 access (the way an attacker or an old tool would touch the file)."""

from __future__ import annotations

import gc
import json
import os
import queue
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from alembic.script import ScriptDirectory
from click.testing import CliRunner, Result

from eventlog.chain import link
from eventlog.cli.main import main
from eventlog.store import migrate
from tests.reliability import drop_append_only

REPO = Path(__file__).resolve().parents[2]


EVENTLOG = Path(sys.executable).with_name("eventlog")


HEAD_REVISION = ScriptDirectory(str(migrate.migrations_dir())).get_current_head()


REPLAY_KEYS = ["seq", "stream", "version", "event_id", "type", "recorded_at", "data"]


ISO_NS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z$")


def cli(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def line(stream: str, type_name: str, data: dict[str, Any], **extra: Any) -> str:
    return json.dumps({"stream": stream, "type": type_name, "data": data, **extra})


def lines(*items: str) -> str:
    return "\n".join(items) + "\n"


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(item) for item in text.splitlines()]


def sql(path: str, *statements: str | tuple[str, tuple[Any, ...]]) -> None:
    with sqlite3.connect(path) as conn:
        drop_append_only(conn)  # as anyone tampering with the file would first
        for statement in statements:
            if isinstance(statement, tuple):
                conn.execute(*statement)
            else:
                conn.execute(statement)
    conn.close()


def query(path: str, text: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(text).fetchall()
    conn.close()
    return rows


def count(path: str) -> int:
    return int(query(path, "SELECT count(*) FROM events")[0][0])


def insert_raw(
    path: str,
    stream: str,
    type_name: str,
    schema: int,
    data: dict[str, Any],
    *,
    tag_field: str = "type",
) -> int:
    """Append a record by hand with a correct chain value (as a newer program would); its
    payload is tagged first, as msgspec writes a struct."""
    head, previous = query(path, "SELECT seq, chain FROM events ORDER BY seq DESC LIMIT 1")[0]
    seq, event_id, recorded_at = head + 1, uuid.uuid4().bytes, 1_800_000_000_123_456_789
    payload = msgspec.msgpack.encode({tag_field: type_name, **data})
    chain = link(previous, seq, stream, 0, event_id, type_name, schema, recorded_at, payload)
    sql(
        path,
        (
            "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (seq, stream, 0, event_id, type_name, schema, recorded_at, payload, chain),
        ),
    )
    return int(seq)


def append_notes(path: str, count_: int, stream: str = "s") -> None:
    text = lines(*(line(stream, "CliNote", {"text": f"n{i}", "n": i}) for i in range(count_)))
    assert cli("append", path, input=text).exit_code == 0


def chunks_asked(monkeypatch: pytest.MonkeyPatch, module: str) -> list[tuple[int, int]]:
    """The seq chunks `module` (replay or export) will make, each as it is taken."""
    from eventlog.cli import workers

    asked: list[tuple[int, int]] = []
    chunk = workers.seq_chunks

    def counted(*args: Any) -> tuple[int, Iterator[tuple[int, int]]]:
        most, chunks = chunk(*args)

        def noted() -> Iterator[tuple[int, int]]:
            for c in chunks:
                asked.append(c)
                yield c

        return most, noted()

    monkeypatch.setattr(f"{module}.seq_chunks", counted)
    return asked


def run_installed(
    *args: str, input: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run(
        [str(EVENTLOG), *args],
        input=input,
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
        check=False,
    )


def _reader(stream: Any) -> queue.Queue[str]:
    lines_read: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for text in stream:
            lines_read.put(text)

    threading.Thread(target=pump, daemon=True).start()
    return lines_read


def collector_states_at_fold(monkeypatch: Any) -> list[bool]:
    """Whether the cyclic collector was on at each `fold_rows` of the recovery audit pass
    (`stats` and `report`), filled in as the command runs."""
    from eventlog.recovery.cli import runlog
    from projections.audit_stats import fold_rows

    seen: list[bool] = []

    def spy(*args: Any, **kwargs: Any) -> None:
        seen.append(gc.isenabled())
        fold_rows(*args, **kwargs)

    monkeypatch.setattr(runlog, "fold_rows", spy)
    return seen


def as_nobody() -> list[str] | None:
    """The command prefix that runs a process as user nobody, or None where it cannot be
    done here: as root, setpriv drops to nobody; as another user, a folder it cannot write
    is a chmod away and no prefix is needed."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        return None
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    probe = subprocess.run([*prefix, sys.executable, "-c", "import eventlog"], cwd=REPO)
    return prefix if probe.returncode == 0 else None
