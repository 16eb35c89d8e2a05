"""Hypothesis fuzz of the restore path: a real ledger log (reservation, dispatch, seal,
checkpoint, restore) with one record's payload hand-edited — a field dropped, retyped, set to
a huge or odd value, or the payload replaced by junk — is either restored (the edit was still
a valid event) or refused with a typed eventlog error naming that record's seq. Never another
exception. Seeds are fixed (derandomize) so a failure found in CI reproduces."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from eventlog import EventLog
from eventlog.cli.main import main
from eventlog.dataplane.memory import InMemoryDataPlane
from eventlog.errors import EventLogError
from eventlog.recovery.ledger import RecoveryLedger
from tests.reliability import drop_append_only

LEDGER_LOG = Path(__file__).parent / "data" / "log-0.1.0-before-recovery-move.sqlite"
RECORDS = 8

ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=12),
    st.binary(max_size=12),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


@pytest.fixture(scope="module")
def ledger_log(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("ledger") / "run.db"
    shutil.copy(LEDGER_LOG, path)
    upgraded = CliRunner().invoke(main, ["db", "upgrade", str(path)])
    assert upgraded.exit_code == 0, upgraded.output
    with sqlite3.connect(path) as conn:
        drop_append_only(conn)  # as anyone hand-editing the file would first
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return path.read_bytes()


def _edited(payload: bytes, how: str, key_index: int, value: Any, junk: bytes) -> bytes:
    data = msgspec.msgpack.decode(payload)
    assert isinstance(data, dict)
    keys = [k for k in data if k != "type"]
    key = keys[key_index % len(keys)]
    if how == "drop":
        del data[key]
    elif how == "set":
        data[key] = value
    elif how == "tag":
        data["type"] = value
    else:
        return junk
    return msgspec.msgpack.encode(data)


@settings(
    derandomize=True,
    deadline=None,
    max_examples=50,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seq=st.integers(1, RECORDS),
    how=st.sampled_from(["drop", "set", "tag", "junk"]),
    key_index=st.integers(0, 20),
    value=ODD,
    junk=st.binary(max_size=24),
)
def test_a_hand_edited_record_restores_or_is_refused_naming_its_seq(
    ledger_log: bytes,
    tmp_path_factory: pytest.TempPathFactory,
    seq: int,
    how: str,
    key_index: int,
    value: Any,
    junk: bytes,
) -> None:
    path = tmp_path_factory.mktemp("case") / "run.db"
    path.write_bytes(ledger_log)
    with sqlite3.connect(path) as conn:
        (payload,) = conn.execute("SELECT payload FROM events WHERE seq = ?", (seq,)).fetchone()
        try:
            edited = _edited(payload, how, key_index, value, junk)
        except (TypeError, ValueError, OverflowError):  # msgpack cannot hold it: nothing to try
            return
        conn.execute("UPDATE events SET payload = ? WHERE seq = ?", (edited, seq))
    conn.close()
    with EventLog.open(path) as log:
        try:
            RecoveryLedger.open(log, InMemoryDataPlane())
        except EventLogError as exc:
            event(f"refused: {type(exc).__name__}")
            assert f"seq {seq}" in str(exc), f"{type(exc).__name__}: {exc}"
        else:
            event("restored")
