"""`replay --json` writes most records the short way (`views.write_json_line`: one encoding
of the envelope and one of the event) and the rest the long way (`view_record`, then
`json_object`). The long way is the definition: every line must be its bytes exactly."""

from __future__ import annotations

import io
import json
import sys
import uuid
from typing import Any

import msgspec
import pytest

from eventlog.cli import views
from eventlog.cli.output import json_line
from eventlog.cli.views import json_object, view_record
from eventlog.events import Event
from eventlog.log import EventLog
from eventlog.recovery.cli.runlog import RunLog
from tests.cli.audited_run import AuditedRun
from tests.cli.helpers import cli, insert_raw, line, lines
from tests.cli_vocabulary import CliLabelled, CliPacked


def the_long_way(path: str, *, allow_unknown: bool = False) -> str:
    """Every record's line as `json_line(json_object(view_record(...)))` writes it."""
    log = EventLog.open(path, read_only=True)
    try:
        run = RunLog(log)
        mark = run.mark if run.skipped else (lambda _seq: None)
        return "".join(
            json_line(
                json_object(view_record(record, allow_unknown=allow_unknown, mark=mark(record.seq)))
            )
            + "\n"
            for record in log.read_records()
        )
    finally:
        log.close()


def replayed(path: str, *args: str) -> str:
    result = cli("replay", path, "--json", *args)
    assert result.exit_code == 0, result.stderr
    return result.stdout


def test_every_line_of_a_recovery_run_is_the_long_way_byte_for_byte(run: AuditedRun) -> None:
    """The audited run: every ledger type, nested structs, rolled-back (marked) records."""
    expected = the_long_way(run.path)
    assert '"rolled_back":true' in expected  # marked records are part of the comparison
    assert replayed(run.path) == expected


def test_a_sets_items_are_printed_in_the_order_of_their_json(log_file: str) -> None:
    """Not in the set's iteration order (which msgspec's JSON of the event keeps, and which
    for text hangs on the process's hash seed): such a type takes the long way."""
    letters = frozenset("zyxwvutsrqponm")
    with EventLog.open(log_file) as log:
        log.append("s", [CliLabelled(labels=letters)])
    printed = replayed(log_file)
    assert printed == the_long_way(log_file)
    assert json.loads(printed)["data"] == {"labels": sorted(letters)}


def test_an_event_encoded_as_an_array_is_printed_by_its_fields_names(log_file: str) -> None:
    with EventLog.open(log_file) as log:
        log.append("s", [CliPacked(count=3)])
    assert json.loads(replayed(log_file))["data"] == {"count": 3, "unit": "tokens"}
    table = cli("replay", log_file)
    assert table.exit_code == 0, table.stderr
    assert "count" in table.stdout


class _Foreign(Event, frozen=True, kw_only=True, tag="_Foreign"):
    raw: msgspec.Raw
    ext: msgspec.msgpack.Ext


