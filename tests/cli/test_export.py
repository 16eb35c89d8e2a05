"""`eventlog export`: one typed table per event type plus `records`, read back with real
readers (pyarrow's Parquet reader, the csv and json modules)."""

from __future__ import annotations

import csv
import dataclasses
import datetime
import decimal
import enum
import fcntl
import gc
import hashlib
import json
import os
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventlog import codec
from eventlog.chain import link
from eventlog.cli import export as export_module
from eventlog.cli.exits import CliUsageError
from eventlog.events import Event, event_types
from eventlog.recovery.vocabulary import RestoreStarted, TokensStaged
from tests.cli.audited_run import AuditedRun
from tests.cli.helpers import append_notes, cli, insert_raw, query, sql
from tests.cli_vocabulary import CliKinded, CliMeasured, CliPacked, CliRef
from tests.strategies import events_of


def export(run: AuditedRun, out: Path, fmt: str) -> None:
    result = cli("export", run.path, "--format", fmt, "-o", str(out))
    assert result.exit_code == 0, result.stderr


def test_parquet_tables_have_every_record_with_typed_columns(
    run: AuditedRun, tmp_path: Path
) -> None:
    records = list(run.h.log.read())
    by_type = Counter(r.type for r in records)
    export(run, tmp_path, "parquet")

    table = pq.read_table(tmp_path / "records.parquet")
    assert table.num_rows == len(records)
    assert table.column("seq").to_pylist() == [r.seq for r in records]
    assert table.schema.field("recorded_at").type == pa.timestamp("ns", tz="UTC")
    assert table.column("recorded_at").cast(pa.int64()).to_pylist() == [
        r.recorded_at for r in records
    ]
    (restore,) = [r for r in records if isinstance(r.event, RestoreStarted)]
    assert isinstance(restore.event, RestoreStarted)
    seqs, marked_by = table.column("seq").to_pylist(), table.column("rolled_back_by").to_pylist()
    marks = dict(zip(seqs, marked_by, strict=True))
    assert {s for s, by in marks.items() if by is not None} == set(
        range(restore.event.rolled_back_from_seq, restore.seq)
    )
    assert set(marks[s] for s in marks if marks[s] is not None) == {restore.seq}

    files = {p.stem for p in tmp_path.glob("*.parquet")} - {"records"}
    assert files == set(by_type)
    for name, count in by_type.items():
        assert pq.read_table(tmp_path / f"{name}.parquet").num_rows == count, name

    staged = pq.read_table(tmp_path / "TokensStaged.parquet")
    assert staged.schema.field("token_count").type == pa.int64()
    assert staged.schema.field("staging_key").type == pa.string()
    sealed = pq.read_table(tmp_path / "SiblingSealed.parquet")
    assert sealed.schema.field("reward").type == pa.float64()
    assert sealed.schema.field("mask_sample").type == pa.bool_()
    receipt = json.loads(sealed.column("receipt").to_pylist()[0])  # nested: JSON text
    assert set(receipt) == {"rollout_id", "staging_keys"}
    finished = pq.read_table(tmp_path / "GenerationFinished.parquet")
    assert finished.schema.field("reward").nullable


def test_types_encoded_otherwise_than_the_rest_are_exported_by_their_fields(
    log_file: str, tmp_path: Path
) -> None:
    """An event encoded as an array, or tagged by another field, cannot join the other
    types in one decoder (msgspec refused to build it: every export failed, exit 70)."""
    from eventlog import EventLog

    with EventLog.open(log_file) as log:
        log.append(
            "s",
            [
                CliPacked(count=3),
                CliKinded(text="k"),
                CliMeasured(name="m", value=1.0, ok=True, tags=[]),
            ],
        )
    result = cli("export", log_file, "--format", "jsonl", "-o", str(tmp_path))
    assert result.exit_code == 0, result.stderr

    def rows(table: str) -> list[dict[str, Any]]:
        text = (tmp_path / f"{table}.jsonl").read_text()
        return [json.loads(line) for line in text.splitlines()]

    assert [r["data"] for r in rows("records")] == [
        '{"count":3,"unit":"tokens"}',
        '{"text":"k"}',
        '{"name":"m","ok":true,"ref":null,"tags":[],"trace_id":null,"value":1.0}',
    ]
    assert [(r["count"], r["unit"]) for r in rows("CliPacked")] == [(3, "tokens")]
    assert [r["text"] for r in rows("CliKinded")] == ["k"]


class _Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class _Shapes(Event, frozen=True, kw_only=True, omit_defaults=True, tag="_Shapes"):
    """What the tables once failed on (exit 70): an IntEnum or int Literal column (taken
    for text), a dict keyed by ints (sorted keys must be text), a default left out of the
    payload or an UNSET field (null in a column declared not null)."""

    level: _Level = _Level.LOW
    lit: Literal[1, 2] = 1
    counts: dict[int, str] = msgspec.field(default_factory=dict)
    maybe: int | msgspec.UnsetType = msgspec.UNSET
    big: int = 0


