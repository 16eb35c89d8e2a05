"""`eventlog replay` (core filters): what it selects and how it shows records."""

from __future__ import annotations

import msgspec
import pytest

from tests.cli.helpers import REPLAY_KEYS, append_notes, cli, insert_raw, json_lines, sql


def replayed_seqs(path: str, *args: str) -> list[int]:
    result = cli("replay", path, "--json", *args)
    assert result.exit_code == 0, result.stderr
    return [obj["seq"] for obj in json_lines(result.stdout)]


@pytest.mark.parametrize(
    ("args", "seqs"),
    [
        ([], [1, 2, 3, 4, 5, 6, 7]),
        (["--stream", "controller"], [6]),
        (["--stream", "group/g1", "--stream", "group/g2"], [1, 4]),
        (["--group", "g1"], [1, 2, 3, 7]),
        (["--group", "g2"], [4]),
        (["--group", "g1", "--stream", "controller"], [1, 2, 3, 6, 7]),
        (["--type", "CliMeasured"], [6]),
        (["--type", "CliDispatched", "--type", "CliMeasured"], [1, 6]),
        (["--from-seq", "3", "--until-seq", "5"], [3, 4, 5]),
        (["--group", "g1", "--type", "CliNote", "--from-seq", "3"], [3, 7]),
        (["--stream", "nobody"], []),
        (["--until", "2000-01-01"], []),
        (["--since", "2000-01-01T00:00:00+02:00"], [1, 2, 3, 4, 5, 6, 7]),
    ],
)
def test_replay_filters_select_exactly_the_matching_records(
    audit_log: str, args: list[str], seqs: list[int]
) -> None:
    assert replayed_seqs(audit_log, *args) == seqs


def test_replay_time_window_is_inclusive_to_the_nanosecond(audit_log: str) -> None:
    times = [obj["recorded_at"] for obj in json_lines(cli("replay", audit_log, "--json").stdout)]
    assert len(set(times)) == 7
    assert replayed_seqs(audit_log, "--since", times[2], "--until", times[4]) == [3, 4, 5]
    assert replayed_seqs(audit_log, "--until", times[0]) == [1]
    assert replayed_seqs(audit_log, "--since", times[6]) == [7]


def test_replay_table_shows_seq_stream_version_type_and_fields(audit_log: str) -> None:
    result = cli("replay", audit_log, "--group", "g1")
    assert result.exit_code == 0
    rows = [row.split() for row in result.stdout.splitlines()]
    assert rows[0] == ["seq", "time", "(UTC)", "stream", "ver", "type", "fields"]
    assert [(r[0], r[3], r[4], r[5]) for r in rows[1:]] == [
        ("1", "group/g1", "0", "CliDispatched"),
        ("2", "attempt/g1_g0", "0", "CliNote"),
        ("3", "attempt/g1_g1", "0", "CliNote"),
        ("7", "attempt/g1_g1", "1", "CliNote"),
    ]
    assert result.stdout.splitlines()[4].endswith("text=a1 again n=0")


def test_replay_with_no_match_says_so_on_stderr(audit_log: str) -> None:
    result = cli("replay", audit_log, "--type", "CliKinded")  # known, none in the log
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "no records match\n")


def test_a_type_nobody_knows_is_a_usage_error_naming_the_nearest(log_file: str) -> None:
    """A misspelt --type matched nothing, exit 0, as if the log had none of it. A type only
    the log knows (written by another program) is still selected."""
    append_notes(log_file, 1)
    result = cli("replay", log_file, "--type", "CliNoet")
    assert result.exit_code == 2
    first = result.stderr.splitlines()[0]
    assert first.startswith(
        "error: --type 'CliNoet': no event type of that name is known or in the log (nearest: "
    )
    assert "CliNote" in first
    damaged = insert_raw(log_file, "future", "CliVanished", 1, {"color": "red"})
    seq = insert_raw(log_file, "future2", "CliVanished", 1, {"color": "blue"})
    sql(log_file, f"UPDATE events SET recorded_at = 'x' WHERE seq = {damaged}")
    shown = cli(
        "replay", log_file, "--type", "CliVanished", "--from-seq", str(seq), "--allow-unknown"
    )  # the check reads no record: a damaged one it was not asked for fails nothing
    assert shown.exit_code == 0, shown.stderr
    assert "blue" in shown.stdout