def test_raw_and_ext_fields_are_printed_as_json(
    log_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """msgspec writes a Raw field's msgpack bytes as they are into JSON, and cannot write an
    Ext: such a type takes the long way (the line was not JSON, or exit 70)."""
    from eventlog import events

    monkeypatch.setitem(events._EVENT_TYPES, "_Foreign", _Foreign)
    raw = msgspec.Raw(msgspec.msgpack.encode({"k": [1, 2]}))
    with EventLog.open(log_file) as log:
        log.append("s", [_Foreign(raw=raw, ext=msgspec.msgpack.Ext(5, b"ab"))])
    printed = replayed(log_file)
    assert json.loads(printed)["data"] == {"raw": {"k": [1, 2]}, "ext": {"code": 5, "data": "YWI="}}
    table = cli("replay", log_file)
    assert table.exit_code == 0, table.stderr


class _Loose(Event, frozen=True, kw_only=True, tag="_Loose"):
    value: Any


def test_an_ext_held_by_a_field_typed_any_is_printed_as_json(
    log_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The short way is chosen by the declared types, and `Any` may hold what msgspec's JSON
    cannot write (exit 70): such a line falls back to the long way."""
    from eventlog import events

    monkeypatch.setitem(events._EVENT_TYPES, "_Loose", _Loose)
    with EventLog.open(log_file) as log:
        log.append("s", [_Loose(value=msgspec.msgpack.Ext(5, b"ab")), _Loose(value=[1, "x"])])
    printed = replayed(log_file)
    assert [json.loads(line)["data"] for line in printed.splitlines()] == [
        {"value": {"code": 5, "data": "YWI="}},
        {"value": [1, "x"]},
    ]
    assert printed == the_long_way(log_file)
    table = cli("replay", log_file)
    assert table.exit_code == 0 and '{"code":5,"data":"YWI="}' in table.stdout, table.stderr


def test_odd_values_and_unknown_records_are_the_long_way_byte_for_byte(log_file: str) -> None:
    measured: dict[str, Any] = {
        "name": 'quote " back\\slash \u00e9\u4e2d \U0001f600 \n tab\t',
        "value": -0.1,
        "ok": True,
        "tags": ["a", "", "\u2028"],
        "ref": {"name": "r", "weight": 1e300},
        "trace_id": str(uuid.UUID(int=7)),
    }
    records = lines(
        line('s/\u00e9 "q"', "CliMeasured", measured),
        line("s", "CliMeasured", {**measured, "ref": None, "trace_id": None, "tags": []}),
        line("empty", "CliBare", {}),
        line("s", "CliNote", {"text": ""}),
    )
    assert cli("append", log_file, input=records).exit_code == 0
    insert_raw(log_file, "future", "CliVanished", 1, {"color": "red"})
    assert replayed(log_file, "--allow-unknown") == the_long_way(log_file, allow_unknown=True)
    assert '"data":{}' in replayed(log_file, "--type", "CliBare")


@pytest.fixture
def long_ways(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The seqs `replay --json` sent the long way (view_record)."""
    seen: list[int] = []
    original = views.view_record

    def counting(record: Any, **kwargs: Any) -> Any:
        seen.append(record.seq)
        return original(record, **kwargs)

    monkeypatch.setattr(views, "view_record", counting)
    return seen


def test_only_marked_records_take_the_long_way(run: AuditedRun, long_ways: list[int]) -> None:
    replayed(run.path)
    assert marked_seqs(run) and long_ways == marked_seqs(run)


def test_only_unreadable_records_take_the_long_way(log_file: str, long_ways: list[int]) -> None:
    assert cli("append", log_file, input=line("s", "CliNote", {"text": "a"}) + "\n").exit_code == 0
    unknown = insert_raw(log_file, "future", "CliVanished", 1, {"color": "red"})
    replayed(log_file, "--allow-unknown")
    assert long_ways == [unknown]


def marked_seqs(run: AuditedRun) -> list[int]:
    log = EventLog.open(run.path, read_only=True)
    try:
        marks = RunLog(log)
        return [r.seq for r in log.read_records() if marks.mark(r.seq) is not None]
    finally:
        log.close()


def test_events_without_fields_take_the_short_way(log_file: str, long_ways: list[int]) -> None:
    records = lines(line("empty", "CliBare", {}), line("s", "CliNote", {"text": "a"}))
    assert cli("append", log_file, input=records).exit_code == 0
    assert '"data":{}' in replayed(log_file)
    assert long_ways == []


class _Kind(Event, frozen=True, tag="Kinded", tag_field="kind"):
    text: str


def test_an_event_tagged_by_another_field_is_left_to_the_long_way() -> None:
    """Its JSON does not start with a "type" tag: nothing is written, `out` is as it was."""
    out = bytearray(b"before\n")
    head = views.JsonHead(1, "s", 0, str(uuid.UUID(int=1)), "Kinded", "2026-11-29T12:00:00Z")
    assert views.write_json_line(out, head, _Kind(text="a")) is False
    assert out == b"before\n"


def test_json_lines_are_written_a_chunk_at_a_time(
    log_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory stays flat: the lines go out whenever the chunk is full, not all at the end."""
    from eventlog.cli import replay as module

    written: list[bytes] = []
    real = module._write

    def counting(out: Any, binary: Any, chunk: bytearray) -> None:
        written.append(bytes(chunk))
        real(out, binary, chunk)

    monkeypatch.setattr(module, "_write", counting)
    monkeypatch.setattr(module, "_CHUNK_BYTES", 1)
    notes = lines(*(line("s", "CliNote", {"text": f"n{i}"}) for i in range(3)))
    assert cli("append", log_file, input=notes).exit_code == 0
    text = replayed(log_file)
    assert written == [*(item + b"\n" for item in text.encode().splitlines()), b""]


class _Terminal(io.TextIOWrapper):
    """A stdout that says it is a terminal; what reaches its byte buffer directly is kept
    apart from what goes through `write` (where rich clears a live progress bar first)."""

    def __init__(self) -> None:
        self.direct = io.BytesIO()
        super().__init__(self.direct, encoding="utf-8")
        self.through: list[str] = []

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.through.append(text)
        return len(text)


def _rows(log_file: str, count: int) -> list[Any]:
    notes = lines(*(line("s", "CliNote", {"text": f"n{i}"}) for i in range(count)))
    assert cli("append", log_file, input=notes).exit_code == 0
    with EventLog.open(log_file, read_only=True) as log:
        return list(log.read_rows(1, log.head()))


def test_on_a_terminal_json_lines_go_through_the_text_stream(
    log_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A progress bar may be live on a terminal: lines written to the byte buffer under
    rich's stream proxy were glued to the bar's last frame, never cleared."""
    from eventlog.cli import replay as module

    rows = _rows(log_file, 3)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    module._write_json(((row, None) for row in rows), allow_unknown=False)
    assert terminal.direct.getvalue() == b""
    assert "".join(terminal.through).splitlines() == replayed(log_file).splitlines()


def test_a_record_that_fails_to_encode_leaves_no_half_line(
    log_file: str, monkeypatch: pytest.MonkeyPatch, capfdbinary: pytest.CaptureFixture[bytes]
) -> None:
    """The lines before the record are written whole; the failing record's own line, as far
    as it got into the chunk, is not."""
    from eventlog.cli import replay as module

    rows = _rows(log_file, 3)
    real = views.write_json_line
    calls = [0]

    def failing_second(out: bytearray, head: Any, event: Any) -> bool:
        calls[0] += 1
        if calls[0] == 2:
            out += b'{"seq":2,"stream":'
            raise TypeError("cannot encode")
        return real(out, head, event)

    monkeypatch.setattr(module, "write_json_line", failing_second)
    with pytest.raises(TypeError):
        module._write_json(((row, None) for row in rows), allow_unknown=False)
    written = capfdbinary.readouterr().out
    assert written.endswith(b"\n") and written.count(b"\n") == 1
    assert written == replayed(log_file).splitlines(keepends=True)[0].encode()