class _Named(Event, frozen=True, kw_only=True, tag="records"):
    """A type named like the records table."""

    n: int


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_unusual_field_types_are_exported_as_their_values(
    log_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    from eventlog import EventLog, events

    monkeypatch.setitem(events._EVENT_TYPES, "_Shapes", _Shapes)
    monkeypatch.setitem(events._EVENT_TYPES, "records", _Named)
    with EventLog.open(log_file) as log:
        log.append("s", [_Shapes(level=_Level.HIGH, lit=2, counts={2: "b", 1: "a"}, maybe=3)])
        log.append("s", [_Shapes(), _Named(n=7)])
    result = cli("export", log_file, "--format", fmt, "-o", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    shapes = _read_table(tmp_path / f"_Shapes.{fmt}", fmt)
    assert [(r["level"], r["lit"], r["counts"], r["maybe"], r["big"]) for r in shapes] == [
        (2, 2, '{"1":"a","2":"b"}', 3, 0),
        (1, 1, "{}", None, 0),
    ]
    data = [r["data"] for r in _read_table(tmp_path / f"records.{fmt}", fmt)]
    assert data == ['{"counts":{"1":"a","2":"b"},"level":2,"lit":2,"maybe":3}', "{}", '{"n":7}']
    assert [r["n"] for r in _read_table(tmp_path / f"%records.{fmt}", fmt)] == [7]


class _Stamped(Event, frozen=True, kw_only=True, tag="_Stamped"):
    at: datetime.datetime
    day: datetime.date
    took: datetime.timedelta
    ref: uuid.UUID
    price: decimal.Decimal
    blob: bytes | None = None


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_values_whose_builtins_are_text_are_text_columns_not_quoted_json(
    log_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """A datetime, date, duration, UUID, Decimal or bytes value is its builtins' text (ISO
    8601, canonical, as written, base64): a string column a reader can cast, not `"..."`."""
    from eventlog import EventLog, events

    monkeypatch.setitem(events._EVENT_TYPES, "_Stamped", _Stamped)
    stamped = _Stamped(
        at=datetime.datetime(2026, 12, 3, 14, 5, 6, 7000, tzinfo=datetime.UTC),
        day=datetime.date(2026, 12, 3),
        took=datetime.timedelta(seconds=90),
        ref=uuid.UUID(int=7),
        price=decimal.Decimal("1.10"),
        blob=b"ab",
    )
    with EventLog.open(log_file) as log:
        log.append("s", [stamped])
    result = cli("export", log_file, "--format", fmt, "-o", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    (row,) = _read_table(tmp_path / f"_Stamped.{fmt}", fmt)
    fields = ("at", "day", "took", "ref", "price", "blob")
    assert [row[f] for f in fields] == [
        "2026-12-03T14:05:06.007000Z",
        "2026-12-03",
        "PT90S",
        "00000000-0000-0000-0000-000000000007",
        "1.10",
        "YWI=",
    ]
    if fmt == "parquet":
        schema = pq.read_schema(tmp_path / "_Stamped.parquet")
        assert {f: str(schema.field(f).type) for f in fields} == dict.fromkeys(fields, "string")


def test_an_integer_beyond_parquets_is_an_error_naming_its_seq_and_column(
    log_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """msgspec keeps ints up to 2**64 - 1; Parquet's stop at 2**63 - 1 (was exit 70)."""
    from eventlog import EventLog, events

    monkeypatch.setitem(events._EVENT_TYPES, "_Shapes", _Shapes)
    with EventLog.open(log_file) as log:
        log.append("s", [_Shapes(big=1)])
        (seq,) = log.append("s", [_Shapes(big=2**64 - 1)]).seqs
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "records.parquet").write_bytes(b"an earlier export's table")
    result = cli("export", log_file, "-o", str(tmp_path / "p"))
    assert result.exit_code == 2, result.stderr
    assert result.stderr.splitlines()[0] == (
        f"error: seq {seq}: column big holds {2**64 - 1}, beyond Parquet's 64-bit integers"
    )
    assert "--format jsonl or csv" in result.stderr
    # a failed export writes no table, whole or in part, and leaves the earlier ones be
    assert [p.name for p in (tmp_path / "p").iterdir()] == ["records.parquet"]
    assert (tmp_path / "p" / "records.parquet").read_bytes() == b"an earlier export's table"
    result = cli("export", log_file, "--format", "jsonl", "-o", str(tmp_path / "j"))
    assert result.exit_code == 0, result.stderr
    assert [r["big"] for r in _read_table(tmp_path / "j" / "_Shapes.jsonl", "jsonl")] == [
        1,
        2**64 - 1,
    ]


class _Envelope(Event, frozen=True, kw_only=True, tag="_Envelope"):
    seq: int
    field_seq: int


def test_a_field_named_like_the_envelope_gets_a_column_no_other_field_has() -> None:
    """`seq` becomes `field_seq` unless a field has that name (two columns of one name: a
    value lost in jsonl, csv rows misaligned)."""
    from eventlog.cli.export import event_columns, typed_columns

    assert [column for _, column, _, _ in event_columns(_Envelope)] == [
        "field_field_seq",
        "field_seq",
    ]
    assert typed_columns(_Envelope, [_Envelope(seq=-1, field_seq=2)]) == {
        "field_field_seq": [-1],
        "field_seq": [2],
    }


class _KindedType(Event, frozen=True, kw_only=True, tag_field="kind", tag="_KindedType"):
    type: str


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_a_field_named_type_keeps_its_name_a_types_table_has_no_type_column(
    log_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """Only a type tagged by another field can have one; it was renamed `field_type`."""
    from eventlog import EventLog, events

    monkeypatch.setitem(events._EVENT_TYPES, "_KindedType", _KindedType)
    with EventLog.open(log_file) as log:
        log.append("s", [_KindedType(type="t")])
    result = cli("export", log_file, "--format", fmt, "-o", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    (row,) = _read_table(tmp_path / f"_KindedType.{fmt}", fmt)
    assert row["type"] == "t" and "field_type" not in row


class _Foreign(Event, frozen=True, kw_only=True, tag="_Foreign"):
    raw: msgspec.Raw
    ext: msgspec.msgpack.Ext


def test_raw_and_ext_fields_are_exported_as_what_they_hold(
    log_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their JSON came out as msgpack bytes or not at all (exit 70)."""
    from eventlog import EventLog, events

    monkeypatch.setitem(events._EVENT_TYPES, "_Foreign", _Foreign)
    raw = msgspec.Raw(msgspec.msgpack.encode({"k": [1, 2]}))
    with EventLog.open(log_file) as log:
        log.append("s", [_Foreign(raw=raw, ext=msgspec.msgpack.Ext(5, b"ab"))])
    result = cli("export", log_file, "--format", "jsonl", "-o", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    (row,) = _read_table(tmp_path / "_Foreign.jsonl", "jsonl")
    assert (row["raw"], row["ext"]) == ('{"k":[1,2]}', '{"code":5,"data":"YWI="}')
    (record,) = _read_table(tmp_path / "records.jsonl", "jsonl")
    assert record["data"] == '{"ext":{"code":5,"data":"YWI="},"raw":{"k":[1,2]}}'


class _Loose(Event, frozen=True, kw_only=True, tag="_Loose"):
    value: Any


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_an_ext_held_by_a_field_typed_any_is_exported_as_what_it_holds(
    fmt: str, log_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its type says nothing of an Ext, so only the value can: the one-pass JSON gives way."""
    from eventlog import EventLog, events

    monkeypatch.setitem(events._EVENT_TYPES, "_Loose", _Loose)
    with EventLog.open(log_file) as log:
        log.append("s", [_Loose(value=msgspec.msgpack.Ext(5, b"ab")), _Loose(value=[1])])
    result = cli("export", log_file, "--format", fmt, "-o", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    rows = _read_table(tmp_path / f"_Loose.{fmt}", fmt)
    assert [row["value"] for row in rows] == ['{"code":5,"data":"YWI="}', "[1]"]
    records = _read_table(tmp_path / f"records.{fmt}", fmt)
    assert [r["data"] for r in records] == ['{"value":{"code":5,"data":"YWI="}}', '{"value":[1]}']


def _read_table(path: Path, fmt: str) -> list[dict[str, Any]]:
    """A table's rows, typed as Parquet has them (csv: ints back from text, empty as null)."""
    if fmt == "parquet":
        rows: list[dict[str, Any]] = pq.read_table(path).drop(["recorded_at"]).to_pylist()
        return rows
    if fmt == "jsonl":
        return [json.loads(line) for line in path.read_text().splitlines()]
    with path.open(newline="") as file:
        return [
            {k: None if v == "" else int(v) if v.lstrip("-").isdigit() else v for k, v in r.items()}
            for r in csv.DictReader(file)
        ]


def test_a_types_table_is_named_by_a_plain_file_name_of_its_own() -> None:
    """Not the records table's, no path out of the folder, not hidden, not too long."""
    from eventlog.cli.export import table_stem

    assert table_stem("TokensStaged") == "TokensStaged"
    assert table_stem("\u00c9v\u00e9nement") == "\u00c9v\u00e9nement"
    assert table_stem("records") == "%records"
    assert table_stem("../out") == "%..%2Fout"
    assert table_stem(".hidden") == "%.hidden"
    assert table_stem("") == "%"
    assert table_stem("x" * 201) == "%" + hashlib.sha256(b"x" * 201).hexdigest()
    assert len({table_stem(n) for n in ["a/b", "a%2Fb", "%a%2Fb", "a_b"]}) == 4


def test_text_that_is_not_ascii_leaves_numbers_as_msgspec_writes_them() -> None:
    """Escaped as json.dumps escapes it, but NaN stays null (valid JSON) and 1e16 as is,
    as in a value whose text is ASCII."""
    from eventlog.cli.export import json_text

    value = {"f": float("nan"), "g": 1e16, "s": "\u00e9 \U0001f600"}
    assert json_text(value) == '{"f":null,"g":1e16,"s":"\\u00e9 \\ud83d\\ude00"}'
    assert json.loads(json_text(value))["s"] == value["s"]


def test_jsonl_and_csv_tables_hold_the_same_rows(run: AuditedRun, tmp_path: Path) -> None:
    records = list(run.h.log.read())
    export(run, tmp_path / "jsonl", "jsonl")
    export(run, tmp_path / "csv", "csv")
    lines = (tmp_path / "jsonl" / "records.jsonl").read_text().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [r.seq for r in records]
    staged = [r.event.token_count for r in records if isinstance(r.event, TokensStaged)]
    with (tmp_path / "csv" / "TokensStaged.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(row["token_count"]) for row in rows] == staged
    assert rows[0]["recorded_at"].endswith("Z")


def test_export_refuses_a_file_as_the_output_folder(run: AuditedRun, tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.write_text("x")
    result = cli("export", run.path, "-o", str(target))
    assert result.exit_code == 2
    assert "is a file" in result.stderr and "Traceback" not in result.stderr


def test_a_folder_where_a_table_goes_fails_the_export_before_any_table_is_replaced(
    log_file: str, tmp_path: Path
) -> None:
    """The tables are renamed into place once all are whole: a folder named like one of them
    leaves the earlier export as it was, and no partial file behind."""
    append_notes(log_file, 2)
    out = tmp_path / "out"
    out.mkdir()
    (out / "records.jsonl").write_text("earlier\n")
    (out / "CliNote.jsonl").mkdir()
    result = cli("export", log_file, "--format", "jsonl", "-o", str(out))
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == (
        f"error: {out / 'CliNote.jsonl'}: is a folder, where this export writes a table"
    )
    assert sorted(p.name for p in out.iterdir()) == ["CliNote.jsonl", "records.jsonl"]
    assert (out / "records.jsonl").read_text() == "earlier\n"


def test_tables_are_files_like_any_other_and_partials_have_names_of_their_own(
    log_file: str, tmp_path: Path
) -> None:
    """A table's mode comes from the umask (a temporary file's 0600 stayed the table's, so
    other readers could not open it), and a file another export is writing is not taken."""
    append_notes(log_file, 2)
    out = tmp_path / "out"
    out.mkdir()
    other = out / ".records.jsonl.partial"
    other.write_text("another export's table, half written\n")
    saved = os.umask(0o022)
    try:
        result = cli("export", log_file, "--format", "jsonl", "-o", str(out))
    finally:
        os.umask(saved)
    assert result.exit_code == 0, result.stderr
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {
        "records.jsonl": 0o644,
        "CliNote.jsonl": 0o644,
        ".records.jsonl.partial": 0o644,
    }
    assert other.read_text() == "another export's table, half written\n"


def test_partial_tables_of_a_killed_export_are_removed_by_the_next_one(
    log_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export killed (SIGKILL, a lost host) left its hidden partial tables forever. The
    next export into the folder removes those no live export holds: one a live export is
    writing (locked), one just made (its lock may not be taken yet) and other files stay."""
    append_notes(log_file, 2)
    out = tmp_path / "out"
    out.mkdir()
    names = {
        "killed": ".records.jsonl.0badc0de.partial",
        "killed_type_table": ".CliNote.jsonl.12345678.partial",
        "live": ".records.jsonl.feedf00d.partial",
        "just_made": ".CliNote.jsonl.87654321.partial",
        "not_ours": ".records.jsonl.partial",
    }
    for name in names.values():
        (out / name).write_text("half a table\n")
    monkeypatch.setattr(export_module, "JUST_MADE_S", 600.0)  # however slow this machine
    old = time.time() - 3600
    for key in ("killed", "killed_type_table", "live", "not_ours"):
        os.utime(out / names[key], (old, old))
    with open(out / names["live"]) as live:
        fcntl.flock(live, fcntl.LOCK_EX)  # as the export writing it holds it
        result = cli("export", log_file, "--format", "jsonl", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    left = {p.name for p in out.iterdir()}
    assert left == {"records.jsonl", "CliNote.jsonl"} | {
        names[key] for key in ("live", "just_made", "not_ours")
    }


def test_what_only_looks_like_a_partial_is_left_and_does_not_stop_the_export(
    log_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FIFO named like a partial hung every export into the folder (a blocking open); a
    folder so named, or a partial the exporter may not remove (another user's in a sticky
    folder), failed it. A link, or a file of no table format, is not an export's partial."""
    append_notes(log_file, 2)
    out = tmp_path / "out"
    out.mkdir()
    fifo, folder = out / ".records.jsonl.0badc0de.partial", out / ".CliNote.jsonl.0badcafe.partial"
    os.mkfifo(fifo)
    folder.mkdir()
    stuck = out / ".records.csv.12345678.partial"
    stuck.write_text("another user's\n")
    not_a_table = out / ".run.db.33333333.partial"  # another program's, by its suffix
    not_a_table.write_text("not an export's\n")
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text("a file the link points at\n")
    link = out / ".records.jsonl.44444444.partial"
    link.symlink_to(elsewhere)
    old = time.time() - 60
    for path in (fifo, folder, stuck, not_a_table, elsewhere):
        os.utime(path, (old, old))
    unlink = Path.unlink

    def refused_for_stuck(path: Path, missing_ok: bool = False) -> None:
        if path == stuck:
            raise PermissionError(1, "Operation not permitted", str(path))
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refused_for_stuck)
    result = cli("export", log_file, "--format", "jsonl", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    assert {p.name for p in out.iterdir()} == {
        "records.jsonl",
        "CliNote.jsonl",
        fifo.name,
        folder.name,
        stuck.name,
        not_a_table.name,
        link.name,
    }


def test_where_files_cannot_be_locked_exports_work_and_remove_no_partial(
    log_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a file system without locks (NFS without its lock daemon) no export can tell a
    live partial from an abandoned one: it removes none, and still exports."""
    append_notes(log_file, 2)
    out = tmp_path / "out"
    out.mkdir()
    other = out / ".records.jsonl.0badc0de.partial"
    other.write_text("half a table\n")
    old = time.time() - 60
    os.utime(other, (old, old))

    def no_locks(fd: object, operation: int) -> None:
        raise OSError(37, "No locks available")  # ENOLCK

    monkeypatch.setattr(fcntl, "flock", no_locks)
    result = cli("export", log_file, "--format", "jsonl", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    assert {p.name for p in out.iterdir()} == {"records.jsonl", "CliNote.jsonl", other.name}


def test_an_export_holds_its_partials_while_it_writes(
    log_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the next export's clean-up relies on: each partial is locked while written."""
    append_notes(log_file, 2)
    out = tmp_path / "out"
    seen: list[tuple[str, bool]] = []  # (table, held by the export) at each flush
    flush = export_module._Sink.flush

    def flush_and_look(sink: Any) -> None:
        with open(sink.partial) as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                seen.append((sink.path.name, True))
            else:
                seen.append((sink.path.name, False))
        flush(sink)

    monkeypatch.setattr(export_module._Sink, "flush", flush_and_look)
    result = cli("export", log_file, "--format", "jsonl", "--jobs", "1", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    assert set(seen) == {("CliNote.jsonl", True), ("records.jsonl", True)}


def test_an_export_failing_before_its_first_chunk_leaves_no_partial_table(
    run: AuditedRun, tmp_path: Path
) -> None:
    """Reading the rolled-back marks fails on a damaged RestoreStarted: the records table
    was begun already."""
    sql(run.path, "UPDATE events SET payload = x'00' WHERE type = 'RestoreStarted'")
    out = tmp_path / "out"
    result = cli("export", run.path, "--format", "jsonl", "--jobs", "1", "-o", str(out))
    assert result.exit_code == 3 and "RestoreStarted v1 payload does not decode" in result.stderr
    assert not out.exists()  # made for the export, gone with it


def test_an_empty_output_folder_is_refused_not_taken_for_this_one(
    log_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`-o ''` (an unset variable in a script) wrote the tables into the current folder."""
    append_notes(log_file, 1)
    monkeypatch.chdir(tmp_path)
    result = cli("export", log_file, "-o", "")
    assert result.exit_code == 2 and "is empty" in result.output
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("run.db")] == []


UNREADABLE: dict[str, tuple[str, int, dict[str, Any], str]] = {
    "unknown type": ("CliVanished", 1, {"color": "red"}, '{"color":"red"}'),
    "newer schema": ("CliNote", 99, {"text": "v99", "n": 7}, '{"n":7,"text":"v99"}'),
    "payload of another type": (
        "CliNote",
        1,
        {"type": "CliMeasured", "name": "m", "value": 1.5, "ok": True, "tags": []},
        '{"name":"m","ok":true,"tags":[],"value":1.5}',
    ),
}


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_a_record_this_program_cannot_read_is_only_in_records_with_its_raw_fields(
    log_file: str, tmp_path: Path, case: str
) -> None:
    type_name, schema, fields, raw = UNREADABLE[case]
    append_notes(log_file, 2)
    odd = insert_raw(log_file, "odd", type_name, schema, fields)
    append_notes(log_file, 1)
    out = tmp_path / "out"
    result = cli("export", log_file, "--format", "jsonl", "-o", str(out))
    assert result.exit_code == 0, result.stderr

    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [r["seq"] for r in records] == [1, 2, odd, odd + 1]
    assert records[2]["data"] == raw
    assert records[3]["data"] == '{"n":0,"text":"n0"}'
    notes = (out / "CliNote.jsonl").read_text().splitlines()
    assert [json.loads(line)["seq"] for line in notes] == [1, 2, odd + 1]
    assert {p.name for p in out.iterdir()} == {"records.jsonl", "CliNote.jsonl"}


def test_event_ids_are_exported_as_canonical_uuid_text() -> None:
    from eventlog.cli.export import uuid_texts

    ids = [uuid.uuid4().bytes for _ in range(50)] + [bytes(16), b"\xff" * 16]
    assert uuid_texts(ids) == [str(uuid.UUID(bytes=raw)) for raw in ids]
    assert uuid_texts([]) == []


def insert_payload(path: str, type_name: str, payload: bytes, version: int) -> int:
    """Append a record of stream `odd` whose payload is exactly `payload` (chain correct)."""
    head, previous = query(path, "SELECT seq, chain FROM events ORDER BY seq DESC LIMIT 1")[0]
    seq, event_id, recorded_at = head + 1, uuid.uuid4().bytes, 1_800_000_000_123_456_789
    chain = link(previous, seq, "odd", version, event_id, type_name, 1, recorded_at, payload)
    sql(
        path,
        (
            "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (seq, "odd", version, event_id, type_name, 1, recorded_at, payload, chain),
        ),
    )
    return int(seq)


def test_a_payload_holding_its_neighbours_event_lends_it_no_data(
    log_file: str, tmp_path: Path
) -> None:
    """Two payloads that each fail alone (one holds two events, the next is empty) would read
    as two events were a chunk's payloads decoded as one array: each record keeps what its
    own payload holds, as record by record."""
    append_notes(log_file, 2)
    note = {"type": "CliNote", "text": "lent", "n": 9}
    doubled = insert_payload(log_file, "CliNote", msgspec.msgpack.encode(note) * 2, 0)
    empty = insert_payload(log_file, "CliNote", b"", 1)
    append_notes(log_file, 1)
    out = tmp_path / "out"
    result = cli("export", log_file, "--format", "jsonl", "-o", str(out))
    assert result.exit_code == 0, result.stderr

    records = {
        r["seq"]: r for r in map(json.loads, (out / "records.jsonl").read_text().splitlines())
    }
    assert records[doubled]["data"] is None and records[empty]["data"] is None
    notes = [json.loads(line) for line in (out / "CliNote.jsonl").read_text().splitlines()]
    assert [n["seq"] for n in notes] == [1, 2, empty + 1]
    assert "lent" not in (out / "CliNote.jsonl").read_text()


def test_export_runs_with_the_cyclic_collector_paused(
    log_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every table part is built and written while the collector rests, and it is on again
    afterwards."""
    from eventlog.cli import export as module

    seen: list[bool] = []

    class Spy(module._JsonLines):
        def encode(self, spec: module.Spec, columns: module.Columns) -> str:
            seen.append(gc.isenabled())
            return super().encode(spec, columns)

        def join(self, parts: list[Any]) -> str:
            seen.append(gc.isenabled())
            return super().join(parts)

    monkeypatch.setitem(module.FORMATS, "jsonl", Spy)
    append_notes(log_file, 3)
    assert gc.isenabled()
    result = cli("export", log_file, "--format", "jsonl", "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.stderr
    assert len(seen) > 2 and not any(seen)
    assert gc.isenabled()


def test_event_ids_of_another_length_are_refused() -> None:
    from eventlog.cli.export import uuid_texts

    with pytest.raises(ValueError, match="16 bytes"):
        uuid_texts([bytes(16), bytes(15)])


def test_tables_written_from_many_chunks_hold_every_row_once(
    run: AuditedRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of three rows: a type's rows gather over many chunks before its table writes
    them, and every table holds what one large chunk gives, in the same order."""
    from eventlog.cli import export as module

    export(run, tmp_path / "whole", "jsonl")
    monkeypatch.setattr(module, "BATCH", 3)
    export(run, tmp_path / "chunked", "jsonl")
    tables = sorted(p.name for p in (tmp_path / "whole").iterdir())
    assert len(tables) > 2
    assert sorted(p.name for p in (tmp_path / "chunked").iterdir()) == tables
    for name in tables:
        whole = (tmp_path / "whole" / name).read_text()
        assert (tmp_path / "chunked" / name).read_text() == whole, name


class _OneField(Event, frozen=True, kw_only=True):
    """One field; not registered: `typed_columns` reads only its fields."""

    text: str


class _Bare(Event, frozen=True, kw_only=True):
    """No field: its text is the tag entry alone, cut to `{}`."""


class _First(Event, frozen=True, kw_only=True):
    """Every field sorts after the tag: its entry leads the text."""

    zone: dict[str, Any]
    value: int = 0


class _Perm(enum.Enum):
    READ = "read"
    WRITE = "write"


class _Granted(Event, frozen=True, kw_only=True):
    """Sets: encoded straight, msgspec sorts them (and cannot sort these); builtins keep
    their order."""

    perms: frozenset[_Perm]
    tags: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True)
class _Tagging:
    tags: frozenset[str]


class _NestedSets(Event, frozen=True, kw_only=True):
    """Sets inside a container of a field, or a dataclass: found at any depth."""

    groups: list[frozenset[_Perm]] | None = None
    named: list[frozenset[str]] | None = None
    tagging: _Tagging | None = None


class _Patched(Event, frozen=True, kw_only=True):
    """A field that may be UNSET: left out of the encoded event, moving the tag entry."""

    a: str | msgspec.UnsetType = msgspec.UNSET
    z: dict[str, Any] = msgspec.field(default_factory=dict)


class _Packed(Event, frozen=True, kw_only=True, array_like=True):
    """An event encoded as an array: its fields by name, in field order."""

    m: dict[str, Any]
    n: int = 0


class _Renamed(Event, frozen=True, kw_only=True, omit_defaults=True):
    x: int = msgspec.field(default=0, name="X")


class _Thin(Event, frozen=True, kw_only=True, omit_defaults=True):
    """A field left out when it holds its default: the tag entry moves to the front."""

    alpha: int = 0
    zeta: str = ""
    extra: dict[str, Any] = msgspec.field(default_factory=dict)


def _sets_as_sorted_lists(value: Any) -> Any:
    """`value` with every set a list of its items in the order of their JSON encoding."""
    if isinstance(value, set | frozenset):
        items = map(_sets_as_sorted_lists, value)
        return sorted(items, key=lambda item: msgspec.json.encode(item, order="sorted"))
    if isinstance(value, list):
        return list(map(_sets_as_sorted_lists, value))
    if isinstance(value, msgspec.Struct):
        names = value.__struct_fields__
        return msgspec.structs.replace(
            value, **{n: _sets_as_sorted_lists(getattr(value, n)) for n in names}
        )
    return value


def _reference(events: list[Event]) -> tuple[list[str | None], dict[str, list[Any]]]:
    """The `data` texts of each event alone, from its builtins (by each field's encoded
    name; an array_like event's values named in field order), and its typed columns from
    its fields' values (UNSET: null); dict keys as text, each set's items in the order of
    their JSON encoding."""
    from eventlog.cli.export import event_columns, json_text

    if not events:
        return [], {}
    cls = type(events[0])
    fields = [msgspec.to_builtins(_sets_as_sorted_lists(e), str_keys=True) for e in events]
    if cls.__struct_config__.array_like:
        fields = [dict(zip(cls.__struct_encode_fields__, d[1:], strict=False)) for d in fields]
    else:
        for d in fields:
            del d[cls.__struct_config__.tag_field or ""]
    columns: dict[str, list[Any]] = {}
    for field, column, kind, _ in event_columns(cls):
        values = [getattr(e, field) for e in events]
        built = [
            None
            if v is None or v is msgspec.UNSET
            else msgspec.to_builtins(_sets_as_sorted_lists(v), str_keys=True)
            for v in values
        ]
        columns[column] = [json_text(b) if kind == "json" and b is not None else b for b in built]
    return [json_text(d) for d in fields], columns


def _built(
    events: list[Event], cls: type[Event] | None = None
) -> tuple[list[str | None], dict[str, list[Any]]]:
    from eventlog.cli.export import data_texts, typed_columns

    cls = cls or type(events[0])
    return data_texts(cls, events), (typed_columns(cls, events) if events else {})


@pytest.mark.parametrize(
    "events",
    [
        [
            CliMeasured(name="a", value=1.0, ok=True, tags=["x"], ref=CliRef(name="r", weight=2)),
            CliMeasured(name="b", value=0.5, ok=False, tags=["\u00e9\u4e2d"]),
            CliMeasured(name='"type":"CliMeasured"', value=0.0, ok=True, tags=[]),
        ],
        [_OneField(text="ab"), _OneField(text="\u00e9")],
        [_Bare(), _Bare()],
        [_First(zone={"type": "_First", "b": [1]}), _First(zone={}, value=3)],
        [_First(zone={"a": 1, "type": "_First", "z": {"type": "_First", "y": 2}}, value=1)],
        [_Thin(), _Thin(alpha=1), _Thin(zeta="z"), _Thin(alpha=2, zeta="y")],
        # as many entries as events: the first's leads its text, the second's is nested
        [_Thin(zeta="z"), _Thin(alpha=1, extra={"a": 1, "type": "_Thin", "z": 2})],
        [_Granted(perms=frozenset(_Perm), tags=frozenset("badc"))],
        [_NestedSets(groups=[frozenset(_Perm)]), _NestedSets()],
        [_Patched(), _Patched(a="x", z={"b": 1, "type": "_Patched"})],
        [_Packed(m={"q": 1, "type": "_Packed"}, n=2)],
        [_Renamed(x=5), _Renamed()],
    ],
    ids=[
        "nested, non-ascii",
        "one field",
        "no field",
        "tag first",
        "tag nested",
        "left out",
        "left out, one nested",
        "sets",
        "sets nested",
        "unset",
        "array-like",
        "renamed, left out",
    ],
)
def test_tables_hold_each_events_own_fields_as_its_builtins_give_them(
    events: list[Event],
) -> None:
    """The columns of a batch are those of each event alone: `data` is `json_text` of its
    fields (tag cut even where a nested value holds the same entry, or a left-out field
    moves it; non-ASCII text escaped as before), nested values as JSON text, null as null."""
    assert _built(events) == _reference(events)
    assert _built(events[:1]) == _reference(events[:1])
    assert _built([], type(events[0])) == ([], {})


class _PackedSets(Event, frozen=True, kw_only=True, array_like=True):
    """Sets in an event encoded as an array, and in a dict's values."""

    by_name: dict[str, frozenset[str]]
    perms: frozenset[_Perm] = frozenset()


def test_a_sets_items_are_exported_in_one_order_whatever_the_process() -> None:
    """A set's items in the order of their JSON encoding, at any depth: its builtins kept its
    iteration order, which for text depends on the process's hash seed, so two runs, or
    the workers of one, wrote the same set in different orders."""
    letters = frozenset("zyxwvutsrqponm")
    in_order = '["m","n","o","p","q","r","s","t","u","v","w","x","y","z"]'
    granted = _Granted(perms=frozenset(_Perm), tags=letters)
    assert _built([granted]) == (
        [f'{{"perms":["read","write"],"tags":{in_order}}}'],
        {"perms": ['["read","write"]'], "tags": [in_order]},
    )
    nested = _NestedSets(named=[letters], tagging=_Tagging(tags=letters))
    expected = f'{{"groups":null,"named":[{in_order}],"tagging":{{"tags":{in_order}}}}}'
    assert _built([nested])[0] == [expected]
    packed = _PackedSets(by_name={"k": letters}, perms=frozenset(_Perm))
    assert _built([packed]) == (
        [f'{{"by_name":{{"k":{in_order}}},"perms":["read","write"]}}'],
        {"by_name": [f'{{"k":{in_order}}}'], "perms": ['["read","write"]']},
    )


@pytest.mark.parametrize(
    "events",
    [
        [CliMeasured(name="a", value=1.0, ok=True, tags=["x"], ref=CliRef(name="r", weight=2))],
        [_OneField(text="ab"), _OneField(text="cd")],
        [_Bare(), _Bare()],
        [_First(zone={"b": [1]}), _First(zone={}, value=3)],
    ],
    ids=["tag inside", "one field", "no field", "tag first"],
)
def test_ascii_events_are_cut_in_one_pass_not_one_by_one(
    events: list[Event], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever place the tag entry takes among a type's fields, its events' texts come
    from the joined text: none goes through its builtins."""
    from eventlog.cli import export as module

    expected = _reference(events)[0]

    def one_by_one(event: Event) -> None:
        raise AssertionError(f"{type(event).__name__} went event by event")

    monkeypatch.setattr(codec, "to_builtins", one_by_one)
    assert module.data_texts(type(events[0]), events) == expected


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_registered_type_is_exported_as_its_builtins_give_it(data: st.DataObject) -> None:
    for cls in sorted(event_types().values(), key=lambda c: c.__name__):
        events = data.draw(st.lists(events_of(cls), min_size=1, max_size=3), label=cls.__name__)
        assert _built(events) == _reference(events), cls.__name__


@pytest.mark.parametrize("where", ["inside the log file", "a table name is a folder"])
def test_an_output_that_cannot_be_written_is_one_line_naming_it(
    run: AuditedRun, tmp_path: Path, where: str
) -> None:
    if where == "inside the log file":
        out, said = Path(run.path) / "export", "cannot write it"
    else:
        out, said = tmp_path / "export", "is a folder"
        (out / "records.jsonl").mkdir(parents=True)
    result = cli("export", run.path, "-o", str(out), "--format", "jsonl")
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("error: ") and said in result.stderr
    assert "Traceback" not in result.stderr


def test_a_failed_export_removes_the_folder_it_made_and_keeps_one_it_found(
    run: AuditedRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It left the new folder behind, empty."""

    def refused(*args: object) -> set[int]:
        raise CliUsageError("refused midway")

    monkeypatch.setattr(export_module, "_write_chunks", refused)
    made, found = tmp_path / "new" / "export", tmp_path / "found"
    found.mkdir()
    for out in (made, found):
        result = cli("export", run.path, "-o", str(out), "--format", "jsonl")
        assert result.stderr == "error: refused midway\n"
    assert not made.exists() and (tmp_path / "new").is_dir()
    assert found.is_dir() and list(found.iterdir()) == []


def test_an_export_into_a_used_folder_leaves_no_table_of_the_earlier_log(
    run: AuditedRun, tmp_path: Path
) -> None:
    """The help says existing tables are replaced: a table of a type the second log lacks
    stayed, so loading the folder's tables read two logs. A file that is no table stays."""
    out = tmp_path / "export"
    export(run, out, "jsonl")
    assert (out / "GroupReserved.jsonl").exists()
    (out / "notes.jsonl").write_text("mine\n")
    empty = tmp_path / "empty.db"
    assert cli("init", str(empty)).exit_code == 0
    result = cli("export", str(empty), "-o", str(out), "--format", "jsonl")
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in out.glob("*.jsonl")) == ["notes.jsonl", "records.jsonl"]
    assert f"removed {out / 'GroupReserved.jsonl'}" in result.stdout


def test_the_stale_table_removal_never_removes_the_log_it_read(tmp_path: Path) -> None:
    out = tmp_path / "export"
    out.mkdir()
    log = out / "GroupReserved.csv"  # a log named like a table this export will not write
    assert cli("init", str(log)).exit_code == 0
    append_notes(str(log), 3)
    result = cli("export", str(log), "-o", str(out), "--format", "csv")
    assert result.exit_code == 0, result.stderr
    assert log.exists() and "removed" not in result.stdout
    assert cli("verify", str(log)).exit_code == 0


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_each_type_table_holds_the_envelope_of_that_types_records(
    run: AuditedRun, tmp_path: Path, fmt: str
) -> None:
    """A type's table repeats, row by row, the envelope its records have in `records`."""
    export(run, tmp_path, fmt)

    def rows(name: str) -> list[dict[str, Any]]:
        if fmt == "parquet":
            table = pq.read_table(tmp_path / f"{name}.parquet")
            at = table.schema.get_field_index("recorded_at")  # ns: as integers
            table = table.set_column(at, "recorded_at", table.column(at).cast(pa.int64()))
            return list(table.to_pylist())
        return [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]

    envelope = ["seq", "stream", "version", "event_id", "schema", "recorded_at"]
    records = rows("records")
    for name in {r["type"] for r in records}:
        assert [{k: r[k] for k in envelope} for r in rows(name)] == [
            {k: r[k] for k in envelope} for r in records if r["type"] == name
        ], name


def test_parquet_converts_the_envelope_once_per_chunk_not_once_per_type(
    run: AuditedRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A type's envelope columns are taken from the chunk's converted ones: only the fields
    of each type (and `records`' data and mark) are converted from Python values."""
    from eventlog.cli import export as module

    log = run.h.log
    builder = module._builder(log, "parquet", log.head(), None)
    chunk = module._read(log, 1, log.head())
    converted: list[int] = []
    convert = module._Parquet._array

    def counted(self: Any, values: Any, kind: Any) -> Any:
        if not isinstance(values, pa.Array):
            converted.append(len(values))
        return convert(self, values, kind)

    monkeypatch.setattr(module._Parquet, "_array", counted)
    built = builder.build(chunk)
    fields = sum(len(module.event_columns(part.cls)) for part in built.typed)
    assert len(built.typed) > 3
    assert len(converted) == len(module.ENVELOPE) + 1 + fields  # + records' data
