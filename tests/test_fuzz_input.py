"""Hypothesis fuzz of what comes from outside: payload bytes given to the codec, lines given to
`eventlog append`, and whatever a hostile hand stores in a record's columns. Each gets a typed
error naming what was wrong, appends nothing, and the CLI never exits 70 nor prints a traceback.
Seeds are fixed (derandomize) so a failure found in CI reproduces."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from eventlog import EventLog, codec
from eventlog.cli.append import parse_line
from eventlog.cli.main import main
from eventlog.errors import InvalidEventError, SchemaError
from tests.reliability import drop_append_only
from tests.vocabulary import LogNote

FUZZ = settings(
    derandomize=True,
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
FEW = settings(FUZZ, max_examples=40)

HUGE = st.one_of(st.integers(min_value=2**63), st.integers(max_value=-(2**63) - 1))
WEIRD_TEXT = st.text(
    alphabet=st.characters(codec="utf-8") | st.sampled_from(["\x00", "\udc80", "\ud800", "é"]),
    max_size=30,
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | HUGE | st.floats() | WEIRD_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(WEIRD_TEXT, inner, max_size=3),
    max_leaves=8,
)


def cli(*args: str, input: bytes | None = None) -> Result:
    return CliRunner().invoke(
        main, ["--events-module", "tests.vocabulary", *args], input=input, catch_exceptions=False
    )


# -- the codec ---------------------------------------------------------------------------

_valid = codec.encode(LogNote(text="hello", n=3))[2]


@FUZZ
@given(
    payload=st.binary(max_size=64)
    | st.builds(lambda cut: _valid[:cut], st.integers(0, len(_valid)))
    | st.builds(
        lambda b, i: _valid[:i] + b + _valid[i:], st.binary(max_size=4), st.integers(0, 20)
    ),
    type_name=st.sampled_from(["LogNote", "NoSuchType", "", "\x00", "\udc80"]),
    schema=st.integers(-5, 5) | HUGE,
)
def test_decoding_any_payload_returns_an_event_or_a_schema_error_naming_the_seq(
    payload: bytes, type_name: str, schema: int
) -> None:
    try:
        event = codec.decode(type_name, schema, payload, seq=17)
    except SchemaError as exc:
        assert str(exc).startswith("seq 17: ")
        assert exc.seq == 17
    else:
        assert isinstance(event, LogNote)


@FUZZ
@given(text=WEIRD_TEXT, n=st.integers() | HUGE)
@example(text="lone \ud800", n=0)
@example(text="nul \x00", n=2**64)
def test_encoding_any_field_values_returns_a_record_or_an_invalid_event_error(
    text: str, n: int
) -> None:
    try:
        type_name, schema, payload = codec.encode(LogNote(text=text, n=n))
    except InvalidEventError as exc:
        assert "LogNote" in str(exc)
    else:
        assert codec.decode(type_name, schema, payload) == LogNote(text=text, n=n)


# -- `eventlog append` input --------------------------------------------------------------

LINE_OBJECTS = st.fixed_dictionaries(
    {},
    optional={
        "stream": WEIRD_TEXT | JSON_VALUES,
        "type": st.sampled_from(["LogNote", "LogNot", ""]) | JSON_VALUES,
        "data": st.fixed_dictionaries(
            {}, optional={"text": WEIRD_TEXT | JSON_VALUES, "n": st.integers() | HUGE | JSON_VALUES}
        )
        | JSON_VALUES,
        "expected_version": st.sampled_from(["any", "no_stream", "nope"]) | st.integers() | HUGE,
        "event_id": st.uuids().map(str) | JSON_VALUES,
        "extra": JSON_VALUES,
    },
)
LINES = st.one_of(
    LINE_OBJECTS.map(lambda o: json.dumps(o).encode("utf-8", "surrogatepass")),
    st.binary(max_size=40),
)


@FUZZ
@given(raw=LINES)
def test_any_input_line_parses_or_is_an_invalid_event_error_naming_the_line(raw: bytes) -> None:
    try:
        request = parse_line(7, raw)
    except InvalidEventError as exc:
        assert str(exc).startswith("line 7: ")
    else:
        assert request.stream


@pytest.fixture(scope="module")
def fuzz_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fuzz") / "log.db"
    with EventLog.open(path) as log:
        log.append("s", [LogNote(text="first")])
    return path


@FEW
@given(lines=st.lists(LINES, min_size=1, max_size=3))
def test_cli_append_of_any_input_exits_documented_and_appends_all_or_nothing(
    fuzz_log: Path, lines: list[bytes]
) -> None:
    with EventLog.open(fuzz_log) as log:
        before = log.head()
    result = cli("append", str(fuzz_log), input=b"\n".join(lines) + b"\n")
    assert result.exit_code in (0, 2, 4), result.output
    assert "Traceback" not in result.stderr
    with EventLog.open(fuzz_log) as log:
        after = log.head()
    if result.exit_code == 0:
        assert after - before == len(result.stdout.splitlines())
    else:
        assert after == before
        assert result.stderr.startswith("error: ")


# -- whatever a hostile hand stores in a record -------------------------------------------

STORED = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=40),
)
COLUMNS = ["stream", "version", "event_id", "type", "schema", "recorded_at", "payload", "chain"]


@pytest.fixture(scope="module")
def hostile_template(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("hostile") / "log.db"
    with EventLog.open(path) as log:
        log.append("s", [LogNote(text=f"n{i}", n=i) for i in range(4)])
    with sqlite3.connect(path) as conn:
        drop_append_only(conn)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return path.read_bytes()


@FEW
@given(column=st.sampled_from(COLUMNS), value=STORED)
def test_any_stored_value_is_read_or_named_by_seq_never_exit_70(
    hostile_template: bytes, tmp_path_factory: pytest.TempPathFactory, column: str, value: object
) -> None:
    path = tmp_path_factory.mktemp("case") / "log.db"
    path.write_bytes(hostile_template)
    with sqlite3.connect(path) as conn:
        conn.execute(f"UPDATE events SET {column} = ? WHERE seq = 2", (value,))
    conn.close()
    for command in (["verify"], ["replay", "--json"]):
        result = cli(command[0], str(path), *command[1:])
        assert result.exit_code in (0, 1, 3), (command, result.output)
        assert "Traceback" not in result.stderr
        if result.exit_code != 0 and command == ["verify"]:
            assert "seq 2" in result.output, result.output


def test_msgspec_is_what_the_payloads_are_made_of() -> None:
    """The fuzz above mutates real payloads: make sure they are msgpack maps."""
    assert isinstance(msgspec.msgpack.decode(_valid), dict)
