"""`eventlog stats` (core part): records per type and per stream prefix."""

from __future__ import annotations

import json

from tests.cli.helpers import cli


def test_stats_counts_records_per_type_and_stream_prefix(audit_log: str) -> None:
    stats = json.loads(cli("stats", audit_log, "--json").stdout)
    assert stats["records"] == stats["head"] == 7
    assert stats["types"] == {"CliNote": 5, "CliDispatched": 1, "CliMeasured": 1}
    assert stats["stream_prefixes"] == {"attempt": 4, "group": 2, "controller": 1}
    human = cli("stats", audit_log).stdout
    assert "records: 7, head seq 7" in human
