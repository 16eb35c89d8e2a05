"""`eventlog stats` (core part): records per type and per stream prefix."""

from __future__ import annotations

import json
import threading

import pytest

from eventlog.errors import InputError
from eventlog.log import EventLog
from tests.cli.helpers import append_notes, cli, insert_raw


def test_stats_counts_records_per_type_and_stream_prefix(audit_log: str) -> None:
    stats = json.loads(cli("stats", audit_log, "--json").stdout)
    assert stats["records"] == stats["head"] == 7
    assert stats["types"] == {"CliNote": 5, "CliDispatched": 1, "CliMeasured": 1}
    assert stats["stream_prefixes"] == {"attempt": 4, "group": 2, "controller": 1}
    human = cli("stats", audit_log).stdout
    assert "records: 7, head seq 7" in human


def test_stats_counts_in_the_database_beside_the_records_pass(
    audit_log: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The counts query runs on its own thread (the database's C code, GIL released) while
    the sections read the records: it does not wait for the pass, nor the pass for it."""
    threads: list[str] = []
    original = EventLog.counts

    def counts(self: EventLog, until_seq: int | None = None) -> list[tuple[str, str, int, int]]:
        threads.append(threading.current_thread().name)
        return original(self, until_seq)

    monkeypatch.setattr(EventLog, "counts", counts)
    assert json.loads(cli("stats", audit_log, "--json").stdout)["records"] == 7
    assert len(threads) == 1 and threads[0].startswith("stats-counts")


def test_a_failing_count_is_the_error_stats_reports(
    audit_log: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted beside the pass, a failure of the counts is still the error stats reports,
    also when the pass fails too (as when the counts ran first)."""

    def counts(self: EventLog, until_seq: int | None = None) -> list[tuple[str, str, int, int]]:
        raise InputError("the counts failed")

    def rows(self: EventLog, *args: object, **kwargs: object) -> list[object]:
        raise InputError("the pass failed")

    monkeypatch.setattr(EventLog, "counts", counts)
    result = cli("stats", audit_log)
    assert (result.exit_code, result.stderr) == (2, "error: the counts failed\n")
    monkeypatch.setattr(EventLog, "read_rows", rows)
    result = cli("stats", audit_log)
    assert (result.exit_code, result.stderr) == (2, "error: the counts failed\n")


def test_type_names_and_stream_prefixes_never_reach_the_terminal_as_control_codes(
    log_file: str,
) -> None:
    """A stored name with an escape sequence or a newline is printed quoted (as `replay`
    prints one): it must not recolour the terminal nor split a row of the table."""
    append_notes(log_file, 1)
    insert_raw(log_file, "odd\x1b[31m/1", "Cli\nGone", 1, {})
    result = cli("stats", log_file)
    assert result.exit_code == 0, result.stderr
    assert "\x1b" not in result.stdout
    assert '"odd\\u001b[31m"' in result.stdout and '"Cli\\nGone"' in result.stdout
    assert json.loads(cli("stats", log_file, "--json").stdout)["types"]["Cli\nGone"] == 1
