"""`eventlog append`: JSON lines in, one atomic append, nothing appended on bad input."""

from __future__ import annotations

import os
import subprocess
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from eventlog import EventLog, events
from eventlog.cli.times import format_ns
from eventlog.events import Event
from tests.cli.helpers import (
    EVENTLOG,
    ISO_NS,
    REPLAY_KEYS,
    REPO,
    append_notes,
    cli,
    count,
    json_lines,
    line,
    lines,
    query,
)
from tests.cli_vocabulary import CliMeasured, CliNote, CliPacked, CliRef


def test_append_then_replay_json_round_trips_every_field(log_file: str) -> None:
    trace, chosen = uuid.uuid4(), uuid.uuid4()
    measured = {
        "name": "loss",
        "value": 0.25,
        "ok": True,
        "tags": ["a", "b"],
        "ref": {"name": "r", "weight": 1.5},
        "trace_id": str(trace),
    }
    text = lines(
        line("group/g1", "CliNote", {"text": "héllo", "n": 3}, expected_version="no_stream"),
        line("group/g1", "CliMeasured", measured, expected_version=0, event_id=str(chosen)),
        line("controller", "CliNote", {"text": "x"}),
    )
    appended = cli("append", log_file, "--json", input=text)
    assert appended.exit_code == 0, appended.stderr
    positions = json_lines(appended.stdout)
    ids = [p.pop("event_id") for p in positions]
    assert positions == [
        {"seq": 1, "stream": "group/g1", "version": 0, "type": "CliNote"},
        {"seq": 2, "stream": "group/g1", "version": 1, "type": "CliMeasured"},
        {"seq": 3, "stream": "controller", "version": 0, "type": "CliNote"},
    ]
    assert ids[1] == str(chosen)

    replayed = json_lines(cli("replay", log_file, "--json").stdout)
    assert [list(obj) for obj in replayed] == [REPLAY_KEYS] * 3
    stored = [row[0] for row in query(log_file, "SELECT recorded_at FROM events ORDER BY seq")]
    for obj, ns in zip(replayed, stored, strict=True):
        assert ISO_NS.match(obj["recorded_at"])
        assert obj.pop("recorded_at") == format_ns(ns)
        assert format_ns(ns).startswith(
            datetime.fromtimestamp(ns // 10**9, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        )
    assert replayed == [
        {
            "seq": 1,
            "stream": "group/g1",
            "version": 0,
            "event_id": ids[0],
            "type": "CliNote",
            "data": {"text": "héllo", "n": 3},
        },
        {
            "seq": 2,
            "stream": "group/g1",
            "version": 1,
            "event_id": str(chosen),
            "type": "CliMeasured",
            "data": measured,
        },
        {
            "seq": 3,
            "stream": "controller",
            "version": 0,
            "event_id": ids[2],
            "type": "CliNote",
            "data": {"text": "x", "n": 0},
        },
    ]
    with EventLog.open(log_file) as log:
        assert [record.event for record in log.read()] == [
            CliNote(text="héllo", n=3),
            CliMeasured(
                name="loss",
                value=0.25,
                ok=True,
                tags=["a", "b"],
                ref=CliRef(name="r", weight=1.5),
                trace_id=trace,
            ),
            CliNote(text="x"),
        ]


class _Renamed(Event, frozen=True, kw_only=True, rename="camel", tag="_Renamed"):
    first_field: int
    by_id: dict[int, str] = msgspec.field(default_factory=dict)


def test_what_replay_prints_appends_back_whatever_the_types_shape(
    log_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fields by their encoded names (a renamed field), dict keys from JSON's text, an event
    encoded as an array given by its fields' names: each was refused."""
    monkeypatch.setitem(events._EVENT_TYPES, "_Renamed", _Renamed)
    with EventLog.open(log_file) as log:
        log.append("s", [_Renamed(first_field=1, by_id={2: "b"}), CliPacked(count=3, unit="t")])
        log.append("s", [CliPacked(count=4)])
    printed = json_lines(cli("replay", log_file, "--json").stdout)
    text = lines(*(line("t", p["type"], p["data"]) for p in printed))
    appended = cli("append", log_file, input=text)
    assert appended.exit_code == 0, appended.stderr
    with EventLog.open(log_file, read_only=True) as log:
        events_ = [r.event for r in log.read()]
    assert events_[3:] == events_[:3]


def test_an_event_encoded_as_an_array_cannot_skip_a_field_before_a_given_one(
    log_file: str,
) -> None:
    result = cli("append", log_file, input=lines(line("t", "CliPacked", {"unit": "t"})))
    assert result.exit_code == 2
    assert "line 1: CliPacked: field 'count' is missing, and a field after it is given" in (
        result.stderr
    )
    assert count(log_file) == 0


def test_append_prints_one_line_per_event_with_seq_stream_and_version(log_file: str) -> None:
    result = cli("append", log_file, input=lines(line("s", "CliNote", {"text": "a"})) * 2)
    rows = [row.split("\t") for row in result.stdout.splitlines()]
    assert [row[:4] for row in rows] == [["1", "s", "v0", "CliNote"], ["2", "s", "v1", "CliNote"]]


GOOD = line("s", "CliNote", {"text": "fine"})


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ('{"stream": "s", "type": "CliNote",', "line 2: invalid JSON: Input data was truncated"),
        ('{"stream": "s", "type": "CliNote"} x', "line 2: invalid JSON: JSON is malformed"),
        (
            line("s", "CliNote", {"text": 5}),
            "line 2: CliNote: Expected `str`, got `int` - at `data.text`",
        ),
        (
            line("s", "CliNote", {}),
            "line 2: CliNote: Object missing required field `text` - at `data`",
        ),
        (line("s", "CliNote", {"text": "a", "nn": 1}), "line 2: CliNote has no field 'nn'"),
        (line("s", "CliNoet", {"text": "a"}), "line 2: unknown event type 'CliNoet'"),
        (  # a nested struct ignored the key: the line was stored without it
            line(
                "s",
                "CliMeasured",
                {
                    "name": "a",
                    "value": 1.0,
                    "ok": True,
                    "tags": [],
                    "ref": {"name": "r", "weight": 1.0, "wieght": 2.0},
                },
            ),
            "line 2: CliMeasured: data.ref.wieght is no field (it would be dropped)",
        ),
        (
            line(
                "s",
                "CliDispatched",
                {"group_id": "g", "attempts": [{"rollout_id": "r"}, {"rollout_id": "q", "x": 1}]},
            ),
            "line 2: CliDispatched: data.attempts[1].x is no field (it would be dropped)",
        ),
        (
            '{"stream": "s", "type": "CliNote", "data": {"text": ' + "[" * 5000 + "]" * 5000 + "}}",
            "line 2: JSON nested too deeply",
        ),
        (line("", "CliNote", {"text": "a"}), "line 2: stream must not be empty"),
        (
            line("s", "CliNote", {"text": "a"}, expected_version="latest"),
            "line 2: Invalid enum value 'latest' - at `$.expected_version`",
        ),
        (
            line("s", "CliNote", {"text": "a"}, expected_version=-1),
            "line 2: expected_version must be >= 0, found -1",
        ),
        (
            line("s", "CliNote", {"text": "a"}, event_id="not-a-uuid"),
            "line 2: Invalid UUID - at `$.event_id`",
        ),
        ('{"stream": "s", "typ": "CliNote"}', "line 2: Object contains unknown field `typ`"),
        (
            line("s", "CliNote", {"text": "a", "n": 2**64}),
            "line 2: CliNote: can't serialize ints < -2**63 or > 2**64 - 1",
        ),
        (
            line("a\x00b", "CliNote", {"text": "a"}),
            "line 2: stream 'a\\x00b': a stream name is UTF-8 text without NUL characters",
        ),
        (
            line("s" * 100_000, "CliNote", {"text": "a"}),
            "line 2: stream must be a non-empty string of at most",
        ),
    ],
)
def test_a_bad_line_appends_nothing_and_names_the_line_and_field(
    log_file: str, bad: str, message: str
) -> None:
    result = cli("append", log_file, input=lines(GOOD, bad, GOOD))
    assert result.exit_code == 2
    first = result.stderr.splitlines()[0]
    assert first == f"error: {message}" or first.startswith(f"error: {message}")
    assert len(result.stderr.splitlines()) <= 2  # the error, and a hint when there is one
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert count(log_file) == 0


def test_an_unknown_type_hint_suggests_close_names(log_file: str) -> None:
    result = cli("append", log_file, input=lines(line("s", "CliNoet", {"text": "a"})))
    assert result.stderr.splitlines()[1] == "hint: did you mean CliNote?"


def test_a_version_conflict_on_any_line_appends_no_line_and_exits_4(log_file: str) -> None:
    append_notes(log_file, 1, stream="s")
    text = lines(
        line("other", "CliNote", {"text": "a"}, expected_version="no_stream"),
        line("s", "CliNote", {"text": "b"}, expected_version=5),
    )
    result = cli("append", log_file, input=text)
    assert result.exit_code == 4
    assert result.stderr == "error: stream 's': expected version 5, found version 0\n"
    assert count(log_file) == 1


def test_append_retry_with_the_same_event_ids_is_a_no_op(log_file: str) -> None:
    event_id = str(uuid.uuid4())
    text = lines(line("s", "CliNote", {"text": "once"}, event_id=event_id))
    first = cli("append", log_file, "--json", input=text)
    again = cli("append", log_file, "--json", input=text)
    assert again.exit_code == 0
    assert json_lines(again.stdout) == json_lines(first.stdout)
    assert count(log_file) == 1

    changed = lines(line("s", "CliNote", {"text": "other"}, event_id=event_id))
    conflict = cli("append", log_file, input=changed)
    assert conflict.exit_code == 4
    assert f"event id {event_id} is already stored at seq 1" in conflict.stderr
    assert count(log_file) == 1


def test_append_with_no_lines_appends_nothing(log_file: str) -> None:
    result = cli("append", log_file, input="\n\n")
    assert result.exit_code == 0
    assert result.stderr == "nothing to append\n"
    assert count(log_file) == 0


@pytest.mark.parametrize("content", [b"hello\n", b""])
def test_no_lines_to_a_file_that_is_not_a_log_names_the_file_not_the_input(
    tmp_path: Path, content: bytes
) -> None:
    """It said "nothing to append" (exit 0), as if the file were a log."""
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    result = cli("append", str(path), input="\n")
    assert result.exit_code in (3, 6), result.output
    assert result.stderr.startswith(f"error: {path}: ") and "nothing to append" not in result.stderr
    assert path.read_bytes() == content


def test_a_byte_order_mark_before_the_first_line_is_taken_as_utf_8(log_file: str) -> None:
    """Editors on Windows save UTF-8 with a BOM; JSON's RFC 8259 lets a reader ignore it.
    It was "line 1: invalid JSON: invalid character"."""
    text = line("notes", "CliNote", {"text": "after a BOM"})
    result = cli("append", log_file, input="\ufeff" + lines(text, text))
    assert result.exit_code == 0, result.output
    assert count(log_file) == 2
    refused = cli("append", log_file, input=lines(text, "\ufeff" + text))
    assert refused.exit_code == 2 and "line 2: invalid JSON" in refused.stderr
    assert count(log_file) == 2


def test_a_closed_stdin_is_named(log_file: str) -> None:
    """`append LOG <&-`: click's RuntimeError was exit 70."""
    result = subprocess.run(
        [str(EVENTLOG), "append", log_file],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=lambda: os.close(0),
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "stdin is closed" in result.stderr and "Traceback" not in result.stderr


def test_a_refused_stream_name_is_named_in_a_line_not_echoed_whole(log_file: str) -> None:
    result = cli("append", log_file, input=lines(line("s" * 100_000, "CliNote", {"text": "a"})))
    assert result.exit_code == 2
    (said,) = result.stderr.splitlines()
    assert said.startswith("error: line 1: stream must be") and len(said) < 300
    assert "(100,002 characters)" in said


@pytest.mark.parametrize(
    ("when", "said", "stored"),
    [
        ("before", "interrupted: nothing was appended", 0),
        ("after", "interrupted: 2 events were appended, from seq 1", 2),
        ("printing", "interrupted: 2 events were appended (seq 1..2), then stopped while", 2),
    ],
)
def test_an_append_stopped_by_ctrl_c_says_whether_its_events_were_appended(
    log_file: str, monkeypatch: pytest.MonkeyPatch, when: str, said: str, stored: int
) -> None:
    """Ctrl-C during the COMMIT, or while the seqs were printed, ended with a bare
    "interrupted" and every event in the log: a script retrying on 130 appended them twice.
    The batch is whole or absent, so the first event's id (chosen here) tells which."""
    real = EventLog.append_batch

    def stopped(self: EventLog, requests: Any) -> Any:
        if when == "before":
            raise KeyboardInterrupt
        results = real(self, requests)
        if when == "after":
            raise KeyboardInterrupt
        return results

    monkeypatch.setattr(EventLog, "append_batch", stopped)
    if when == "printing":
        monkeypatch.setattr("eventlog.cli.append.json_line", _raise_keyboard_interrupt)
    text = lines(line("s", "CliNote", {"text": "a"}), line("s", "CliNote", {"text": "b"}))
    result = cli("append", log_file, "--json", input=text)
    assert result.exit_code == 130
    assert result.stderr.splitlines()[0].startswith(said), result.stderr
    hinted = "hint: they are in the log: do not append them again" in result.stderr
    assert hinted == (stored > 0)
    assert count(log_file) == stored


def _raise_keyboard_interrupt(*args: Any, **kwargs: Any) -> None:
    raise KeyboardInterrupt