def test_replay_rejects_a_time_that_is_not_iso8601(audit_log: str) -> None:
    result = cli("replay", audit_log, "--since", "yesterday")
    assert result.exit_code == 2
    assert "'yesterday' is not an ISO-8601 time" in result.stderr


def test_unknown_type_fails_replay_naming_seq_and_type_unless_allowed(log_file: str) -> None:
    append_notes(log_file, 1)
    seq = insert_raw(log_file, "future", "CliVanished", 1, {"color": "red", "size": 3})
    assert cli("verify", log_file).exit_code == 0

    failed = cli("replay", log_file, "--json")
    assert failed.exit_code == 3
    assert failed.stderr == f"error: seq {seq}: unknown event type 'CliVanished'\n"
    assert [obj["seq"] for obj in json_lines(failed.stdout)] == [1]  # streamed up to the bad one

    shown = json_lines(cli("replay", log_file, "--json", "--allow-unknown").stdout)
    raw = shown[1]
    assert list(raw) == [*REPLAY_KEYS, "unknown", "schema"]
    assert raw["data"] == {"color": "red", "size": 3}
    assert (raw["seq"], raw["stream"], raw["type"], raw["unknown"], raw["schema"]) == (
        seq,
        "future",
        "CliVanished",
        True,
        1,
    )
    assert raw["recorded_at"] == "2027-01-15T08:00:00.123456789Z"
    assert "unknown" not in shown[0]
    table = cli("replay", log_file, "--allow-unknown").stdout
    assert "CliVanished v1?" in table and "color=red size=3" in table


def test_an_unknown_records_tag_is_left_out_by_its_value_not_by_the_name_type(
    log_file: str,
) -> None:
    """Without its class the tag field is unknown; msgspec writes it first. A real field
    named `type` of a type tagged by another field was dropped from the raw view."""
    append_notes(log_file, 1)
    data = {"type": "real", "size": 3}
    insert_raw(log_file, "future", "CliGone", 1, data, tag_field="kind")
    insert_raw(log_file, "future2", "CliGone", 1, {"size": 4})
    shown = json_lines(cli("replay", log_file, "--json", "--allow-unknown").stdout)
    assert [obj["data"] for obj in shown[1:]] == [data, {"size": 4}]


def test_an_unknown_record_holding_a_msgpack_extension_shows_its_code_and_data(
    log_file: str,
) -> None:
    """As a known type's Ext field shows (its whole data was null)."""
    append_notes(log_file, 1)
    insert_raw(log_file, "future", "CliGone", 1, {"x": msgspec.msgpack.Ext(5, b"ab"), "n": 1})
    shown = json_lines(cli("replay", log_file, "--json", "--allow-unknown").stdout)
    assert shown[1]["data"] == {"x": {"code": 5, "data": "YWI="}, "n": 1}


def test_a_future_schema_fails_replay_naming_seq_and_type_unless_allowed(log_file: str) -> None:
    append_notes(log_file, 1)
    seq = insert_raw(log_file, "s2", "CliNote", 7, {"text": "new", "mood": "good"})
    failed = cli("replay", log_file)
    assert failed.exit_code == 3
    assert failed.stderr == (
        f"error: seq {seq}: CliNote has schema v7, this program reads up to v1; "
        "upgrade eventlog to read it\n"
    )
    shown = json_lines(cli("replay", log_file, "--json", "--allow-unknown").stdout)
    assert shown[1]["data"] == {"text": "new", "mood": "good"}
    assert shown[1]["schema"] == 7


def test_control_characters_in_stored_values_are_quoted_not_sent_to_the_terminal(
    log_file: str,
) -> None:
    """An audit shows hostile values as data: an escape sequence in a stream or a field
    reached the terminal raw (clear screen, colours), and a newline split one record's line."""
    from tests.cli.helpers import line, lines

    stream, text = "w/\x1b[2J\nnew\tline", "a\nb\x1b[31mred"
    appended = cli("append", log_file, input=lines(line(stream, "CliNote", {"text": text})))
    assert appended.exit_code == 0, appended.stderr
    result = cli("replay", log_file)
    assert result.exit_code == 0, result.stderr
    (row,) = result.stdout.splitlines()[1:]  # the header, then one line for the record
    assert "\x1b" not in row and "\t" not in row
    assert '"w/\\u001b[2J\\nnew\\tline"' in row and 'text="a\\nb\\u001b[31mred"' in row
